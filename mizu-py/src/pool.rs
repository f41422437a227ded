//! `Pool` and `Task`: the caller's side. Every wait releases the GIL and checks for signals
//! (Ctrl-C) in bounded slices.

use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use mizu_pool::{CollectError, Fill, Launcher, PoolConfig, TaskError};

use crate::codec::{Outgoing, decode};
use crate::worker::with_context;
use crate::{SlotsFull, err, forked};

/// How long one GIL-free wait lasts before signals are checked.
const SLICE: Duration = Duration::from_millis(50);

/// A pool of Python worker processes (`python -m pymizu.worker ...`).
#[pyclass(module = "pymizu._native", frozen)]
pub struct Pool {
    /// Read-locked to use the pool (never held while waiting for the GIL to be written to),
    /// write-locked only to take it out in `stop`.
    inner: RwLock<Option<mizu_pool::Pool>>,
    pid: u32,
}

/// How a task ended: `(status, pickle, buffers, worker slot, worker pid)`.
/// Status: 0 result, 1 raised (pickled exception and traceback), 2 worker died, 3 execution
/// timeout, 4 cancelled, 5 pool stopped, 6 not finished yet (timeout), 7 not readable here.
type Outcome = (u8, Py<PyAny>, Py<PyList>, usize, u32);

/// One worker in `Pool.status()`: (slot, pid, state, busy, tasks run, steals).
type WorkerRow = (usize, u32, String, bool, u64, u64);

pub(crate) fn submit_error(e: mizu_pool::PoolError) -> PyErr {
    match e {
        mizu_pool::PoolError::SlotsExhausted(_) => SlotsFull::new_err(e.to_string()),
        e => err(e),
    }
}

impl Pool {
    fn with<T>(&self, f: impl FnOnce(&mizu_pool::Pool) -> PyResult<T>) -> PyResult<T> {
        forked(self.pid)?;
        let g = self.inner.read().map_err(err)?;
        let pool = g
            .as_ref()
            .ok_or_else(|| crate::StoppedError::new_err("the pool is stopped"))?;
        f(pool)
    }
}

