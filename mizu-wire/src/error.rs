//! Errors of encoding, decoding and payload storage. Every decoder failure names what was
//! wrong and where, so bad bytes from another process are diagnosable.

use mizu_shm::ShmError;

/// Why a value, a frame or a region could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input ended before the structure it announced.
    #[error(
        "truncated input: {what} needs {needed} bytes at offset {offset}, {available} available"
    )]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where.
        offset: usize,
        /// Bytes needed.
        needed: usize,
        /// Bytes left.
        available: usize,
    },
    /// An unknown tag, kind, magic or version, or an inconsistent field.
    #[error("malformed input at offset {offset}: {why}")]
    Malformed {
        /// Where.
        offset: usize,
        /// What is wrong.
        why: String,
    },
    /// Nesting deeper than the format allows.
    #[error("nesting deeper than {max} levels at offset {offset}")]
    TooDeep {
        /// Where.
        offset: usize,
        /// The cap.
        max: usize,
    },
    /// A value the format cannot carry (too large, unsupported Arrow type, ...).
    #[error("cannot encode: {0}")]
    Unsupported(String),
    /// Arrow IPC encoding or decoding failed.
    #[error("arrow IPC: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// A region descriptor does not name a live region of a valid data segment.
    #[error("bad region reference {name}+{offset} (len {len}): {why}")]
    BadRegion {
        /// Segment name as received.
        name: String,
        /// Offset as received.
        offset: u64,
        /// Length as received.
        len: u64,
        /// What is wrong.
        why: String,
    },
    /// Shared memory failed (no space, segment gone, ...).
    #[error(transparent)]
    Shm(#[from] ShmError),
}

impl WireError {
    /// `/dev/shm` had no room for a new data segment (after this process gave back what it kept
    /// only for reuse).
    pub fn is_no_space(&self) -> bool {
        matches!(self, WireError::Shm(ShmError::NoSpace { .. }))
    }
}

/// Result alias for this crate.
pub type Result<T, E = WireError> = std::result::Result<T, E>;

pub(crate) fn malformed(offset: usize, why: impl Into<String>) -> WireError {
    WireError::Malformed {
        offset,
        why: why.into(),
    }
}
