//! Stealing: an idle worker takes tasks queued for another — from its deque (nested tasks), or
//! by walking a submitter's task slots for `Pending` ones (tasks in another worker's ring,
//! which needs no cooperation from that worker, dead or alive) — and the hints that say when
//! a walk of the slots is worth it.

use std::sync::atomic::Ordering;

use mizu_queue::{SlotState, Steal};

use super::Runtime;
use crate::layout::TaskId;

impl Runtime<'_> {
    /// Steals a task from another worker's deque (oldest first) and runs it.
    pub(super) fn steal_nested(&self) -> bool {
        let n = self.deques.len();
        let start = self.next_deque.get();
        for i in 0..n {
            let w = (start + i) % n;
            if w == self.slot {
                continue;
            }
            loop {
                match self.deques[w].get().steal() {
                    Steal::Empty => break,
                    Steal::Retry => std::hint::spin_loop(),
                    Steal::Success(word) => {
                        if self.try_run(word) {
                            self.next_deque.set(w);
                            self.shared
                                .view()
                                .worker(self.slot)
                                .rec
                                .steals
                                .fetch_add(1, Ordering::Relaxed);
                            return true;
                        }
                        // A stale id (its task ran or was cancelled): look at the next.
                    }
                }
            }
        }
        false
    }

    /// Whether a deque (ours or another worker's) holds task ids.
    pub(super) fn nested_queued(&self) -> bool {
        self.deques.iter().any(|d| !d.get().is_empty())
    }

    /// Steals from another worker's deque, else runs a `Pending` task found by scanning every
    /// submitter's slots (work stealing that needs no cooperation from the worker it was
    /// queued for, dead or alive).
    pub(super) fn steal(&self) -> bool {
        self.steal_nested() || self.scan()
    }

    /// Whether submitter `s` may have a task no worker has claimed: a hint only (abandoned
    /// tasks are never counted as collected, and a finished task not yet collected counts as
    /// outstanding), read from its record and the workers' claim records, a few lines in all.
    fn may_have_unclaimed(&self, s: usize) -> bool {
        let v = self.shared.view();
        let rec = &v.submitter(s).rec;
        if !rec.is_held() {
            return false;
        }
        let outstanding = rec
            .submitted
            .load(Ordering::Relaxed)
            .wrapping_sub(rec.collected.load(Ordering::Relaxed));
        let claimed = v
            .workers()
            .iter()
            .filter(|w| {
                TaskId::unpack(w.rec.current.load(Ordering::Relaxed))
                    .is_some_and(|(by, _, _)| by == s)
            })
            .count() as u64;
        outstanding > claimed
    }

    /// Whether a submitter that sleeps waiting for outcomes may have a task no worker has
    /// claimed (see [`Runtime::may_have_unclaimed`]): the end of a map, its last chunks queued
    /// behind a busy worker. A submitter still submitting is left alone: then every CPU is
    /// taken, and a walk of its slots would take one from it.
    pub(super) fn awaited_unclaimed(&self) -> bool {
        let v = self.shared.view();
        (0..v.params.submitters as usize)
            .any(|s| v.submitter(s).sleepers() > 0 && self.may_have_unclaimed(s))
    }

    /// See [`Runtime::steal`]. Tasks queued for this worker are left to its queues, which hand
    /// them out in the order they were submitted: slots are taken in no particular order, so
    /// a walk would run them out of order (a one-worker pool runs its tasks in order).
    fn scan(&self) -> bool {
        if self.any_queued() {
            return false;
        }
        let v = self.shared.view();
        for s in 0..v.params.submitters as usize {
            // Skip submitters with nothing outstanding, or whose every outstanding task a
            // worker has claimed (the common case of an idle worker beside a long task:
            // walking every slot header, each its own cache line, would take it a CPU for
            // hundreds of microseconds every idle slice). A task missed on a stale read is
            // found by a later slice's scan.
            if !self.may_have_unclaimed(s) {
                continue;
            }
            let n = v.slots_of(s);
            let from = self.scan_from.borrow().get(s).copied().unwrap_or(0);
            for i in 0..n {
                // Work of our own comes first: a walk of thousands of slot headers must not
                // hold up a task that arrived in our ring meanwhile.
                if i % 64 == 63 && self.any_queued() {
                    return false;
                }
                let k = (from + i) % n;
                let (g, st) = v.task(s, k).state.load();
                if st == Some(SlotState::Pending) {
                    // A batch being staged is queued when it is published (then ours is
                    // taken from our queue): only another worker's share of it, once it is
                    // published, is for the taking.
                    if v.submitter(s).rec.staging.load(Ordering::Acquire) != 0 {
                        break;
                    }
                    if self.any_queued() {
                        return false;
                    }
                    if let Some(c) = self.scan_from.borrow_mut().get_mut(s) {
                        *c = k + 1;
                    }
                    let id = TaskId {
                        submitter: s,
                        slot: k,
                        generation: g,
                    };
                    if self.try_run(id.pack()) {
                        v.worker(self.slot)
                            .rec
                            .steals
                            .fetch_add(1, Ordering::Relaxed);
                        return true;
                    }
                }
            }
        }
        false
    }
}
