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

use crate::records::{TaskHdr, WorkerRec, WorkerSlot};

/// Claims the task that ring word `word` names (its low 32 bits are the generation's) for the
/// worker whose record is `rec`; returns the task's full generation, or `None` when the task
/// is not (or no longer) `Pending`. `started_ns`, when the pool times tasks, is written before
/// the record that publishes it: the timeout monitor reads the record first, and a stale start
/// time beside a new record would look like a task over its time.
pub fn claim(rec: &WorkerRec, hdr: &TaskHdr, word: u64, started_ns: Option<u64>) -> Option<u64> {
    let g32 = word as u32;
    if let Some(t) = started_ns {
        rec.started_ns.store(t, Ordering::Relaxed);
    }
    // The claim CAS releases the record to whoever reads the state it writes.
    rec.current.store(word, Ordering::Release);
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
                rec.current.store(0, Ordering::Release);
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

/// Ends a claimed task as `Ok` or `Err` (its output already written) and clears the record.
pub fn finish(rec: &WorkerRec, hdr: &TaskHdr, generation: u64, ok: bool) {
    let _ = hdr.state.transition(
        generation,
        SlotState::Running,
        if ok { SlotState::Ok } else { SlotState::Err },
    );
    rec.current.store(0, Ordering::Release);
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
        if !contested {
            return Some(g);
        }
        pause();
    }
}
