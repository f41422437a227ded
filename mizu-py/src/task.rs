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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mizu_pool::OutcomeBytes;
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyString};
use pyo3::{PyTraverseError, PyVisit};

use mizu_pool::{CollectError, TaskError};

use crate::cell::{
    BUSY_NAP, Cell, HOT_MISSES, HOT_WAIT, HOT_WAIT_COLD, SLICE, State, Taken, collect,
};
use crate::registry::{Chunk, Registry};
use crate::task_outcome::{BATCH_ELEMENT, BATCH_PAYLOAD, decoded, to_python};
use crate::watch::Watch;
use crate::{MizuError, forked};

/// A submitted call. `result(timeout)` returns its value or raises its exception (with the
/// remote traceback as `__cause__`); `await task` works in asyncio.
///
/// The type keeps up to 8 192 freed tasks' memory for new ones: a pipelined loop makes and
/// frees thousands, and a task made afresh costs an allocation and a step of the garbage
/// collector's count — one collection per 700 tasks, each walking the young objects (a reused
/// one is made untracked, as [`Task::untracked`] wants it).
#[pyclass(module = "pymizu", name = "Task", frozen, weakref, freelist = 8192)]
pub struct Task {
    pub(crate) cell: Arc<Cell>,
    origin: mizu_pool::Origin,
    nested: bool,
    /// The pool that runs it, kept alive while the task is (`Pool(2).submit(f, x).result()`
    /// works as with `ProcessPoolExecutor`).
    pool: Option<Py<PyAny>>,
    /// For a call of a batch's chunk: the chunk and the call's position in it.
    pub(crate) member: Option<(Arc<Chunk>, usize)>,
    /// Which `PendingSet` holds its executor future, and where (`NOT_PENDING` if none).
    pub(crate) pending_at: std::sync::atomic::AtomicU64,
    /// The task's id in its pool, packed (`TaskId::pack`): to cancel it while another thread
    /// holds its handle. Zero once so cancelled (that thread reads the cancellation in time).
    by_id: std::sync::atomic::AtomicU64,
    /// Whether `concurrent.futures` waiters were told it finished (`pymizu._task_futures`).
    cf_notified: AtomicBool,
}

/// [`Task::pending_at`] of a task whose future is in no pending set.
pub(crate) const NOT_PENDING: u64 = 0;

impl Task {
    /// A task of `registry`'s submitter.
    pub(crate) fn new(t: mizu_pool::Task, registry: &Registry, nested: bool) -> Task {
        let id = t.id();
        let cell = Arc::new(Cell {
            state: Mutex::new(State::Pending(t)),
            origin: mizu_pool::Origin::here(),
        });
        registry.track(&cell);
        Task {
            cell,
            origin: mizu_pool::Origin::here(),
            nested,
            pool: None,
            member: None,
            pending_at: NOT_PENDING.into(),
            by_id: id.pack().into(),
            cf_notified: AtomicBool::new(false),
        }
    }

    /// The tasks of the calls `calls` of `fn_` that `chunk` (a task running them all) runs.
    pub(crate) fn members(
        py: Python<'_>,
        chunk: Task,
        fn_: Py<PyAny>,
        calls: Vec<Py<PyAny>>,
    ) -> Vec<Task> {
        let n = calls.len();
        let shared = Arc::new(Chunk {
            calls: Mutex::new(Some((fn_, calls))),
            cancelled: Mutex::new(vec![false; n]),
            any_cancelled: AtomicBool::new(false),
            failed: Mutex::new(Vec::new()),
        });
        (0..n)
            .map(|i| Task {
                cell: chunk.cell.clone(),
                origin: chunk.origin,
                nested: chunk.nested,
                pool: chunk.pool.as_ref().map(|p| p.clone_ref(py)),
                member: Some((shared.clone(), i)),
                pending_at: NOT_PENDING.into(),
                by_id: chunk.by_id.load(Ordering::Relaxed).into(),
                cf_notified: AtomicBool::new(false),
            })
            .collect()
    }

    /// The runtime handle of a task nobody has collected (the task is spent).
    pub(crate) fn into_handle(self) -> Option<mizu_pool::Task> {
        match std::mem::replace(&mut *self.cell.lock(), State::Collecting) {
            State::Pending(t) => Some(t),
            _ => None,
        }
    }

