//! A submitted task as the R package holds it: pending in its slot, its outcome moved out of
//! the slot to make room, or collected.

use std::cell::RefCell;

use arrow_buffer::Buffer;
use mizu_pool::{CollectError, TaskError};

/// Where a task is.
pub enum TaskState {
    /// Submitted; its outcome (when there is one) is in its task slot.
    Pending(mizu_pool::Task),
    /// Its outcome, moved out of the slot to make room for more tasks.
    Finished(std::result::Result<Buffer, CollectError>),
    /// Collected: what the first collection returned is kept in the task handle's `prot`
    /// field (so R's collector sees it as part of the task, not as a global root) and
    /// returned again when asked again: the plain value, or (`outcome`) the outcome list of
    /// a task that did not end with a plain value.
    Done { outcome: bool },
    /// Dropped in a forked child.
    Taken,
}

/// A submitted task (it lives in its batch of handles, see `batch::task_handle`).
pub struct RTask {
    pub(crate) cell: RefCell<TaskState>,
    pub(crate) origin: mizu_pool::Origin,
}

thread_local! {
    /// Tasks alive in this process (for tests: dropped handles must release theirs).
    static LIVE_TASKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

pub(crate) fn live_tasks() -> f64 {
    LIVE_TASKS.get() as f64
}

impl RTask {
    pub(crate) fn new(t: mizu_pool::Task) -> RTask {
        LIVE_TASKS.set(LIVE_TASKS.get() + 1);
        RTask {
            cell: RefCell::new(TaskState::Pending(t)),
            origin: mizu_pool::Origin::here(),
        }
    }

    /// A pending task of a stopped pool: its outcome is "stopped" (see
    /// `BatchSlot::abandon_pending`).
    pub(crate) fn abandon(&self) {
        let mut c = self.cell.borrow_mut();
        if matches!(*c, TaskState::Pending(_)) {
            *c = TaskState::Finished(Err(CollectError::Task(TaskError::Stopped)));
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        match &*self.cell.borrow() {
            TaskState::Pending(t) => t.is_done(),
            TaskState::Finished(_) | TaskState::Done { .. } => true,
            TaskState::Taken => false,
        }
    }
}

impl Drop for RTask {
    fn drop(&mut self) {
        LIVE_TASKS.set(LIVE_TASKS.get().saturating_sub(1));
    }
}
