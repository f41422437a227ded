//! Every way a segment operation can fail, each with a message that names what was asked.

use std::io;

/// What is wrong with a segment header found by [`crate::Segment::open`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderFault {
    /// The first eight bytes are not mizu's magic: not a mizu segment, or overwritten.
    #[error("wrong magic {found:#018x} (expected {expected:#018x}): not a mizu segment")]
    Magic {
        /// What the segment holds.
        found: u64,
        /// What a mizu segment holds.
        expected: u64,
    },
    /// Written by an incompatible build of mizu.
    #[error("ABI version {found}, this build speaks {expected}")]
    AbiVersion {
        /// The segment's version.
        found: u32,
        /// This build's version.
        expected: u32,
    },
    /// The header-size field disagrees with this build's header.
    #[error("header size {found}, expected {expected}")]
    HeaderSize {
        /// The segment's value.
        found: u32,
        /// This build's value.
        expected: u32,
    },
    /// The size recorded at creation is not the size of the object.
    #[error("header says {recorded} bytes but the object is {actual} bytes")]
    TotalSize {
        /// Size the header records.
        recorded: u64,
        /// Size of the shm object.
        actual: u64,
    },
    /// The segment holds another kind of layout than the caller expects.
    #[error("segment holds layout kind {found:#x}, expected {expected:#x}")]
    Kind {
        /// The segment's kind.
        found: u32,
        /// The caller's kind.
        expected: u32,
    },
    /// More extents than a header can hold.
    #[error("extent count {found} exceeds the maximum {max}")]
    ExtentCount {
        /// The segment's count.
        found: u32,
        /// The maximum.
        max: u32,
    },
    /// An extent lies (partly) outside the segment, overlaps another, or is misaligned.
    #[error("extent {index} ({offset}+{len}) is invalid: {why}")]
    Extent {
        /// Which extent.
        index: u32,
        /// Its offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// The checksum over the header does not match: some field was changed after creation.
    #[error("header checksum {found:#018x} does not match its contents ({computed:#018x})")]
    Checksum {
        /// The stored checksum.
        found: u64,
        /// The checksum of the stored fields.
        computed: u64,
    },
}

/// Errors of segment creation, opening and access.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// Where shared memory lives is set wrongly (`MIZU_SHM_DIR`, `MIZU_SHM_PREFIX`,
    /// [`crate::place::configure`]).
    #[error("{0}")]
    Config(String),
    /// The name or join token is not of the form mizu creates.
    #[error("invalid segment name or join token {0:?}: expected /mizu_<pid hex>_<24 hex digits>")]
    InvalidName(String),
    /// No segment by that name exists (its creator may have exited and unlinked it).
    #[error("segment {0} does not exist (its creator may have exited)")]
    NotFound(String),
    /// `/dev/shm` cannot hold the requested size.
    #[error(
        "no room in /dev/shm for segment {name}: asked for {requested} bytes, {available} bytes free \
         (values sent or received through mizu use it until nothing holds them; a container's \
         /dev/shm can be enlarged, e.g. `docker run --shm-size=2g`){unspilled}"
    )]
    NoSpace {
        /// The segment's name.
        name: String,
        /// Bytes asked for.
        requested: u64,
        /// Bytes free on the file system when the request failed.
        available: u64,
        /// Why values cannot spill to files instead, when the spill setting is unusable
        /// (`"; ..."`; empty otherwise).
        unspilled: String,
    },
    /// The spill directory cannot hold a segment `/dev/shm` had no room for either.
    #[error(
        "no room for {requested} bytes in /dev/shm, nor in the spill directory {dir} \
         ({available} bytes free there; MIZU_SPILL_DIR chooses another directory)"
    )]
    SpillFull {
        /// The spill directory.
        dir: String,
        /// Bytes asked for.
        requested: u64,
        /// Bytes free there when the request failed.
        available: u64,
    },
    /// The object is smaller than a header: truncated, or never initialised.
    #[error("segment {name} is {actual} bytes, too small for its {needed}-byte header")]
    Truncated {
        /// The segment's name.
        name: String,
        /// Its size.
        actual: u64,
        /// The minimum size.
        needed: u64,
    },
    /// The header failed validation; no shared atomic was touched.
    #[error("segment {name} has a bad header: {fault}")]
    BadHeader {
        /// The segment's name.
        name: String,
        /// What is wrong.
        fault: HeaderFault,
    },
    /// A layout request that cannot be satisfied (too many extents, bad alignment, overflow).
    #[error("invalid layout: {0}")]
    InvalidLayout(String),
    /// A typed or byte access outside the segment or at a misaligned offset.
    #[error("access at {offset}+{len} ({why}) in segment {name} of {size} bytes")]
    BadAccess {
        /// The segment's name.
        name: String,
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// The segment's size.
        size: u64,
        /// "out of bounds" or "misaligned".
        why: &'static str,
    },
    /// An operating-system call failed.
    #[error("{op} failed for {what}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// What it was applied to.
        what: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl ShmError {
    pub(crate) fn io(op: &'static str, what: impl Into<String>, e: impl Into<io::Error>) -> Self {
        ShmError::Io {
            op,
            what: what.into(),
            source: e.into(),
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = ShmError> = std::result::Result<T, E>;