#[pymethods]
impl Pool {
    #[new]
    #[pyo3(signature = (workers, python, args, exec_timeout=None, slots=4096, spin_us=None))]
    fn new(
        py: Python<'_>,
        workers: usize,
        python: String,
        args: Vec<String>,
        exec_timeout: Option<f64>,
        slots: u32,
        spin_us: Option<u64>,
    ) -> PyResult<Self> {
        let exec_timeout = exec_timeout
            .map(Duration::try_from_secs_f64)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("exec_timeout: {e}")))?;
        let mut cfg = PoolConfig {
            workers,
            slots,
            exec_timeout,
            ..Default::default()
        };
        // Python tasks take tens of microseconds on each side: spin long enough to bridge one
        // (the runtime's default suits native tasks). Spinning idle workers are capped at the
        // CPU count minus one by the runtime.
        cfg.spin = Duration::from_micros(spin_us.unwrap_or(250));
        cfg.validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let launcher = Launcher::new(python, args);
        let pool = py
            .detach(|| mizu_pool::Pool::new(cfg, launcher))
            .map_err(err)?;
        Ok(Pool {
            inner: RwLock::new(Some(pool)),
            pid: mizu_shm::current_pid(),
        })
    }

    /// Submits a pickled call and its out-of-band buffers (copied once, into shared memory).
    /// Raises `SlotsFull` when every task slot holds an uncollected task.
    #[pyo3(signature = (pickle, buffers=None))]
    fn submit(
        &self,
        py: Python<'_>,
        pickle: &[u8],
        buffers: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Task> {
        let out = match buffers {
            Some(b) => Outgoing::new(py, pickle, b)?,
            None => Outgoing::new(py, pickle, &py.None().into_bound(py))?,
        };
        self.with(|pool| {
            let t = py
                .detach(|| pool.submit_with(&out, None))
                .map_err(submit_error)?;
            Ok(Task::new(t))
        })
    }

    /// Submits several pickled calls (`[(pickle, buffers), ...]`) with one publication per
    /// worker queue. Returns the tasks submitted and whether it stopped early because every
    /// slot is taken (then submit the rest after collecting some).
    fn submit_batch(
        &self,
        py: Python<'_>,
        calls: Vec<(Py<PyBytes>, Py<PyAny>)>,
    ) -> PyResult<(Vec<Task>, bool)> {
        let outs = outgoing(py, &calls)?;
        self.with(|pool| {
            let (ts, res) =
                py.detach(|| pool.submit_batch_with(outs.iter().map(|o| o as &dyn Fill)));
            batch_result(ts, res)
        })
    }

    /// Per worker: (slot, pid, state, busy, tasks, steals).
    fn status(&self) -> PyResult<Vec<WorkerRow>> {
        forked(self.pid)?;
        let g = self.inner.read().map_err(err)?;
        let Some(pool) = g.as_ref() else {
            return Ok(Vec::new());
        };
        Ok(pool
            .status()
            .workers
            .into_iter()
            .map(|w| {
                (
                    w.slot,
                    w.pid,
                    w.state.to_string(),
                    w.busy,
                    w.tasks,
                    w.steals,
                )
            })
            .collect())
    }

    /// Stops the pool (queued tasks are cancelled, running ones fail, results not collected
    /// yet are dropped); idempotent. What the pool's workers left in shared memory is removed.
    #[pyo3(signature = (grace=5.0))]
    fn stop(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        forked(self.pid)?;
        let grace = crate::bounded_secs(grace, "grace")?;
        // Taken with the GIL released: a reader may be waiting for the GIL.
        let pool = py.detach(|| self.inner.write().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(mut p) = pool {
            py.detach(|| {
                let workers = p.launched_pids();
                p.stop(grace);
                drop(p);
                // Only our own workers' leftovers: other programs may have data in flight.
                let _ = mizu_shm::prune_of(&workers);
            });
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.pid != mizu_shm::current_pid() {
            // A forked child's copy: the workers belong to the parent; touch nothing.
            if let Ok(mut g) = self.inner.write()
                && let Some(p) = g.take()
            {
                std::mem::forget(p);
            }
        }
    }
}

pub(crate) fn outgoing<'a>(
    py: Python<'a>,
    calls: &'a [(Py<PyBytes>, Py<PyAny>)],
) -> PyResult<Vec<Outgoing<'a>>> {
    calls
        .iter()
        .map(|(p, b)| Outgoing::new(py, p.as_bytes(py), b.bind(py)))
        .collect()
}

pub(crate) fn batch_result(
    ts: Vec<mizu_pool::Task>,
    res: mizu_pool::Result<()>,
) -> PyResult<(Vec<Task>, bool)> {
    let full = match res {
        Ok(()) => false,
        Err(mizu_pool::PoolError::SlotsExhausted(_)) => true,
        // Tasks already submitted still run; their handles are dropped (abandoned).
        Err(e) => return Err(submit_error(e)),
    };
    Ok((ts.into_iter().map(Task::new).collect(), full))
}

/// A submitted task.
#[pyclass(module = "pymizu._native", frozen)]
pub struct Task {
    inner: Mutex<Option<mizu_pool::Task>>,
    pid: u32,
}

impl Task {
    pub(crate) fn new(t: mizu_pool::Task) -> Task {
        Task {
            inner: Mutex::new(Some(t)),
            pid: mizu_shm::current_pid(),
        }
    }
}

fn outcome(py: Python<'_>, r: Result<arrow_buffer::Buffer, CollectError>) -> PyResult<Outcome> {
    let empty = || {
        (
            PyBytes::new(py, b"").into_any().unbind(),
            PyList::empty(py).unbind(),
        )
    };
    let (status, (data, bufs), slot, pid) = match r {
        Ok(b) => (0, decode(py, b)?, 0, 0),
        Err(CollectError::Timeout) => (6, empty(), 0, 0),
        Err(CollectError::AlreadyCollected) => (7, empty(), 0, 0),
        Err(CollectError::Task(e)) => match e {
            // An error payload is either ours (a pickled exception) or the runtime's text.
            TaskError::Failed(b) => match decode(py, arrow_buffer::Buffer::from_vec(b.clone())) {
                Ok(d) => (1, d, 0, 0),
                Err(_) => (
                    1,
                    (
                        PyBytes::new(py, &b).into_any().unbind(),
                        PyList::empty(py).unbind(),
                    ),
                    usize::MAX,
                    0,
                ),
            },
            TaskError::WorkerDied { slot, pid } => (2, empty(), slot, pid),
            TaskError::ExecTimeout { slot, pid } => (3, empty(), slot, pid),
            TaskError::Cancelled => (4, empty(), 0, 0),
            _ => (5, empty(), 0, 0),
        },
    };
    Ok((status, data, bufs, slot, pid))
}

