//! The tasks of one submitter, listed weakly: when every task slot holds an uncollected task,
//! submission takes the finished outcomes out of their slots into their cells
//! ([`Registry::drain`]) instead of failing; and what the calls of one chunk of a batch share.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::Duration;

use pyo3::prelude::*;

use mizu_pool::CollectError;

use crate::cell::{BUSY_NAP, Cell, SLICE, State, Taken, collect};

/// The tasks of one submitter (a pool, or the nested submissions of a worker), held weakly.
#[derive(Default)]
pub(crate) struct Registry {
    live: Mutex<Live>,
}

/// A registry's list, and how long it was after its last pruning.
#[derive(Default)]
struct Live {
    cells: Vec<Weak<Cell>>,
    kept: usize,
}

/// The nested submissions of this process (inside a worker).
pub(crate) static NESTED: LazyLock<Registry> = LazyLock::new(Registry::default);

impl Registry {
    pub(crate) fn track(&self, cell: &Arc<Cell>) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.cells.push(Arc::downgrade(cell));
        // Forget dropped tasks once the list has doubled since it was last pruned: each entry
        // is looked at about once per push, by a read of its count alone (finished tasks still
        // held go at the next drain).
        if live.cells.len() >= 256 && live.cells.len() >= 2 * live.kept {
            live.cells.retain(|w| w.strong_count() > 0);
            live.kept = live.cells.len();
        }
    }

    /// Every task slot is taken: moves finished outcomes out of their slots into their tasks,
    /// or waits (one slice at most) for some to finish, as the runtime's rule says
    /// (`mizu_pool::retry::drain`). Call with the GIL released.
    pub(crate) fn drain(&self) {
        let cells: Vec<Arc<Cell>> = {
            let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            // (Here finished tasks are forgotten too: only pending ones can give room.)
            live.cells.retain(|w| {
                w.upgrade().is_some_and(|c| {
                    c.try_lock()
                        .is_none_or(|g| matches!(*g, State::Pending(_) | State::Collecting))
                })
            });
            live.kept = live.cells.len();
            live.cells.iter().filter_map(Weak::upgrade).collect()
        };
        let settle = |c: &Arc<Cell>| {
            let Some(mut t) = Taken::take(c) else {
                return false;
            };
            if !t.task().is_done() {
                return false;
            }
            let r = t.task().outcome(Some(Duration::ZERO));
            t.finish(r);
            true
        };
        let pending = |c: &Arc<Cell>| {
            c.try_lock()
                .is_some_and(|g| matches!(*g, State::Pending(_)))
        };
        let mut waited = false;
        let freed = mizu_pool::retry::drain(&cells, settle, pending, |c| {
            // (Unless another thread is collecting it meanwhile.)
            if let Some(mut t) = Taken::take(c) {
                waited = true;
                match collect(t.task(), SLICE) {
                    Err(CollectError::Timeout) => drop(t),
                    r => t.finish(r),
                }
            }
        });
        // Nothing to wait for here (every task is another thread's to collect, or the slots
        // are held by dropped tasks, which free theirs as they finish): look again shortly.
        if !freed && !waited {
            std::thread::sleep(BUSY_NAP);
        }
    }
}

/// A chunk's function and its calls' argument tuples.
type ChunkCalls = (Py<PyAny>, Vec<Py<PyAny>>);

/// What the tasks of one chunk of a batch share (`Pool.submit_batch`): the chunk is one task
/// of the pool, which runs their calls one after another in one worker, and its value is the
/// list of their outcomes. The tasks share its [`Cell`], so waiting, draining and `wait_any`
/// treat the chunk as the one task it is.
pub(crate) struct Chunk {
    /// The function and the calls' argument tuples, kept until a member's outcome is read:
    /// members cancelled while the chunk is queued are left out of a new chunk of the others.
    pub(crate) calls: Mutex<Option<ChunkCalls>>,
    /// Which members were cancelled.
    pub(crate) cancelled: Mutex<Vec<bool>>,
    /// Whether any member was (read without the lock on every outcome).
    pub(crate) any_cancelled: AtomicBool,
    /// The outcomes of failed calls, made once (each task raises the same exception object
    /// every time, as a task of its own does).
    pub(crate) failed: Mutex<Vec<(usize, Py<PyAny>)>>,
}

impl Chunk {
    pub(crate) fn failures(&self) -> MutexGuard<'_, Vec<(usize, Py<PyAny>)>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_cancelled(&self, i: usize) -> bool {
        self.any_cancelled.load(Ordering::Acquire)
            && self.cancelled.lock().unwrap_or_else(|p| p.into_inner())[i]
    }
}
