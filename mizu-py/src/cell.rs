//! A task's outcome cell, shared by its `Task` object(s) and its submitter's registry: pending
//! in its slot, taken out of the slot, or read (and kept, so `result()` can be called again).

use std::sync::atomic::AtomicU32;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use mizu_pool::OutcomeBytes;
use pyo3::prelude::*;

use mizu_pool::CollectError;

use mizu_pool::with_current_task as with_context;

/// How long one GIL-free wait lasts before signals are checked.
pub(crate) const SLICE: Duration = Duration::from_millis(50);
/// How long a wait polls with the GIL held before releasing it.
pub(crate) const HOT_WAIT: Duration = Duration::from_micros(20);
/// The poll after several waits in a row outlasted [`HOT_WAIT`].
pub(crate) const HOT_WAIT_COLD: Duration = Duration::from_micros(2);
/// Waits in a row (in this process) whose task outlasted the poll.
pub(crate) static HOT_MISSES: AtomicU32 = AtomicU32::new(0);
/// How long a thread waits before looking again at a task another thread is collecting.
pub(crate) const BUSY_NAP: Duration = Duration::from_micros(200);

/// Where a task's outcome is.
pub(crate) enum State {
    /// In the pool, not collected yet.
    Pending(mizu_pool::Task),
    /// A thread is waiting for it, holding the runtime's handle.
    Collecting,
    /// Taken out of the pool (to free its slot), not yet made into Python objects.
    Raw(Result<OutcomeBytes, CollectError>),
    /// The value (`ok`) or the exception.
    Settled {
        ok: bool,
        value: Py<PyAny>,
        cancelled: bool,
    },
}

/// A task's state, shared with its submitter's registry.
pub(crate) struct Cell {
    pub(crate) state: Mutex<State>,
    /// The process that made it (a forked child's copy gives back nothing).
    pub(crate) origin: mizu_pool::Origin,
}

impl Drop for Cell {
    fn drop(&mut self) {
        // An outcome taken out of its slot but never read: the regions its arrays refer to
        // are given back (as the runtime does for outcomes it discards).
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if self.origin.is_here()
            && let State::Raw(Ok(b)) = state
        {
            crate::codec::release_refs(b);
        }
    }
}

impl Cell {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock if nobody holds it: a holder may be waiting (without the GIL) for a while,
    /// and a thread holding the GIL must never block on it.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// The runtime handle taken out of a cell while a thread waits for it; put back unless an
/// outcome was stored (also when the wait is interrupted).
pub(crate) struct Taken<'a> {
    pub(crate) cell: &'a Cell,
    pub(crate) task: Option<mizu_pool::Task>,
}

impl Taken<'_> {
    /// The handle, when the task is pending and nobody holds its lock.
    pub(crate) fn take(cell: &Cell) -> Option<Taken<'_>> {
        let g = cell.try_lock()?;
        matches!(*g, State::Pending(_)).then(|| Taken::from_guard(cell, g))
    }

    /// The handle of a pending task whose lock is held.
    pub(crate) fn from_guard<'a>(cell: &'a Cell, mut g: MutexGuard<'_, State>) -> Taken<'a> {
        let State::Pending(t) = std::mem::replace(&mut *g, State::Collecting) else {
            unreachable!("the caller checked that the task is pending")
        };
        Taken {
            cell,
            task: Some(t),
        }
    }

    pub(crate) fn task(&mut self) -> &mut mizu_pool::Task {
        self.task.as_mut().expect("present until dropped")
    }

    /// Stores the outcome (the handle is spent).
    pub(crate) fn finish(mut self, r: Result<OutcomeBytes, CollectError>) {
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
pub(crate) fn collect(
    task: &mut mizu_pool::Task,
    wait: Duration,
) -> Result<OutcomeBytes, CollectError> {
    with_context(|ctx| match ctx {
        Some(ctx) => ctx.collect(task, Some(wait)).map(OutcomeBytes::from),
        None => task.outcome(Some(wait)),
    })
}
