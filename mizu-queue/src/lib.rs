//! Lock-free structures laid out in shared memory: the SPSC ring, the bounded work-stealing
//! deque and the CAS-driven slot state machine, plus their placement in segments.
//!
//! Every structure is generic over where its memory lives: the same code runs across processes
//! on a segment and, under `--cfg mizu_loom`, on the heap inside loom models. Nothing here
//! allocates inside shared memory. See the crate README for invariants and tests.
//!
//! # Example
//!
//! A ring on the heap, split into its two ends (in shared memory, `layout::init_ring` and
//! `layout::attach_ring` place it in a segment; see `examples/ring_between_processes.rs`):
//!
//! ```
//! let mut heap = mizu_queue::HeapRing::new(8, 64);
//! let (mut tx, mut rx) = heap.split();
//! tx.try_send(b"hello").unwrap();
//! assert_eq!(rx.try_recv_with(|m| m.to_vec()), Some(b"hello".to_vec()));
//! ```

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
#[cfg(not(mizu_loom))]
pub mod owned;

pub use deque::{Deque, HeapDeque, Steal};
pub use ring::{Consumer, HeapRing, Producer, Ring, SendError};
pub use slot_state::{SlotState, StateWord, TransitionError, abandon, after_finish, claim_final};

#[cfg(not(mizu_loom))]
pub use {
    duplex::{Duplex, RecvError, SendBlockingError, Side},
    error::QueueError,
    owned::{OwnedConsumer, OwnedDeque, OwnedProducer},
};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
