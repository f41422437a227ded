//! The header at offset 0 of every segment, and its validation.
//!
//! The header is written once by the creator before the name is handed to anyone and never
//! changes afterwards, so openers read it as a plain copy. Everything is checked — with
//! overflow-free arithmetic — before the opener touches a single shared atomic.

use crate::error::HeaderFault;
use crate::liveness::ProcessId;

/// `b"MIZUSEG1"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"MIZUSEG1");
/// Bumped whenever any shared layout changes incompatibly.
pub const ABI_VERSION: u32 = 1;
/// Extents a header can describe.
pub const MAX_EXTENTS: usize = 12;
/// Bytes reserved for the header; the first extent starts at or after this offset.
pub const HEADER_RESERVED: u64 = 256;
/// Every extent starts on a cache line.
pub const EXTENT_ALIGN: u64 = 64;

/// A region of a segment: `len` bytes at byte offset `offset` from the segment base.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extent {
    /// Byte offset from the segment base.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// The segment header, `#[repr(C)]`, at offset 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SegmentHeader {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// `size_of::<SegmentHeader>()`.
    pub header_size: u32,
    /// Size of the whole object in bytes.
    pub total_size: u64,
    /// Which layout lives in the segment (chosen by the crate that lays it out).
    pub kind: u32,
    /// How many entries of `extents` are used.
    pub extent_count: u32,
    /// The creating process.
    pub creator: ProcessId,
    /// The layout's regions, ascending and non-overlapping.
    pub extents: [Extent; MAX_EXTENTS],
    /// FNV-1a over every byte before this field.
    pub checksum: u64,
}

const _: () = assert!(std::mem::size_of::<SegmentHeader>() as u64 <= HEADER_RESERVED);

impl SegmentHeader {
    /// A header for a new segment; computes the checksum.
    pub fn new(kind: u32, total_size: u64, creator: ProcessId, extents: &[Extent]) -> Self {
        let mut e = [Extent::default(); MAX_EXTENTS];
        e[..extents.len()].copy_from_slice(extents);
        let mut h = SegmentHeader {
            magic: MAGIC,
            abi_version: ABI_VERSION,
            header_size: std::mem::size_of::<SegmentHeader>() as u32,
            total_size,
            kind,
            extent_count: extents.len() as u32,
            creator,
            extents: e,
            checksum: 0,
        };
        h.checksum = h.compute_checksum();
        h
    }

    /// FNV-1a 64 over the bytes of every field before `checksum`.
    pub fn compute_checksum(&self) -> u64 {
        let n = std::mem::offset_of!(SegmentHeader, checksum);
        // SAFETY: SegmentHeader is repr(C) made only of integers with no padding before
        // `checksum` (all fields are naturally aligned in order), so its first n bytes are
        // initialised plain bytes.
        let bytes = unsafe { std::slice::from_raw_parts(self as *const Self as *const u8, n) };
        bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    }

    /// The used extents.
    pub fn extents(&self) -> &[Extent] {
        &self.extents[..(self.extent_count as usize).min(MAX_EXTENTS)]
    }

    /// Checks every field against this build and the object's real size.
    pub fn validate(&self, actual_size: u64, expected_kind: u32) -> Result<(), HeaderFault> {
        if self.magic != MAGIC {
            return Err(HeaderFault::Magic {
                found: self.magic,
                expected: MAGIC,
            });
        }
        if self.abi_version != ABI_VERSION {
            return Err(HeaderFault::AbiVersion {
                found: self.abi_version,
                expected: ABI_VERSION,
            });
        }
        let hs = std::mem::size_of::<SegmentHeader>() as u32;
        if self.header_size != hs {
            return Err(HeaderFault::HeaderSize {
                found: self.header_size,
                expected: hs,
            });
        }
        if self.total_size != actual_size {
            return Err(HeaderFault::TotalSize {
                recorded: self.total_size,
                actual: actual_size,
            });
        }
        if self.kind != expected_kind {
            return Err(HeaderFault::Kind {
                found: self.kind,
                expected: expected_kind,
            });
        }
        if self.extent_count as usize > MAX_EXTENTS {
            return Err(HeaderFault::ExtentCount {
                found: self.extent_count,
                max: MAX_EXTENTS as u32,
            });
        }
        let mut prev_end = HEADER_RESERVED;
        for (i, e) in self.extents().iter().enumerate() {
            let bad = |why| HeaderFault::Extent {
                index: i as u32,
                offset: e.offset,
                len: e.len,
                why,
            };
            if !e.offset.is_multiple_of(EXTENT_ALIGN) {
                return Err(bad("not 64-byte aligned"));
            }
            if e.offset < prev_end {
                return Err(bad("overlaps the header or the previous extent"));
            }
            let end = e
                .offset
                .checked_add(e.len)
                .ok_or_else(|| bad("offset + length overflows"))?;
            if end > actual_size {
                return Err(bad("extends past the end of the segment"));
            }
            prev_end = end;
        }
        let computed = self.compute_checksum();
        if computed != self.checksum {
            return Err(HeaderFault::Checksum {
                found: self.checksum,
                computed,
            });
        }
        Ok(())
    }
}