    /// The pool object this task keeps alive, if any.
    pub(crate) fn pool(&self) -> Option<&Py<PyAny>> {
        self.pool.as_ref()
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
        let Some((chunk, i)) = &self.member else {
            return self.cell_outcome(py, timeout);
        };
        if chunk.is_cancelled(*i) {
            return decoded(py, 4).map(Some);
        }
        let Some((ok, value)) = self.cell_outcome(py, timeout)? else {
            return Ok(None);
        };
        // The chunk has run: nothing will be resubmitted.
        chunk.calls.lock().unwrap_or_else(|p| p.into_inner()).take();
        if !ok {
            // The chunk failed as a whole (its worker died, the pool stopped): so did the call.
            return Ok(Some((false, value)));
        }
        let v = value.bind(py);
        if let Ok(l) = v.cast_exact::<PyList>() {
            return Ok(Some((true, l.get_item(*i)?.unbind())));
        }
        // Some calls of the chunk failed: `_pool._batch_element` says which.
        if let Some((_, e)) = chunk.failures().iter().find(|(j, _)| j == i) {
            return Ok(Some((false, e.clone_ref(py))));
        }
        let (ok, value): (bool, Py<PyAny>) = BATCH_ELEMENT
            .import(py, "pymizu._batches", "_batch_element")?
            .call1((v, *i))?
            .extract()?;
        if ok {
            return Ok(Some((true, value)));
        }
        let mut failed = chunk.failures();
        if let Some((_, e)) = failed.iter().find(|(j, _)| j == i) {
            return Ok(Some((false, e.clone_ref(py)))); // another thread made it meanwhile
        }
        failed.push((*i, value.clone_ref(py)));
        Ok(Some((false, value)))
    }

