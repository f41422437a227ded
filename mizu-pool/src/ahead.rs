//! How the caller of a map waits for its tasks: not for each, but ahead — the one policy both
//! bindings use for `Pool.map`, `imap`, `imap_unordered`, `PoolExecutor.map`, R's
//! `mizu_map()` and `mizu_collect_all()`.
//!
//! On a machine whose every CPU runs a worker, each time the caller is woken it takes a
//! worker's CPU for a context switch and a look; woken once per chunk, the caller of an R map
//! of 8 000 elements of 5 µs was woken ~15 times and the map lost several points of
//! efficiency. Waiting until the task halfway along the rest is final wakes the caller about
//! log₂(n) times; a caller that hands each result on as it comes (an iterator, a progress
//! bar) waits so only for a short while ([`PATIENCE`]), then for the next task (or any, for
//! one that takes them in the order they finish).

use std::time::{Duration, Instant};

use mizu_queue::SlotState;

use crate::collect::{park_slice, wait_until};
use crate::submitter::Task;

/// How late a streaming caller may hand on a result that is ready, to wake less often: a
/// map shorter than this wakes its caller about log₂(n) times; in a longer one a result
/// waits at most this long (a progress display refreshes about as often).
pub const PATIENCE: Duration = Duration::from_millis(100);

/// The wait of a caller that collects `tasks` in order and needs every result (a map that
/// returns a list), before it collects `tasks[0]`: waits until the task halfway along them is
/// final, or one before it failed, or `timeout` passes (false). Collecting in order then finds
/// the first half final, and the tasks after it keep the workers busy meanwhile; doing so
/// again for the rest, the caller is woken about log2(n) times rather than once per task.
/// (The tasks of one submitter: another's failure is seen when the halfway one is final.)
/// Returns at once on a worker's own task thread, whose collects run other tasks while they
/// wait. [`Ahead`] is the whole wait, in slices, and knows when not to wait at all.
pub fn wait_ahead(tasks: &[&Task], timeout: Option<Duration>) -> bool {
    let half = tasks.len() / 2;
    let Some(mid) = tasks.get(half) else {
        return true;
    };
    if mid.done || crate::context::with_current_task(|c| c.is_some()) {
        return true;
    }
    let before = &tasks[..half];
    let failed = || {
        before.iter().any(|t| {
            !t.done
                && matches!(
                    t.core.state(t.id),
                    Some(SlotState::Err | SlotState::Cancelled | SlotState::Died)
                )
        })
    };
    let core = &mid.core;
    let id = mid.id;
    let hdr = core.shared.view().task(id.submitter, id.slot);
    let poll = || {
        let (g, st) = hdr.state.load();
        (g != id.generation || st.is_some_and(|s| s.is_final()) || failed())
            .then_some(Ok(SlotState::Ok))
    };
    if poll().is_some() {
        return true;
    }
    let mut w = core.waiter(park_slice());
    let r = core.wait_outcome(&mut w, id.slot, timeout, &mut || false, poll);
    core.learn(&w);
    r.is_ok()
}

/// One wait of a caller for the next task it collects, made of slices (between which a
/// binding checks for Ctrl-C): [`wait_ahead`] for a caller that needs every result, bounded
/// by [`PATIENCE`] for one that streams them.
/// (Not `Copy`: a copy would forget that the wait has started.)
#[derive(Debug, Clone)]
pub struct Ahead {
    since: Instant,
    stream: bool,
    any_order: bool,
    looked: bool,
}

impl Ahead {
    /// A wait that starts now, of a caller that collects its tasks in order. `stream`: it
    /// hands each result on as it comes.
    pub fn new(stream: bool) -> Self {
        Ahead {
            since: Instant::now(),
            stream,
            any_order: false,
            looked: false,
        }
    }

    /// A wait that starts now, of a caller that streams its tasks' results in the order they
    /// finish (`imap_unordered`): as [`Ahead::new`] streaming, then, its patience spent, for
    /// any of them. Tasks run about in the order they were submitted, so once the one halfway
    /// along is final most of those before it are too.
    pub fn any_order() -> Self {
        Ahead {
            any_order: true,
            ..Ahead::new(true)
        }
    }

    /// Waits at most `slice` (None: no bound) for `tasks[0]` — the next task the caller
    /// collects, then the rest in order — to be worth collecting: true when it is final as
    /// the wait starts (collecting it will not wait, and waiting would only delay the results
    /// at hand), or a task ahead of it is final or failed (see [`wait_ahead`]), or, streaming,
    /// once [`PATIENCE`] has passed since [`Ahead::new`] and it is final; false when `slice`
    /// passed first. Called again for the next slice of the same wait, it goes on waiting
    /// ahead even though `tasks[0]` is final by then.
    pub fn wait(&mut self, tasks: &[&Task], slice: Option<Duration>) -> bool {
        let Some(next) = tasks.first() else {
            return true;
        };
        let final_ = |t: &&Task| t.done || t.is_done();
        if !std::mem::replace(&mut self.looked, true)
            && (final_(next) || self.any_order && tasks.iter().any(final_))
        {
            return true;
        }
        if !self.stream {
            return wait_ahead(tasks, slice);
        }
        let left = PATIENCE.saturating_sub(self.since.elapsed());
        if left.is_zero() {
            return self.wait_next(tasks, slice);
        }
        let bound = slice.map_or(left, |s| s.min(left));
        if wait_ahead(tasks, Some(bound)) {
            return true;
        }
        match slice {
            Some(s) if s <= left => false,
            // Patience ran out inside this slice: the rest of it as spent patience waits.
            _ => self.wait_next(tasks, slice.map(|s| s.saturating_sub(left))),
        }
    }

    /// The wait once patience is spent: for the next task, or (any order) for any of them.
    fn wait_next(&self, tasks: &[&Task], slice: Option<Duration>) -> bool {
        if !self.any_order {
            return wait_ahead(&tasks[..1], slice);
        }
        wait_until(tasks[0], slice, || {
            tasks.iter().any(|t| t.done || t.is_done()).then_some(())
        })
        .is_some()
    }
}
