//! The crash-safe task claim: how a worker takes a `Pending` task, finishes it, and how the
//! reaper of a dead worker tells which task died with it. Segment-free, so the loom model
//! `claim_record_lets_the_reaper_fail_exactly_what_died` runs this very code.
//!
//! A worker writes its claim record (`WorkerRec::current`) *before* the claim CAS, then the
//! runner field after it. Killed between any two of those steps, its record and the task's
//! runner field together tell the reaper whether the task is its own (fail it as died) or
//! another worker's (leave it).

use mizu_queue::{SlotState, TransitionError};
use mizu_shm::sync::Ordering;

use crate::records::{TaskHdr, WorkerRec, WorkerSlot, reason};

/// Claims the task that ring word `word` names (its low 32 bits are the generation's) for the
/// worker whose record is `rec`; returns the task's full generation, or `None` when the task
/// is not (or no longer) `Pending`. Its two steps, [`announce`] and [`take`], are public so
/// that the models can kill a worker between them.
///
/// `outer` is the claim record to put back when this claim fails or its task finishes: the
/// word of the task this worker runs and helps others from while its nested collect waits
/// (0 when none). A nested claim keeps the outer task's start time, so the outer task's
/// execution timeout goes on counting while the worker helps.
pub fn claim(
    rec: &WorkerRec,
    hdr: &TaskHdr,
    word: u64,
    started_ns: Option<u64>,
    outer: u64,
) -> Option<u64> {
    announce(rec, word, started_ns, outer);
    take(rec, hdr, word, outer)
}

/// The first step of [`claim`]: the claim record. `started_ns`, when the pool times tasks, is
/// written before the record that publishes it: the timeout monitor reads the record first,
/// and a stale start time beside a new record would look like a task over its time.
pub fn announce(rec: &WorkerRec, word: u64, started_ns: Option<u64>, outer: u64) {
    if let Some(t) = started_ns.filter(|_| outer == 0) {
        rec.started_ns.store(t, Ordering::Relaxed);
    }
    // The claim CAS releases the record to whoever reads the state it writes.
    rec.current.store(word, Ordering::Release);
}

/// The second step of [`claim`]: the claim CAS.
pub fn take(rec: &WorkerRec, hdr: &TaskHdr, word: u64, outer: u64) -> Option<u64> {
    let g32 = word as u32;
    // One CAS, without reading the state first: the collector polls that line, and every
    // access of ours between two of its reads is another transfer of it. A higher generation
    // with the same low bits costs one more try.
    let mut g = u64::from(g32);
    loop {
        match hdr
            .state
            .transition(g, SlotState::Pending, SlotState::Running)
        {
            Ok(()) => return Some(g),
            Err(TransitionError::Lost {
                generation,
                state: Some(SlotState::Pending),
            }) if generation != g && generation as u32 == g32 => g = generation,
            Err(_) => {
                rec.current.store(outer, Ordering::Release);
                return None;
            }
        }
    }
}

/// After a successful [`claim`]: names the runner (`slot << 32 | pid`) in the task header.
/// Until this is set, the reaper tells the claim apart by the workers' records.
pub fn set_runner(hdr: &TaskHdr, runner: u64) {
    hdr.runner.store(runner, Ordering::Release);
}

/// Ends a claimed task as `Ok` or `Err` (its output already written) and puts the record
/// back to `outer` (see [`claim`]).
pub fn finish(rec: &WorkerRec, hdr: &TaskHdr, generation: u64, ok: bool, outer: u64) {
    let _ = hdr.state.transition(
        generation,
        SlotState::Running,
        if ok { SlotState::Ok } else { SlotState::Err },
    );
    rec.current.store(outer, Ordering::Release);
}

/// The reaper's verdict on the task the dead worker `dead` (runner value `runner`) names in
/// its claim record, `word`: `Some(generation)` when the task
/// is `Running` on the dead worker's claim (the caller fails it), `None` when it is not.
///
/// The record is written before the claim CAS, so the task may have been claimed by another
/// worker after this one died. The runner field tells, once set; until then the claimer is
/// whichever worker's record names the task: if a live one's does (it claims, or it failed
/// to and is about to clear its record), look again after `pause`.
pub fn dead_claim(
    workers: &[WorkerSlot],
    dead: usize,
    runner: u64,
    hdr: &TaskHdr,
    word: u64,
    alive: impl Fn(&WorkerRec) -> bool,
    mut pause: impl FnMut(),
) -> Option<u64> {
    let g32 = word as u32;
    loop {
        let (g, st) = hdr.state.load();
        if st != Some(SlotState::Running) || g as u32 != g32 {
            return None;
        }
        let r = hdr.runner.load(Ordering::Acquire);
        if r == runner {
            return Some(g);
        }
        if r != 0 {
            return None;
        }
        let contested = workers.iter().enumerate().any(|(w, o)| {
            w != dead && o.rec.current.load(Ordering::SeqCst) == word && alive(&o.rec)
        });
        // The verdict holds only for the task the scan was about: another worker may have
        // claimed it before the scan and finished it since, and the slot gone to a new task.
        if !contested && hdr.state.load() == (g, Some(SlotState::Running)) {
            return Some(g);
        }
        pause();
    }
}