    /// The outcome of the task the cell holds (for a member, its chunk's).
    fn cell_outcome(
        &self,
        py: Python<'_>,
        timeout: Option<Duration>,
    ) -> PyResult<Option<(bool, Py<PyAny>)>> {
        forked(self.origin)?;
        // The clock is read once waiting begins (an outcome already there costs no reading):
        // a timeout counts from then.
        let start = std::cell::OnceCell::new();
        let left = || timeout.map(|t| t.saturating_sub(start.get_or_init(Instant::now).elapsed()));
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
                        // (`wait` looks whether the task is done before it reads `left`.)
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
        if !mizu_pool::with_current_task(|c| c.is_some()) {
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
                    r = t.task().outcome(Some(Duration::ZERO));
                    break;
                }
                // The clock costs more than a poll: read it every 64 polls. (A worker queued
                // behind this thread ends the poll there too: the wait parks at once.)
                if i % 64 == 63 {
                    let s = *hot_start.get_or_insert_with(Instant::now);
                    if s.elapsed() >= budget
                        || left().is_some_and(|l| l.is_zero())
                        || t.task().worker_queued_here()
                    {
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
    fn settle(&self, py: Python<'_>, r: Result<OutcomeBytes, CollectError>) -> (bool, Py<PyAny>) {
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
        self.origin.is_here()
            && self
                .cell
                .try_lock()
                .is_some_and(|g| matches!(&*g, State::Pending(t) if f(t)))
    }

    /// How the task finished, if it did and nothing of its outcome has been read (or it was
    /// moved out of its slot unread): `Some(true)` when it returned a value (nobody would
    /// miss it if the task were dropped), `Some(false)` when it raised or its worker died (a
    /// future nobody observes must still be settled with it: it may break the executor);
    /// None when it is not finished, was cancelled, or its outcome was read.
    pub(crate) fn unread_finish(&self) -> Option<bool> {
        use mizu_pool::SlotState::{Died, Err as Failed, Ok as Returned};
        if !self.origin.is_here() || self.member.is_some() {
            return None;
        }
        let g = self.cell.try_lock()?;
        match &*g {
            State::Pending(t) => match t.state()? {
                Returned => Some(true),
                Failed | Died => Some(false),
                _ => None,
            },
            State::Raw(Ok(_)) => Some(true),
            State::Raw(Err(CollectError::Task(TaskError::Cancelled))) => None,
            State::Raw(Err(_)) => Some(false),
            _ => None,
        }
    }

    /// Whether this is a member of a batch cancelled on its own.
    fn member_cancelled(&self) -> bool {
        self.member
            .as_ref()
            .is_some_and(|(c, i)| c.is_cancelled(*i))
    }

    /// Whether the outcome is here or ready to be read.
    pub(crate) fn is_done(&self) -> bool {
        self.cell.try_lock().is_some_and(|g| match &*g {
            State::Pending(t) => t.is_done(),
            State::Collecting => false,
            State::Raw(_) | State::Settled { .. } => true,
        })
    }
}

impl Task {
    /// The outcome of the task `slf` (as `outcome`). A task is made untracked by the garbage
    /// collector (`untracked`); once it hands out a value the collector tracks (which could
    /// come to refer to the task: a kept exception's traceback, a list the caller appends the
    /// task to), the task is tracked again, so such a cycle is collected.
    pub(crate) fn outcome_of(
        slf: &Bound<'_, Self>,
        timeout: Option<Duration>,
    ) -> PyResult<Option<(bool, Py<PyAny>)>> {
        let out = slf.get().outcome(slf.py(), timeout)?;
        if let Some((_, v)) = &out {
            crate::gc::track_holder(slf.as_any(), v.bind(slf.py()));
        }
        Ok(out)
    }

    /// `tasks` as Python objects the garbage collector does not track (see `untracked`).
    pub(crate) fn untracked_all(
        py: Python<'_>,
        tasks: Vec<Task>,
    ) -> PyResult<Vec<Bound<'_, Task>>> {
        tasks.into_iter().map(|t| t.untracked(py)).collect()
    }

    /// The task as a Python object the garbage collector does not track: a pipelined loop or
    /// a batch keeps thousands of tasks, which hold no Python object until their outcome is
    /// read, and every collection meanwhile would walk them all (a third of a batch's cost).
    pub(crate) fn untracked(self, py: Python<'_>) -> PyResult<Bound<'_, Task>> {
        let b = Bound::new(py, self)?;
        // (A garbage-collected type: Task defines `__traverse__`.)
        crate::gc::untrack_new(b.as_any());
        Ok(b)
    }

    /// `cancel()` of a task of its own.
    fn cancel_single(&self, py: Python<'_>) -> bool {
        if !self.peek(mizu_pool::Task::cancel) {
            return self.cancel_held(py);
        }
        // Take the cancellation out of the slot now (frees it).
        if let Some(mut t) = Taken::take(&self.cell) {
            let r = t.task().outcome(Some(Duration::ZERO));
            if r != Err(CollectError::Timeout) {
                t.task = None;
                self.settle(py, r);
            }
        }
        true
    }

    /// `cancel()` of a task whose handle another thread holds while it waits for the outcome
    /// (`result()` in another thread, `concurrent.futures.wait`): cancelled through its pool,
    /// by id; that thread then finds it cancelled, as a standard future's waiter would.
    fn cancel_held(&self, py: Python<'_>) -> bool {
        if !self.origin.is_here() {
            return false;
        }
        let held = self
            .cell
            .try_lock()
            .is_none_or(|g| matches!(*g, State::Collecting));
        let Some(pool) = self.pool.as_ref() else {
            return false;
        };
        let Ok(pool) = pool.bind(py).cast::<crate::pool_class::Pool>() else {
            return false;
        };
        let inner = pool.get().inner.read().unwrap_or_else(|p| p.into_inner());
        let word = self.by_id.load(Ordering::Acquire);
        let done = held && word != 0 && inner.as_ref().is_some_and(|p| p.cancel_packed(word));
        if done {
            self.by_id.store(0, Ordering::Release);
        }
        done
    }

    /// Whether it was cancelled by id (`cancel_held`).
    fn cancelled_by_id(&self) -> bool {
        self.by_id.load(Ordering::Acquire) == 0
    }

    /// `cancel()` of call `i` of a chunk: while the chunk is queued, the chunk is cancelled
    /// and the calls not cancelled go again as a new chunk (the members keep their positions).
    fn cancel_member(&self, py: Python<'_>, chunk: &Chunk, i: usize) -> PyResult<bool> {
        if chunk.is_cancelled(i) {
            return Ok(true);
        }
        if !self.origin.is_here() {
            return Ok(false);
        }
        // Queued, and nobody is waiting for it (a waiter holds the handle).
        let Some(mut t) = Taken::take(&self.cell) else {
            return Ok(false);
        };
        if !t.task().cancel() {
            return Ok(false); // started or finished; `t` puts the handle back
        }
        let skip: Vec<usize> = {
            let mut c = chunk.cancelled.lock().unwrap_or_else(|p| p.into_inner());
            c[i] = true;
            chunk.any_cancelled.store(true, Ordering::Release);
            (0..c.len()).filter(|&j| c[j]).collect()
        };
        let calls = chunk
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(f, cs)| {
                (
                    f.clone_ref(py),
                    cs.iter().map(|c| c.clone_ref(py)).collect::<Vec<_>>(),
                )
            });
        let (Some((fn_, calls)), Some(pool)) = (calls, self.pool.as_ref()) else {
            // (Cannot happen: the calls are kept until an outcome is read, and every member
            // holds its pool.) The whole chunk stays cancelled.
            let r = t.task().outcome(Some(Duration::ZERO));
            t.finish(r);
            return Ok(true);
        };
        if skip.len() == calls.len() {
            let r = t.task().outcome(Some(Duration::ZERO));
            t.finish(r);
            return Ok(true);
        }
        // The cancelled handle is dropped (its slot frees itself); the new chunk takes its
        // place in the cell.
        t.task = None;
        let again = BATCH_PAYLOAD
            .import(py, "pymizu._batches", "_batch_payload")?
            .call1((fn_, calls, skip))
            .and_then(|p| {
                let call = crate::small::PickledCall::from_python(&p)?;
                let pool = pool.bind(py).cast::<crate::pool_class::Pool>()?;
                crate::pool_class::Pool::submit_handle(pool, &call)
            });
        match again {
            Ok(handle) => t.task = Some(handle),
            Err(e) => {
                // The others fail with the reason (the pool stopped, say).
                *self.cell.lock() = State::Settled {
                    ok: false,
                    value: e.into_value(py).into_any(),
                    cancelled: false,
                };
            }
        }
        Ok(true)
    }
}

/// What of `pymizu._task_futures` a task uses, looked up once.
static TF_CANCELLED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static TF_CALLBACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static TF_LOCK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static TF_NOTIFY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static TF_WAITERS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn task_futures<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyAny>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyAny>> {
    cell.import(py, "pymizu._task_futures", name)
}

pub(crate) fn timeout_error(timeout: Option<f64>) -> PyErr {
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
    fn result(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        match Task::outcome_of(slf, crate::wait_secs(timeout, "timeout")?)? {
            Some((true, v)) => Ok(v),
            Some((false, e)) => Err(PyErr::from_value(e.into_bound(py))),
            None => Err(timeout_error(timeout)),
        }
    }

    /// The task's exception, or None if it returned a value (waits as `result`).
    #[pyo3(signature = (timeout=None))]
    fn exception(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        match Task::outcome_of(slf, crate::wait_secs(timeout, "timeout")?)? {
            Some((ok, v)) => Ok((!ok).then_some(v)),
            None => Err(timeout_error(timeout)),
        }
    }

    /// `(ok, value or exception)`, or None when not finished within `timeout` seconds.
    #[pyo3(signature = (timeout=None))]
    fn _outcome(
        slf: &Bound<'_, Self>,
        timeout: Option<f64>,
    ) -> PyResult<Option<(bool, Py<PyAny>)>> {
        Task::outcome_of(slf, crate::wait_secs(timeout, "timeout")?)
    }

    /// Whether a worker is running the task now (it has started and not finished; it can no
    /// longer be cancelled). A member of a batch runs with its chunk.
    fn running(&self) -> bool {
        if self.member_cancelled() {
            return false;
        }
        self.peek(|t| t.state() == Some(mizu_pool::SlotState::Running))
    }

    /// Whether the task has finished (its outcome is ready).
    fn done(&self) -> bool {
        self.origin.is_here()
            && (self.is_done() || self.member_cancelled() || self.cancelled_by_id())
    }

    /// A watch over the outcome for a caller that looks now and then between work of its own
    /// (an event loop): None when it should wait elsewhere (see `Watch`).
    fn _watch(&self) -> Option<Watch> {
        if !self.origin.is_here() {
            return None;
        }
        let g = self.cell.try_lock()?;
        match &*g {
            State::Pending(t) if !t.is_done() => t.watch().map(|w| Watch(Mutex::new(Some(w)))),
            _ => None,
        }
    }

    /// Cancels the task if it has not started; True if it will never run. As with a
    /// `concurrent.futures` future, its waiters are notified and its done-callbacks run then.
    fn cancel(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let py = slf.py();
        let t = slf.get();
        let done = match &t.member {
            Some((chunk, i)) => t.cancel_member(py, chunk, *i)?,
            None => t.cancel_single(py),
        };
        if done {
            task_futures(py, &TF_CANCELLED, "cancelled")?.call1((slf,))?;
        }
        Ok(done)
    }

    /// `fn(task)` once the task is done: at once when it is, else in a pymizu thread (or the
    /// thread that cancels it). An exception `fn` raises is logged, as `concurrent.futures`
    /// does.
    fn add_done_callback(slf: &Bound<'_, Self>, fn_: &Bound<'_, PyAny>) -> PyResult<()> {
        task_futures(slf.py(), &TF_CALLBACK, "add_done_callback")?.call1((slf, fn_))?;
        Ok(())
    }

    // What `concurrent.futures.wait` and `as_completed` read of a future (see
    // `pymizu/_task_futures.py`).
    #[getter(_state)]
    fn cf_state(&self, py: Python<'_>) -> Py<PyString> {
        let s = if !self.cf_notified.load(Ordering::Acquire) {
            pyo3::intern!(py, "PENDING")
        } else if self.cancelled() {
            pyo3::intern!(py, "CANCELLED_AND_NOTIFIED")
        } else {
            pyo3::intern!(py, "FINISHED")
        };
        s.clone().unbind()
    }

    /// Marks the task's waiters told it finished; whether they were not before.
    fn _cf_notify(&self) -> bool {
        !self.cf_notified.swap(true, Ordering::AcqRel)
    }

    #[getter(_condition)]
    fn cf_condition<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let t = slf.get();
        if !t.cf_notified.load(Ordering::Acquire) && t.done() {
            // Whoever asks is about to read its state: a task already done counts as finished
            // then, and takes no waiter (as a standard future finished before).
            task_futures(py, &TF_NOTIFY, "notify_done")?.call1(((slf,),))?;
        }
        Ok(task_futures(py, &TF_LOCK, "_LOCK")?.clone())
    }

    #[getter(_waiters)]
    fn cf_waiters<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        task_futures(slf.py(), &TF_WAITERS, "_Waiters")?.call1((slf,))
    }

