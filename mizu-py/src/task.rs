//! `Task`: a submitted call, as Python sees it (`pymizu.Task`). Its outcome is read once from
//! the pool and kept, so `result()` can be called again, from any thread.
//!
//! Waiting polls for a short while with the GIL held (a trivial task is back within a few
//! microseconds, and releasing and retaking the GIL costs about as much; 20 µs, or 2 µs
//! while tasks keep outlasting it), then waits in bounded slices with the GIL released,
//! checking for signals (Ctrl-C) between slices.
//!
//! Every task is also listed (weakly) in its submitter's [`Registry`]: when every task slot
//! holds an uncollected task, submission takes the finished outcomes out of their slots into
//! their `Task` objects (`Registry::drain`) instead of failing.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use arrow_buffer::Buffer;
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList};
use pyo3::{PyTraverseError, PyVisit};

use mizu_pool::{CollectError, TaskError};

use crate::codec::decode;
use crate::worker::with_context;
use crate::{MizuError, forked};

/// How long one GIL-free wait lasts before signals are checked.
pub(crate) const SLICE: Duration = Duration::from_millis(50);
/// How long a wait polls with the GIL held before releasing it.
const HOT_WAIT: Duration = Duration::from_micros(20);
/// The poll after several waits in a row outlasted [`HOT_WAIT`].
const HOT_WAIT_COLD: Duration = Duration::from_micros(2);
/// Waits in a row (in this process) whose task outlasted the poll.
static HOT_MISSES: AtomicU32 = AtomicU32::new(0);
/// How long a thread waits before looking again at a task another thread is collecting.
const BUSY_NAP: Duration = Duration::from_micros(200);

/// Where a task's outcome is.
enum State {
    /// In the pool, not collected yet.
    Pending(mizu_pool::Task),
    /// A thread is waiting for it, holding the runtime's handle.
    Collecting,
    /// Taken out of the pool (to free its slot), not yet made into Python objects.
    Raw(Result<Buffer, CollectError>),
    /// The value (`ok`) or the exception.
    Settled {
        ok: bool,
        value: Py<PyAny>,
        cancelled: bool,
    },
}

/// A task's state, shared with its submitter's registry.
struct Cell {
    state: Mutex<State>,
    /// The process that made it (a forked child's copy gives back nothing).
    pid: u32,
}

impl Drop for Cell {
    fn drop(&mut self) {
        // An outcome taken out of its slot but never read: the regions its arrays refer to
        // are given back (as the runtime does for outcomes it discards).
        let pid = self.pid;
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if pid == mizu_shm::current_pid()
            && let State::Raw(Ok(b)) = state
        {
            crate::small::release_refs(b);
        }
    }
}

impl Cell {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock if nobody holds it: a holder may be waiting (without the GIL) for a while,
    /// and a thread holding the GIL must never block on it.
    fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// The runtime handle taken out of a cell while a thread waits for it; put back unless an
/// outcome was stored (also when the wait is interrupted).
struct Taken<'a> {
    cell: &'a Cell,
    task: Option<mizu_pool::Task>,
}

impl Taken<'_> {
    /// The handle, when the task is pending and nobody holds its lock.
    fn take(cell: &Cell) -> Option<Taken<'_>> {
        let g = cell.try_lock()?;
        matches!(*g, State::Pending(_)).then(|| Taken::from_guard(cell, g))
    }

    /// The handle of a pending task whose lock is held.
    fn from_guard<'a>(cell: &'a Cell, mut g: MutexGuard<'_, State>) -> Taken<'a> {
        let State::Pending(t) = std::mem::replace(&mut *g, State::Collecting) else {
            unreachable!("the caller checked that the task is pending")
        };
        Taken {
            cell,
            task: Some(t),
        }
    }

    fn task(&mut self) -> &mut mizu_pool::Task {
        self.task.as_mut().expect("present until dropped")
    }

    /// Stores the outcome (the handle is spent).
    fn finish(mut self, r: Result<Buffer, CollectError>) {
        self.task = None;
        *self.cell.lock() = State::Raw(r);
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            *self.cell.lock() = State::Pending(t);
        }
    }
}

/// Waits for a task: inside a worker, running other tasks meanwhile (nested maps never
/// deadlock).
fn collect(task: &mut mizu_pool::Task, wait: Duration) -> Result<Buffer, CollectError> {
    with_context(|ctx| match ctx {
        Some(ctx) => ctx.collect(task, Some(wait)),
        None => task.result(Some(wait)),
    })
}

/// The tasks of one submitter (a pool, or the nested submissions of a worker), held weakly.
#[derive(Default)]
pub(crate) struct Registry {
    live: Mutex<Vec<Weak<Cell>>>,
}

/// The nested submissions of this process (inside a worker).
pub(crate) static NESTED: LazyLock<Registry> = LazyLock::new(Registry::default);

