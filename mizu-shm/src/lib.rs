//! Shared-memory foundation of mizu: named segments with validated headers, offset-based
//! typed access, the shared futex parker, process liveness and orphan pruning.
//!
//! This crate knows nothing about tasks or payloads. See the crate README for the invariants.

pub mod line;
pub mod parker;
pub mod sync;

#[cfg(not(mizu_loom))]
pub mod affinity;
#[cfg(not(mizu_loom))]
pub mod error;
#[cfg(not(mizu_loom))]
pub mod header;
#[cfg(not(mizu_loom))]
pub mod liveness;
#[cfg(not(mizu_loom))]
pub mod name;
#[cfg(not(mizu_loom))]
pub mod pid;
#[cfg(not(mizu_loom))]
pub mod prune;
#[cfg(not(mizu_loom))]
pub mod segment;
#[cfg(not(mizu_loom))]
pub mod space;
#[cfg(not(mizu_loom))]
pub mod watch;

pub use line::CacheLine;
pub use parker::ParkWord;

#[cfg(not(mizu_loom))]
pub use {
    error::{HeaderFault, Result, ShmError},
    header::{Extent, SegmentHeader},
    liveness::ProcessId,
    name::SegmentName,
    parker::{WaitError, Waiter},
    pid::current_pid,
    prune::{prune, prune_of},
    segment::{Layout, Segment, ShmSafe},
    watch::DeathWatch,
};
