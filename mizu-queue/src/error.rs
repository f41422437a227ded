//! Errors of segment-backed queue structures.

use mizu_shm::ShmError;

/// Why attaching to, or waiting on, a shared queue failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The segment could not be created, opened or accessed.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// The segment's queue layout is inconsistent (corrupted or not what was expected).
    #[error("invalid queue layout in segment {segment}: {why}")]
    Layout {
        /// The segment's name.
        segment: String,
        /// What is wrong.
        why: String,
    },
    /// The peer process is gone (sticky: it does not come back).
    #[error("peer process {pid} is gone")]
    PeerGone {
        /// The peer's PID.
        pid: u32,
    },
    /// The peer did not show up or answer within the timeout.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
}