impl Registry {
    fn track(&self, cell: &Arc<Cell>) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.push(Arc::downgrade(cell));
        // Forget dropped and finished tasks once the list has doubled since last time.
        if live.len() >= 256 && live.len().is_power_of_two() {
            live.retain(|w| {
                w.upgrade().is_some_and(|c| {
                    c.try_lock()
                        .is_none_or(|g| matches!(*g, State::Pending(_) | State::Collecting))
                })
            });
        }
    }

    /// Every task slot is taken: moves finished outcomes out of their slots into their tasks,
    /// or waits (one slice at most) for a task to finish. Call with the GIL released.
    pub(crate) fn drain(&self) {
        let cells: Vec<Arc<Cell>> = {
            let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            live.retain(|w| w.strong_count() > 0);
            live.iter().filter_map(Weak::upgrade).collect()
        };
        let mut moved = false;
        for c in &cells {
            if let Some(mut t) = Taken::take(c)
                && t.task().is_done()
            {
                let r = t.task().result(Some(Duration::ZERO));
                t.finish(r);
                moved = true;
            }
        }
        if moved {
            return;
        }
        // Nothing finished: wait on the oldest pending task (slots held by dropped tasks free
        // themselves as those finish).
        match cells.iter().find_map(|c| Taken::take(c)) {
            Some(mut t) => match collect(t.task(), SLICE) {
                Err(CollectError::Timeout) => {}
                r => t.finish(r),
            },
            None => std::thread::sleep(BUSY_NAP),
        }
    }
}

/// A submitted call. `result(timeout)` returns its value or raises its exception (with the
/// remote traceback as `__cause__`); `await task` works in asyncio.
#[pyclass(module = "pymizu", name = "Task", frozen, weakref)]
pub struct Task {
    cell: Arc<Cell>,
    pid: u32,
    nested: bool,
    /// The pool that runs it, kept alive while the task is (`Pool(2).submit(f, x).result()`
    /// works as with `ProcessPoolExecutor`).
    pool: Option<Py<PyAny>>,
}

impl Task {
    /// A task of `registry`'s submitter.
    pub(crate) fn new(t: mizu_pool::Task, registry: &Registry, nested: bool) -> Task {
        let cell = Arc::new(Cell {
            state: Mutex::new(State::Pending(t)),
            pid: mizu_shm::current_pid(),
        });
        registry.track(&cell);
        Task {
            cell,
            pid: mizu_shm::current_pid(),
            nested,
            pool: None,
        }
    }

    /// The task, keeping `pool` alive while it lives.
    pub(crate) fn kept(mut self, pool: &Bound<'_, PyAny>) -> Task {
        self.pool = Some(pool.clone().unbind());
        self
    }

    /// The outcome `(ok, value)`, waiting at most `timeout` (None: not finished in time).
    fn outcome(
        &self,
        py: Python<'_>,
        timeout: Option<Duration>,
    ) -> PyResult<Option<(bool, Py<PyAny>)>> {
        forked(self.pid)?;
        let start = timeout.map(|t| (Instant::now(), t));
        let left = move || start.map(|(s, t)| t.saturating_sub(s.elapsed()));
        loop {
            if let Some(mut g) = self.cell.try_lock() {
                match &*g {
                    State::Settled { ok, value, .. } => {
                        return Ok(Some((*ok, value.clone_ref(py))));
                    }
                    State::Raw(_) => {
                        let State::Raw(r) = std::mem::replace(&mut *g, State::Collecting) else {
                            unreachable!("matched")
                        };
                        drop(g);
                        return Ok(Some(self.settle(py, r)));
                    }
                    State::Pending(_) => {
                        let t = Taken::from_guard(&self.cell, g);
                        return self.wait(py, t, left);
                    }
                    State::Collecting => {}
                }
            }
            // Another thread is collecting it: look again shortly.
            if left().is_some_and(|l| l.is_zero()) {
                return Ok(None);
            }
            py.detach(|| std::thread::sleep(BUSY_NAP));
            py.check_signals()?;
        }
    }

