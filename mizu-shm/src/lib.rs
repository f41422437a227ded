//! Shared-memory foundation of mizu: named segments with validated headers, offset-based
//! typed access, the shared futex parker, process liveness and orphan pruning.
//!
//! This crate knows nothing about tasks or payloads. See the crate README for the invariants.
//!
//! # Example
//!
//! A segment holding one counter, created by one handle and opened by token through another
//! (another process would do exactly the same with the token; see `examples/counter.rs`):
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use mizu_shm::{CacheLine, Layout, Segment};
//!
//! const KIND: u32 = u32::from_le_bytes(*b"DOC1");
//! let mut layout = Layout::new(KIND);
//! let at = layout.add(std::mem::size_of::<CacheLine<AtomicU64>>() as u64, 128)?;
//! let owner = Segment::create(&layout, false)?;
//! let other = Segment::open(owner.token(), KIND)?;
//! let a: &CacheLine<AtomicU64> = owner.get(owner.extent(at)?.offset)?;
//! let b: &CacheLine<AtomicU64> = other.get(other.extent(at)?.offset)?;
//! a.fetch_add(2, Ordering::Release);
//! assert_eq!(b.load(Ordering::Acquire), 2);
//! # Ok::<(), mizu_shm::ShmError>(())
//! ```

pub mod line;
pub mod parker;
pub mod sync;

#[cfg(not(mizu_loom))]
pub mod affinity;
#[cfg(not(mizu_loom))]
pub mod error;
#[cfg(all(not(mizu_loom), feature = "test-helpers"))]
pub mod fuzzing;
#[cfg(not(mizu_loom))]
pub mod header;
#[cfg(not(mizu_loom))]
pub mod liveness;
#[cfg(not(mizu_loom))]
pub mod name;
#[cfg(not(mizu_loom))]
pub mod pid;
#[cfg(not(mizu_loom))]
pub mod place;
#[cfg(not(mizu_loom))]
pub mod prune;
#[cfg(not(mizu_loom))]
pub mod segment;
#[cfg(not(mizu_loom))]
pub mod space;
#[cfg(not(mizu_loom))]
pub mod watch;

pub use line::CacheLine;
pub use parker::{AimedPark, ParkWord};

#[cfg(not(mizu_loom))]
pub use {
    error::{HeaderFault, Result, ShmError},
    header::{Extent, SegmentHeader},
    liveness::ProcessId,
    name::SegmentName,
    parker::{WaitError, Waiter},
    pid::{current_pid, pid_runs},
    prune::{prune, prune_of},
    segment::{Layout, Segment, ShmSafe},
    watch::{DeathWatch, LOOK_EVERY},
};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