#[pymethods]
impl Task {
    /// Waits at most `timeout` seconds (forever when None) with the GIL released, checking
    /// for signals every 50 ms. Returns `None` when another thread is collecting this task.
    /// Inside a worker, waiting runs other tasks (nested maps never deadlock).
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Outcome>> {
        forked(self.pid)?;
        let start = Instant::now();
        let timeout = crate::wait_secs(timeout, "timeout")?;
        // Never block on this lock while holding the GIL: the holder may need the GIL back.
        let Ok(mut g) = self.inner.try_lock() else {
            return Ok(None);
        };
        let Some(task) = g.as_mut() else {
            return Ok(None);
        };
        loop {
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            let r = py.detach(|| {
                with_context(|ctx| match ctx {
                    Some(ctx) => ctx.collect(task, Some(slice)),
                    None => task.result(Some(slice)),
                })
            });
            if matches!(r, Err(CollectError::Timeout)) {
                if left.is_some_and(|l| l <= slice) {
                    return Ok(Some(outcome(py, r)?));
                }
                py.check_signals()?;
                continue;
            }
            *g = None;
            return Ok(Some(outcome(py, r)?));
        }
    }

    /// Cancels the task if it has not started.
    fn cancel(&self) -> bool {
        self.peek(mizu_pool::Task::cancel)
    }

    /// Whether the outcome is ready to be taken here (false while another thread collects).
    fn done(&self) -> bool {
        self.peek(mizu_pool::Task::is_done)
    }
}

impl Task {
    /// `f` of the task when it is uncollected, in this process, and not being collected by
    /// another thread right now (never waits); else false.
    fn peek(&self, f: impl FnOnce(&mizu_pool::Task) -> bool) -> bool {
        self.pid == mizu_shm::current_pid()
            && self
                .inner
                .try_lock()
                .is_ok_and(|g| g.as_ref().is_some_and(f))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if self.pid != mizu_shm::current_pid()
            && let Ok(mut g) = self.inner.lock()
            && let Some(t) = g.take()
        {
            std::mem::forget(t);
        }
    }
}

/// Waits until one of `tasks` has an outcome (GIL released, signals checked); returns its
/// position, or None after `timeout` seconds.
#[pyfunction]
#[pyo3(signature = (tasks, timeout=None))]
pub fn wait_any(
    py: Python<'_>,
    tasks: Vec<Py<Task>>,
    timeout: Option<f64>,
) -> PyResult<Option<usize>> {
    let start = Instant::now();
    let timeout = crate::wait_secs(timeout, "timeout")?;
    let ready = |ts: &[Py<Task>]| {
        ts.iter().position(|t| {
            t.get()
                .inner
                .try_lock()
                .is_ok_and(|g| g.as_ref().is_some_and(|t| t.is_done()))
        })
    };
    loop {
        if let Some(i) = ready(&tasks) {
            return Ok(Some(i));
        }
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            return Ok(None);
        }
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        // Park on the submitter of a task that is not being collected elsewhere right now.
        let found = py.detach(|| {
            let probe = tasks.iter().find_map(|t| {
                let g = t.get().inner.try_lock().ok()?;
                g.is_some().then_some(g)
            });
            match probe {
                Some(g) => {
                    let p = g.as_ref().expect("checked");
                    mizu_pool::wait_until(p, Some(slice), || {
                        // The probe's lock is held here: test it directly, the rest by lock.
                        p.is_done()
                            .then_some(())
                            .or_else(|| ready(&tasks).map(|_| ()))
                    })
                }
                None => {
                    std::thread::sleep(Duration::from_micros(200));
                    None
                }
            }
        });
        if found.is_none() {
            py.check_signals()?;
        }
    }
}