    fn wait(
        &self,
        py: Python<'_>,
        mut t: Taken<'_>,
        left: impl Fn() -> Option<Duration>,
    ) -> PyResult<Option<(bool, Py<PyAny>)>> {
        let mut r = Err(CollectError::Timeout);
        // Inside a worker, waiting must run other tasks (the runtime does): no hot phase.
        if !crate::worker::in_task() {
            // Tasks that outlast the poll would only keep other Python threads off the GIL:
            // after a few misses in a row, poll briefly until one is caught again.
            let budget = if HOT_MISSES.load(Ordering::Relaxed) >= 4 {
                HOT_WAIT_COLD
            } else {
                HOT_WAIT
            };
            let mut hot_start = None;
            for i in 0u32.. {
                if t.task().is_done() {
                    r = t.task().result(Some(Duration::ZERO));
                    break;
                }
                // The clock costs more than a poll: read it every 64 polls.
                if i % 64 == 63 {
                    let s = *hot_start.get_or_insert_with(Instant::now);
                    if s.elapsed() >= budget || left().is_some_and(|l| l.is_zero()) {
                        break;
                    }
                }
                std::hint::spin_loop();
            }
            if r == Err(CollectError::Timeout) {
                let _ = HOT_MISSES
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| m.checked_add(1));
            } else {
                HOT_MISSES.store(0, Ordering::Relaxed);
            }
        }
        while r == Err(CollectError::Timeout) {
            let l = left();
            if l.is_some_and(|l| l.is_zero()) {
                return Ok(None); // `t` puts the handle back
            }
            let slice = l.map_or(SLICE, |l| l.min(SLICE));
            r = py.detach(|| collect(t.task(), slice));
            if r == Err(CollectError::Timeout) {
                py.check_signals()?;
            }
        }
        t.task = None; // spent: the outcome is stored below
        Ok(Some(self.settle(py, r)))
    }

    /// Makes Python objects of an outcome and stores them.
    fn settle(&self, py: Python<'_>, r: Result<Buffer, CollectError>) -> (bool, Py<PyAny>) {
        let cancelled = matches!(r, Err(CollectError::Task(TaskError::Cancelled)));
        let (ok, value) = match to_python(py, r) {
            Ok(v) => v,
            Err(e) => (false, e.into_value(py).into_any()),
        };
        *self.cell.lock() = State::Settled {
            ok,
            value: value.clone_ref(py),
            cancelled,
        };
        (ok, value)
    }

    /// `f` of the runtime handle when the task is uncollected and nobody is collecting it.
    fn peek(&self, f: impl FnOnce(&mizu_pool::Task) -> bool) -> bool {
        self.pid == mizu_shm::current_pid()
            && self
                .cell
                .try_lock()
                .is_some_and(|g| matches!(&*g, State::Pending(t) if f(t)))
    }

    /// Whether the outcome is here or ready to be read.
    fn is_done(&self) -> bool {
        self.cell.try_lock().is_some_and(|g| match &*g {
            State::Pending(t) => t.is_done(),
            State::Collecting => false,
            State::Raw(_) | State::Settled { .. } => true,
        })
    }
}

