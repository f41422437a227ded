//! `pymizu._native`: the thin PyO3 layer over `mizu-pool`. The runtime logic lives in the Rust
//! crates; this module converts types, releases the GIL around every wait, and runs Python
//! callables as a worker's executor. The Python API (`PoolExecutor`, ...) is in `python/pymizu`.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use mizu_pool::{CollectError, Executor, Launcher, PoolConfig, TaskContext, TaskError};

pyo3::create_exception!(
    _native,
    SlotsFull,
    PyRuntimeError,
    "Every task slot is in use until some results are collected."
);

fn err(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// A pool of Python worker processes (`python -m pymizu.worker`).
#[pyclass(module = "pymizu._native")]
struct Pool {
    inner: Mutex<Option<mizu_pool::Pool>>,
}

/// How a task ended, as `(status, payload, worker slot, worker pid)`.
/// Status: 0 result, 1 raised (payload: pickled exception and traceback), 2 worker died,
/// 3 execution timeout, 4 cancelled, 5 pool stopped, 6 not finished yet (timeout).
type Outcome = (u8, Py<PyBytes>, usize, u32);

/// One worker in `Pool.status()`: (slot, pid, state, busy, tasks run).
type WorkerRow = (usize, u32, String, bool, u64);

#[pymethods]
impl Pool {
    #[new]
    #[pyo3(signature = (workers, python, exec_timeout=None, slots=4096))]
    fn new(
        py: Python<'_>,
        workers: usize,
        python: String,
        exec_timeout: Option<f64>,
        slots: u32,
    ) -> PyResult<Self> {
        let exec_timeout = exec_timeout
            .map(Duration::try_from_secs_f64)
            .transpose()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let cfg = PoolConfig {
            workers,
            slots,
            exec_timeout,
            ..Default::default()
        };
        cfg.validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let launcher = Launcher::new(python, ["-m", "pymizu.worker"]);
        let pool = py
            .detach(|| mizu_pool::Pool::new(cfg, launcher))
            .map_err(err)?;
        Ok(Pool {
            inner: Mutex::new(Some(pool)),
        })
    }

    /// Submits a payload (the pickled call); blocks only while every queue is full.
    fn submit(&self, py: Python<'_>, payload: &[u8]) -> PyResult<Task> {
        let g = self.inner.lock().map_err(err)?;
        let pool = g
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the pool is stopped"))?;
        let task = py.detach(|| pool.submit(payload)).map_err(|e| match e {
            mizu_pool::PoolError::SlotsExhausted(_) => SlotsFull::new_err(e.to_string()),
            e => err(e),
        })?;
        Ok(Task {
            inner: Mutex::new(Some(task)),
        })
    }

    /// Per worker: (slot, pid, state, busy, tasks).
    fn status(&self) -> PyResult<Vec<WorkerRow>> {
        let g = self.inner.lock().map_err(err)?;
        let Some(pool) = g.as_ref() else {
            return Ok(Vec::new());
        };
        Ok(pool
            .status()
            .workers
            .into_iter()
            .map(|w| (w.slot, w.pid, w.state.to_string(), w.busy, w.tasks))
            .collect())
    }

    /// Stops the pool (queued tasks are cancelled, running ones fail); idempotent.
    #[pyo3(signature = (grace=5.0))]
    fn stop(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        let pool = self.inner.lock().map_err(err)?.take();
        if let Some(mut p) = pool {
            py.detach(|| p.stop(Duration::from_secs_f64(grace.max(0.0))));
        }
        Ok(())
    }
}

/// A submitted task.
#[pyclass(module = "pymizu._native")]
struct Task {
    inner: Mutex<Option<mizu_pool::Task>>,
}

#[pymethods]
impl Task {
    /// Waits at most `timeout` seconds (forever when None) with the GIL released. Returns
    /// `None` when another thread is collecting this task right now.
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Outcome>> {
        let timeout = timeout.map(|t| Duration::from_secs_f64(t.max(0.0)));
        // Never block on this lock while holding the GIL: the holder may need the GIL back.
        let Ok(mut g) = self.inner.try_lock() else {
            return Ok(None);
        };
        let Some(task) = g.as_mut() else {
            return Ok(None);
        };
        let r = py.detach(|| task.result(timeout));
        let empty = || PyBytes::new(py, b"").unbind();
        if !matches!(r, Err(CollectError::Timeout)) {
            *g = None;
        }
        Ok(Some(match r {
            Ok(b) => (0, PyBytes::new(py, b.as_slice()).unbind(), 0, 0),
            Err(CollectError::Timeout) => (6, empty(), 0, 0),
            Err(CollectError::AlreadyCollected) => return Ok(None),
            Err(CollectError::Task(e)) => match e {
                TaskError::Failed(b) => (1, PyBytes::new(py, &b).unbind(), 0, 0),
                TaskError::WorkerDied { slot, pid } => (2, empty(), slot, pid),
                TaskError::ExecTimeout { slot, pid } => (3, empty(), slot, pid),
                TaskError::Cancelled => (4, empty(), 0, 0),
                _ => (5, empty(), 0, 0),
            },
        }))
    }

    /// Cancels the task if it has not started.
    fn cancel(&self) -> bool {
        self.inner
            .try_lock()
            .is_ok_and(|g| g.as_ref().is_some_and(|t| t.cancel()))
    }

    /// Whether the outcome is ready to be taken here (false while another thread collects).
    fn done(&self) -> bool {
        self.inner
            .try_lock()
            .is_ok_and(|g| g.as_ref().is_some_and(|t| t.is_done()))
    }
}

/// Runs Python's `callback(payload) -> (ok, bytes)` for every task.
struct PyExec {
    callback: Py<PyAny>,
}

impl Executor for PyExec {
    fn execute(&self, _ctx: &TaskContext<'_>, input: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
        Python::attach(|py| {
            let r = self
                .callback
                .call1(py, (PyBytes::new(py, input),))
                .and_then(|r| r.extract::<(bool, Vec<u8>)>(py));
            match r {
                Ok((true, b)) => Ok(b),
                Ok((false, b)) => Err(b),
                // The callback itself failed (it catches task exceptions): report it as text.
                Err(e) => Err(format!("pymizu worker callback failed: {e}").into_bytes()),
            }
        })
    }
}

/// Serves a pool as worker `slot` until it stops (the GIL is held only while a task runs).
#[pyfunction]
fn run_worker(py: Python<'_>, token: String, slot: usize, callback: Py<PyAny>) -> PyResult<()> {
    let exec = PyExec { callback };
    py.detach(|| mizu_pool::run_worker(&token, slot, &exec))
        .map_err(err)
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Pool>()?;
    m.add("SlotsFull", m.py().get_type::<SlotsFull>())?;
    m.add_class::<Task>()?;
    m.add_function(wrap_pyfunction!(run_worker, m)?)?;
    Ok(())
}
