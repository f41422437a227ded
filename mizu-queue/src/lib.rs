//! Lock-free structures laid out in shared memory: the SPSC ring, the bounded work-stealing
//! deque and the CAS-driven slot state machine, plus their placement in segments.
//!
//! Every structure is generic over where its memory lives: the same code runs across processes
//! on a segment and, under `--cfg mizu_loom`, on the heap inside loom models. Nothing here
//! allocates inside shared memory. See the crate README for invariants and tests.

pub mod deque;
pub mod peer;
pub mod ring;
pub mod slot_state;

#[cfg(not(mizu_loom))]
pub mod duplex;
#[cfg(not(mizu_loom))]
pub mod error;
#[cfg(not(mizu_loom))]
pub mod layout;

pub use deque::{Deque, HeapDeque, Steal};
pub use ring::{Consumer, HeapRing, Producer, Ring, SendError};
pub use slot_state::{SlotState, StateWord, TransitionError, abandon, after_finish, claim_final};

#[cfg(not(mizu_loom))]
pub use {
    duplex::{Duplex, RecvError, SendBlockingError, Side},
    error::QueueError,
};