/// `pymizu._pool.decode`, which makes Python objects of pickled outcomes and errors.
static DECODE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `(ok, value or exception)` of an outcome: a small value natively, the rest by `pymizu`'s
/// Python side (unpickling; exceptions of the right classes).
fn to_python(py: Python<'_>, r: Result<Buffer, CollectError>) -> PyResult<(bool, Py<PyAny>)> {
    let empty = || {
        (
            PyBytes::new(py, b"").into_any().unbind(),
            PyList::empty(py).unbind(),
        )
    };
    let (status, (data, bufs), slot, pid) = match r {
        Ok(b) if crate::small::kind(&b) == Some(crate::small::TAG_VALUE) => {
            return Ok((true, crate::small::decode_value(py, &b)?.unbind()));
        }
        Ok(b) if mizu_wire::envelope::is_envelope(&b) => return crate::xlang::outcome(py, &b),
        Ok(b) => (0, decode(py, b)?, 0, 0),
        Err(CollectError::Timeout) | Err(CollectError::AlreadyCollected) => {
            return Err(MizuError::new_err(
                "pymizu: the task's outcome was already taken",
            ));
        }
        Err(CollectError::Task(e)) => match e {
            // An error payload is either ours (a pickled exception) or the runtime's text.
            TaskError::Failed(b) if mizu_wire::envelope::is_envelope(&b) => {
                return crate::xlang::outcome(py, &Buffer::from_slice_ref(b));
            }
            TaskError::Failed(b) => match decode(py, Buffer::from_vec(b.clone())) {
                Ok(d) => (1u8, d, 0, 0),
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
            // The runtime's own failure: its text, as for an undecodable payload above.
            TaskError::Runtime(m) => (
                1,
                (
                    PyBytes::new(py, m.as_bytes()).into_any().unbind(),
                    PyList::empty(py).unbind(),
                ),
                usize::MAX,
                0,
            ),
            TaskError::WorkerDied { slot, pid } => (2, empty(), slot, pid),
            TaskError::ExecTimeout { slot, pid } => (3, empty(), slot, pid),
            TaskError::Cancelled => (4, empty(), 0, 0),
            _ => (5, empty(), 0, 0),
        },
    };
    DECODE
        .import(py, "pymizu._pool", "decode")?
        .call1((status, data, bufs, slot, pid))?
        .extract()
}

fn timeout_error(timeout: Option<f64>) -> PyErr {
    PyTimeoutError::new_err(format!(
        "the task did not finish within {} s",
        timeout.unwrap_or(f64::INFINITY)
    ))
}

#[pymethods]
impl Task {
    /// The task's return value, waiting at most `timeout` seconds (forever when None;
    /// `TimeoutError` then, and the task stays valid). The task's exception is re-raised as
    /// itself, with the remote traceback as its `__cause__`.
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        match self.outcome(py, crate::wait_secs(timeout, "timeout")?)? {
            Some((true, v)) => Ok(v),
            Some((false, e)) => Err(PyErr::from_value(e.into_bound(py))),
            None => Err(timeout_error(timeout)),
        }
    }

    /// The task's exception, or None if it returned a value (waits as `result`).
    #[pyo3(signature = (timeout=None))]
    fn exception(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        match self.outcome(py, crate::wait_secs(timeout, "timeout")?)? {
            Some((ok, v)) => Ok((!ok).then_some(v)),
            None => Err(timeout_error(timeout)),
        }
    }

    /// `(ok, value or exception)`, or None when not finished within `timeout` seconds.
    #[pyo3(signature = (timeout=None))]
    fn _outcome(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<Option<(bool, Py<PyAny>)>> {
        self.outcome(py, crate::wait_secs(timeout, "timeout")?)
    }

    /// Whether the task has finished (its outcome is ready).
    fn done(&self) -> bool {
        self.pid == mizu_shm::current_pid() && self.is_done()
    }

    /// Cancels the task if it has not started; True if it will never run.
    fn cancel(&self, py: Python<'_>) -> bool {
        if !self.peek(mizu_pool::Task::cancel) {
            return false;
        }
        // Take the cancellation out of the slot now (frees it).
        if let Some(mut t) = Taken::take(&self.cell) {
            let r = t.task().result(Some(Duration::ZERO));
            if r != Err(CollectError::Timeout) {
                t.task = None;
                self.settle(py, r);
            }
        }
        true
    }

    /// Whether the task was cancelled.
    fn cancelled(&self) -> bool {
        self.cell.try_lock().is_some_and(|g| match &*g {
            State::Settled { cancelled, .. } => *cancelled,
            State::Raw(r) => matches!(r, Err(CollectError::Task(TaskError::Cancelled))),
            _ => false,
        })
    }

    fn __await__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        if slf.get().nested {
            return Err(MizuError::new_err(
                "await is not available inside a worker; use result()",
            ));
        }
        py.import("pymizu._pool")?
            .getattr("_await_task")?
            .call1((slf,))
    }

    // A kept exception's traceback can reach this task (a frame holding the list of tasks):
    // the garbage collector must see that edge, or the cycle, and the pool memory its tasks
    // hold, would never be freed.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(g) = self.cell.try_lock()
            && let State::Settled { value, .. } = &*g
        {
            visit.call(value)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut g) = self.cell.try_lock()
            && matches!(*g, State::Settled { .. })
        {
            *g = State::Raw(Err(CollectError::AlreadyCollected));
        }
    }

    fn __repr__(&self) -> &'static str {
        match self.cell.try_lock().as_deref() {
            Some(State::Settled { ok: true, .. }) => "<pymizu.Task finished>",
            Some(State::Settled { ok: false, .. }) => "<pymizu.Task failed>",
            Some(State::Raw(Ok(_))) => "<pymizu.Task finished>",
            Some(State::Raw(Err(_))) => "<pymizu.Task failed>",
            _ => "<pymizu.Task pending>",
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if self.pid != mizu_shm::current_pid() {
            // A forked child's copy: the slot belongs to the parent; touch nothing.
            if let State::Pending(t) = std::mem::replace(&mut *self.cell.lock(), State::Collecting)
            {
                std::mem::forget(t);
            }
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
    let ready = |ts: &[Py<Task>]| ts.iter().position(|t| t.get().is_done());
    loop {
        if let Some(i) = ready(&tasks) {
            return Ok(Some(i));
        }
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            return Ok(None);
        }
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        // Park on the submitter of a pending task nobody is collecting right now.
        let found = py.detach(|| {
            let probe = tasks.iter().find_map(|t| {
                let g = t.get().cell.try_lock()?;
                matches!(*g, State::Pending(_)).then_some(g)
            });
            match probe {
                Some(g) => {
                    let State::Pending(p) = &*g else {
                        unreachable!("checked")
                    };
                    mizu_pool::wait_until(p, Some(slice), || {
                        // The probe's lock is held here: test it directly, the rest by lock.
                        p.is_done()
                            .then_some(())
                            .or_else(|| ready(&tasks).map(|_| ()))
                    })
                }
                None => {
                    std::thread::sleep(BUSY_NAP);
                    None
                }
            }
        });
        if found.is_none() {
            py.check_signals()?;
        }
    }
}