    /// Whether the task was cancelled.
    fn cancelled(&self) -> bool {
        if self.member_cancelled() || self.cancelled_by_id() {
            return true;
        }
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
        py.import("pymizu._loops")?
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
        if let Some((chunk, _)) = &self.member
            && let Ok(failed) = chunk.failed.try_lock()
        {
            for (_, e) in failed.iter() {
                visit.call(e)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(mut g) = self.cell.try_lock()
            && matches!(*g, State::Settled { .. })
        {
            *g = State::Raw(Err(CollectError::AlreadyCollected));
        }
        if let Some((chunk, _)) = &self.member
            && let Ok(mut failed) = chunk.failed.try_lock()
        {
            failed.clear();
        }
    }

    fn __repr__(&self) -> &'static str {
        use mizu_pool::SlotState as S;
        if self.member_cancelled() {
            return "<pymizu.Task cancelled>";
        }
        match self.cell.try_lock().as_deref() {
            Some(State::Settled {
                cancelled: true, ..
            }) => "<pymizu.Task cancelled>",
            Some(State::Settled { ok: true, .. }) => "<pymizu.Task finished>",
            Some(State::Settled { ok: false, .. }) => "<pymizu.Task failed>",
            Some(State::Raw(Ok(_))) => "<pymizu.Task finished>",
            Some(State::Raw(Err(CollectError::Task(TaskError::Cancelled)))) => {
                "<pymizu.Task cancelled>"
            }
            Some(State::Raw(Err(_))) => "<pymizu.Task failed>",
            // What the slot says while the outcome waits there (`done()` is true then). A
            // batch member's slot is its chunk's: finished says nothing of the member's own
            // outcome.
            Some(State::Pending(t)) if self.origin.is_here() => match t.state() {
                Some(S::Running) => "<pymizu.Task running>",
                Some(S::Ok) if self.member.is_none() => "<pymizu.Task finished>",
                Some(S::Err | S::Died) if self.member.is_none() => "<pymizu.Task failed>",
                Some(S::Ok | S::Err | S::Died) => "<pymizu.Task finished>",
                Some(S::Cancelled) => "<pymizu.Task cancelled>",
                _ => "<pymizu.Task pending>",
            },
            _ => "<pymizu.Task pending>",
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if !self.origin.is_here() {
            // A forked child's copy: the slot belongs to the parent; touch nothing.
            if let State::Pending(t) = std::mem::replace(&mut *self.cell.lock(), State::Collecting)
            {
                std::mem::forget(t);
            }
        }
    }
}
