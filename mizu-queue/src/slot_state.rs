//! CAS-driven state machine of a task/result slot, with a generation counter so a stale handle
//! can never act on a slot that was freed and reused.
//!
//! ```text
//! Free --submit--> Pending --claim--> Running --finish--> Ok | Err
//!                     |                  `--reaper--> Died
//!                     `--cancel--> Cancelled
//! Ok | Err | Cancelled | Died --collect--> Collected --free--> Free (generation + 1)
//! ```
//! The word packs the state in the low 8 bits and the generation in the high 56, so one CAS
//! checks both.

use mizu_shm::sync::{AtomicU32, AtomicU64, Ordering, fence};

/// States of a slot.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Unused.
    Free = 0,
    /// Submitted, not yet claimed by a worker.
    Pending = 1,
    /// Claimed by a worker.
    Running = 2,
    /// Finished with a result.
    Ok = 3,
    /// Finished with an error.
    Err = 4,
    /// Cancelled before it ran.
    Cancelled = 5,
    /// Its worker died while running it.
    Died = 6,
    /// The outcome was taken by the submitter; the slot awaits `free`.
    Collected = 7,
}

impl SlotState {
    fn from_bits(b: u8) -> Option<Self> {
        use SlotState::*;
        Some(match b {
            0 => Free,
            1 => Pending,
            2 => Running,
            3 => Ok,
            4 => Err,
            5 => Cancelled,
            6 => Died,
            7 => Collected,
            _ => return None,
        })
    }

    /// Whether the task has an outcome a collector can take.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            SlotState::Ok | SlotState::Err | SlotState::Cancelled | SlotState::Died
        )
    }

    /// Whether the machine allows `self -> to` (freeing is [`StateWord::free`]).
    pub fn allows(self, to: SlotState) -> bool {
        use SlotState::*;
        matches!(
            (self, to),
            (Free, Pending)
                | (Pending, Running)
                | (Pending, Cancelled)
                | (Running, Ok)
                | (Running, Err)
                | (Running, Died)
                | (Ok | Err | Cancelled | Died, Collected)
        )
    }
}

/// Why a transition did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionError {
    /// The slot was in another state or generation (someone else won the race).
    Lost {
        /// Generation found.
        generation: u64,
        /// State found (`None` for a corrupted word).
        state: Option<SlotState>,
    },
    /// The requested transition is not part of the machine.
    Illegal {
        /// From.
        from: SlotState,
        /// To.
        to: SlotState,
    },
}

/// A slot's state word in shared memory.
#[repr(transparent)]
#[derive(Debug, Default)]
pub struct StateWord(AtomicU64);

#[cfg(not(mizu_loom))]
// SAFETY: one atomic, zero = (generation 0, Free) is valid.
unsafe impl mizu_shm::ShmSafe for StateWord {}

const GEN_SHIFT: u32 = 8;

fn pack(generation: u64, s: SlotState) -> u64 {
    (generation << GEN_SHIFT) | s as u64
}

impl StateWord {
    /// A free slot at generation 0.
    pub fn new() -> Self {
        StateWord(AtomicU64::new(0))
    }

    /// Current (generation, state); `None` state for a word no valid machine produces.
    pub fn load(&self) -> (u64, Option<SlotState>) {
        let w = self.0.load(Ordering::Acquire);
        (w >> GEN_SHIFT, SlotState::from_bits(w as u8))
    }

    /// [`StateWord::load`] that takes the line for writing: for a caller about to transition
    /// the word, one ownership transfer instead of a shared read followed by an upgrade.
    pub fn load_for_update(&self) -> (u64, Option<SlotState>) {
        let w = self.0.fetch_or(0, Ordering::Acquire);
        (w >> GEN_SHIFT, SlotState::from_bits(w as u8))
    }

    /// `from -> to` at `generation`, atomically; exactly one of several racing callers wins.
    pub fn transition(
        &self,
        generation: u64,
        from: SlotState,
        to: SlotState,
    ) -> Result<(), TransitionError> {
        if !from.allows(to) {
            return Err(TransitionError::Illegal { from, to });
        }
        self.0
            .compare_exchange(
                pack(generation, from),
                pack(generation, to),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| ())
            .map_err(|w| TransitionError::Lost {
                generation: w >> GEN_SHIFT,
                state: SlotState::from_bits(w as u8),
            })
    }

    /// A final state straight to `Free` with the next generation, for the one collector that
    /// takes the outcome (one CAS instead of `Collected` then `free`).
    pub fn collect_and_free(
        &self,
        generation: u64,
        from: SlotState,
    ) -> Result<u64, TransitionError> {
        if !from.is_final() {
            return Err(TransitionError::Illegal {
                from,
                to: SlotState::Free,
            });
        }
        self.to_next_generation(generation, from)
    }

    /// `Collected -> Free` with the next generation; stale handles of the old generation then
    /// fail every transition.
    pub fn free(&self, generation: u64) -> Result<u64, TransitionError> {
        self.to_next_generation(generation, SlotState::Collected)
    }

    /// CAS `(generation, from)` to `(generation + 1, Free)`.
    fn to_next_generation(&self, generation: u64, from: SlotState) -> Result<u64, TransitionError> {
        let next = (generation + 1) & (u64::MAX >> GEN_SHIFT);
        self.0
            .compare_exchange(
                pack(generation, from),
                pack(next, SlotState::Free),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| next)
            .map_err(|w| TransitionError::Lost {
                generation: w >> GEN_SHIFT,
                state: SlotState::from_bits(w as u8),
            })
    }
}

/// The abandon handshake: a submitter that drops its handle while the task may still run,
/// and the worker that finishes it, race to free the slot. Each side publishes its own fact
/// (flag set / state final), fences, then looks at the other's; so at least one of them sees
/// both facts, and the CAS to `Collected` lets exactly one of those proceed. The winner gets
/// the final state it took over and must release the payload and free the slot.
/// (Loom model: `slot_abandon_vs_finish_frees_exactly_once`.)
pub fn abandon(state: &StateWord, abandoned: &AtomicU32, generation: u64) -> Option<SlotState> {
    abandoned.store(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    claim_final(state, generation)
}

/// The worker's half of [`abandon`], called after its transition to a final state.
pub fn after_finish(
    state: &StateWord,
    abandoned: &AtomicU32,
    generation: u64,
) -> Option<SlotState> {
    fence(Ordering::SeqCst);
    if abandoned.load(Ordering::SeqCst) == 1 {
        claim_final(state, generation)
    } else {
        None
    }
}

/// CAS a final state of `generation` to `Collected`; the final state if this caller won.
pub fn claim_final(state: &StateWord, generation: u64) -> Option<SlotState> {
    let (g, st) = state.load();
    let st = st.filter(|s| s.is_final())?;
    (g == generation && state.transition(g, st, SlotState::Collected).is_ok()).then_some(st)
}