/// Fails the `Running` task of generation `generation` as `Died` with reason `why`, for the
/// reaper of the dead worker whose runner value is `runner`; whether it did.
///
/// Only on a task that is the dead worker's now: [`dead_claim`]'s verdict (which saw the slot
/// still holding that task `Running` after its look at the records), or a task `Running` with
/// the dead worker as its runner (the runner field is cleared when a slot takes a new task).
/// Only the claimer moves a `Running` task on, and it is dead: so the runner and reason, which
/// whoever sees `Died` reads, are written before the transition into no other task's slot.
pub fn fail_dead(hdr: &TaskHdr, generation: u64, runner: u64, why: u32) -> bool {
    hdr.runner.store(runner, Ordering::Relaxed);
    hdr.reason.store(why, Ordering::Relaxed);
    hdr.state
        .transition(generation, SlotState::Running, SlotState::Died)
        .is_ok()
}

/// The reaper's part for the dead worker `dead` (runner value `runner`): fails with `why` the
/// task its claim record names when the verdict ([`dead_claim`]) says it died with it, then
/// every other task `Running` with it as runner (those it ran while helping inside a nested
/// collect), each through [`fail_dead`]. `named` finds the task a record word names, `tasks`
/// are all the pool's tasks; `failed(id, generation)` is called for each task failed.
#[allow(clippy::too_many_arguments)]
pub fn reap<'t, I>(
    workers: &[WorkerSlot],
    dead: usize,
    runner: u64,
    why: u32,
    named: impl FnOnce(u64) -> Option<(I, &'t TaskHdr)>,
    tasks: impl IntoIterator<Item = (I, &'t TaskHdr)>,
    alive: impl Fn(&WorkerRec) -> bool,
    pause: impl FnMut(),
    mut failed: impl FnMut(I, u64),
) {
    let word = workers[dead].rec.current.load(Ordering::SeqCst);
    if let Some((id, hdr)) = named(word)
        && let Some(g) = dead_claim(workers, dead, runner, hdr, word, &alive, pause)
        && fail_dead(hdr, g, runner, why)
    {
        failed(id, g);
    }
    for (id, hdr) in tasks {
        let (g, st) = hdr.state.load();
        if st == Some(SlotState::Running)
            && hdr.runner.load(Ordering::Relaxed) == runner
            && fail_dead(hdr, g, runner, why)
        {
            failed(id, g);
        }
    }
}

/// Cancels the `Pending` task of generation `generation` before any worker claims it; whether
/// it did (then it never runs).
pub fn cancel(hdr: &TaskHdr, generation: u64) -> bool {
    hdr.state
        .transition(generation, SlotState::Pending, SlotState::Cancelled)
        .is_ok()
}

/// [`cancel`] for a stopping pool: the task is labelled `STOPPED` (its collector reports the
/// pool's stop, not a cancellation). The label is written before the transition that
/// publishes it, and is for this task only: if a worker claimed it meanwhile (or the slot went
/// on to another task), it is taken back.
pub fn stop_pending(hdr: &TaskHdr, generation: u64) -> bool {
    hdr.reason.store(reason::STOPPED, Ordering::Relaxed);
    if cancel(hdr, generation) {
        return true;
    }
    let _ = hdr
        .reason
        .compare_exchange(reason::STOPPED, 0, Ordering::AcqRel, Ordering::Relaxed);
    false
}

/// The start time of the task the worker whose record is `rec` runs, if it runs one: what the
/// timeout monitor measures. While the worker helps with other tasks inside a nested collect,
/// it is the outer task's (see [`claim`]).
pub fn running_since(rec: &WorkerRec) -> Option<u64> {
    (rec.current.load(Ordering::Acquire) != 0).then(|| rec.started_ns.load(Ordering::Relaxed))
}
