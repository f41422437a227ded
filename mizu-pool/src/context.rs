//! What a task sees while it runs: the [`Executor`] a binding provides, and the
//! [`TaskContext`] it is handed (nested submission and collection, the input as a buffer,
//! the result written in place, the worker's data segments). The thread's current task is
//! kept here for bindings whose task code calls back into them ([`with_current_task`]).

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arrow_buffer::Buffer;

use crate::error::{PoolError, Result};
use crate::layout::wstate;
use crate::shared::Shared;
use crate::submitter::{CollectError, SubmitterCore, Task};

/// Runs task payloads. `Err` bytes become the task's error payload.
pub trait Executor: Send + Sync {
    /// Runs one task.
    fn execute(&self, ctx: &TaskContext<'_>, input: &[u8])
    -> std::result::Result<Vec<u8>, Vec<u8>>;

    /// Called when the worker has had nothing to run for a whole wait slice (2 ms): for
    /// housekeeping such as a garbage collection, which then cannot delay the next task of a
    /// busy stream. Must be quick when there is nothing to do; it is called again after every
    /// idle slice.
    fn idle(&self) {}

    /// The worker ran a task after having parked (or at its first task): a stream of tasks
    /// may follow, between which the worker only polls and spins (within its spin budget).
    /// Until [`Executor::stream_end`], on the worker's thread, the executor may keep what it
    /// would otherwise take and give back around every task (an interpreter lock, say).
    fn stream_start(&self) {}

    /// The stream ended: the worker spun without finding a task and is about to park (or to
    /// leave). Give back what `stream_start` kept.
    fn stream_end(&self) {}
}

thread_local! {
    /// The context of the task this thread runs right now (null outside tasks). Nested tasks
    /// run while a task helps: each sets its own and puts the outer one back.
    static CURRENT: Cell<*const TaskContext<'static>> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with the context of the task this thread is running (`None` outside tasks): for
/// bindings whose task code calls back into them (nested submission, the current element).
pub fn with_current_task<T>(f: impl FnOnce(Option<&TaskContext<'_>>) -> T) -> T {
    let p = CURRENT.with(Cell::get);
    // SAFETY: CURRENT is non-null only while `execute_current` (below) is on this thread's
    // stack with that context alive; it is restored (by a guard, even on panic) before that
    // call returns.
    f(unsafe { p.as_ref() })
}

/// Runs the executor with `ctx` as the thread's current task (see [`with_current_task`]).
pub(crate) fn execute_current(
    exec: &dyn Executor,
    ctx: &TaskContext<'_>,
    input: &[u8],
) -> std::result::Result<Vec<u8>, Vec<u8>> {
    struct Restore(*const TaskContext<'static>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    // Lifetime erasure: the pointer is only dereferenced through `with_current_task` while
    // this call is on the stack; `_restore` puts the previous one back when it returns.
    let _restore = Restore(
        CURRENT.with(|c| c.replace(std::ptr::from_ref(ctx).cast::<TaskContext<'static>>())),
    );
    exec.execute(ctx, input)
}

/// What a running task can do: submit nested tasks and collect them (helping meanwhile).
pub struct TaskContext<'a> {
    /// The worker's submitter (its nested tasks).
    pub(crate) sub: &'a Arc<SubmitterCore>,
    pub(crate) shared: &'a Shared,
    /// The worker's slot.
    pub(crate) worker: usize,
    /// Runs one other task of this worker's (or steals one); false when there was none: what
    /// a nested wait does instead of sleeping.
    pub(crate) help: &'a dyn Fn() -> bool,
    element: Cell<Option<u64>>,
    /// The task's slot, while its result may still be written in place.
    pub(crate) slot: Cell<Option<(usize, usize)>>,
    /// Set once the executor wrote the result itself: whether it is a success.
    pub(crate) replied: Cell<Option<bool>>,
    pub(crate) input: RefCell<Option<Buffer>>,
}

impl<'a> TaskContext<'a> {
    /// The context of a task of worker `worker`, whose nested waits call `help`.
    pub(crate) fn new(
        sub: &'a Arc<SubmitterCore>,
        shared: &'a Shared,
        worker: usize,
        help: &'a dyn Fn() -> bool,
    ) -> TaskContext<'a> {
        TaskContext {
            sub,
            shared,
            worker,
            help,
            element: Cell::new(None),
            slot: Cell::new(None),
            replied: Cell::new(None),
            input: RefCell::new(None),
        }
    }

    /// Inside a map: the input position of the element being run (for per-element random
    /// streams, progress, error reports).
    pub fn element(&self) -> Option<u64> {
        self.element.get()
    }

    pub(crate) fn set_element(&self, i: Option<u64>) {
        self.element.set(i);
    }

    /// Submits a nested task from this worker.
    pub fn submit(&self, payload: &[u8]) -> Result<Task> {
        self.sub.submit(&payload, None)
    }

    /// Submits a nested task whose payload writes itself in place (see [`crate::Fill`]).
    pub fn submit_with(&self, payload: &dyn crate::Fill) -> Result<Task> {
        self.sub.submit(payload, None)
    }

    /// Nested [`crate::Pool::submit_batch_with`].
    pub fn submit_batch_with<'p>(
        &self,
        payloads: impl IntoIterator<Item = &'p dyn crate::Fill>,
    ) -> (Vec<Task>, Result<()>) {
        self.sub.submit_batch_partial(payloads, None)
    }

    /// Collects a nested task, running other tasks while it waits, so nested maps never
    /// deadlock, even with one worker.
    pub fn collect(
        &self,
        task: &mut Task,
        timeout: Option<Duration>,
    ) -> std::result::Result<Buffer, CollectError> {
        task.result_helping(timeout, &mut || (self.help)())
    }

    /// The task's input as a buffer that may be kept (a view of shared memory for large
    /// payloads); `None` inside a map element.
    pub fn input(&self) -> Option<Buffer> {
        self.input.borrow().clone()
    }

    /// Writes the task's outcome in place (large results go straight into a data region,
    /// without an intermediate buffer); what `execute` returns afterwards is ignored. Not
    /// available inside a map element (an error says so).
    pub fn reply(&self, ok: bool, payload: &dyn crate::Fill) -> Result<()> {
        let Some((s, k)) = self.slot.take() else {
            return Err(PoolError::Layout(
                "reply: not a top-level task, or already replied".into(),
            ));
        };
        match self.shared.write_payload_with(s, k, payload) {
            Ok(()) => {
                self.replied.set(Some(ok));
                Ok(())
            }
            Err(e) => {
                self.slot.set(Some((s, k)));
                Err(e)
            }
        }
    }

    /// The task's outcome as an executor returns it: written in place by [`TaskContext::reply`]
    /// (an empty vector is returned then, which the runtime ignores), else as bytes. When
    /// `/dev/shm` is full, the binding's garbage is collected and what this process keeps
    /// idle given back ([`crate::pressure::relieve`]) before a second try; inside a map
    /// element, or when there is still no room, the outcome is returned as bytes for the
    /// runtime to store.
    pub fn send(
        &self,
        ok: bool,
        payload: &dyn crate::Fill,
    ) -> std::result::Result<Vec<u8>, Vec<u8>> {
        let mut replied = self.reply(ok, payload);
        if matches!(&replied, Err(PoolError::Wire(w)) if w.is_no_space()) {
            crate::pressure::relieve();
            replied = self.reply(ok, payload);
        }
        // A worker's stderr is its pool owner's: the user sees a worker's first spill there.
        if let Some(notice) = crate::machine::take_spill_notice() {
            eprintln!("{notice}");
        }
        if replied.is_ok() {
            return Ok(Vec::new());
        }
        let mut v = vec![0u8; payload.size()];
        payload.fill(&mut v);
        if ok { Ok(v) } else { Err(v) }
    }

    /// This worker's data segments (see [`crate::Pool::data_pool`]).
    pub fn data_pool(&self) -> &mizu_wire::DataPool {
        &self.shared.data_pool
    }

    /// This worker's slot.
    pub fn worker_slot(&self) -> usize {
        self.worker
    }

    /// Asks to leave after the current task and be replaced by a fresh worker (a task quota,
    /// as `max_tasks_per_child`); queued tasks go to the replacement or to other workers.
    pub fn recycle(&self) {
        let _ = self
            .shared
            .view()
            .worker(self.worker)
            .rec
            .state
            .compare_exchange(
                wstate::READY,
                wstate::RECYCLE,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
    }
}
