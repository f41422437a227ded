//! The atomic protocol of a ledger (see `ledger.rs`): entries set by the holder of a reference
//! and cleared by whoever gives it back, and the claim two reapers race for.
//!
//! Apart from the segment code so that the loom models (`tests/loom.rs`) run the same
//! functions: an entry is given back by exactly one of its holder and the reapers, and what
//! a reaper reads of an entry it cleared is what the holder wrote.

use mizu_shm::sync::{AtomicU32, AtomicU64, Ordering};

/// Words of a data segment's name in an entry (NUL-padded, at most 40 bytes as in a
/// descriptor).
pub const NAME_WORDS: usize = 5;

/// A ledger's header.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Header {
    /// Set by the reaper that gives the entries back.
    claimed: AtomicU32,
    _pad: u32,
}

impl Header {
    /// True for exactly one of the reapers of a dead process's ledger: the one to give its
    /// entries back.
    pub fn claim(&self) -> bool {
        self.claimed
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// One recorded reference (64 bytes).
#[repr(C)]
#[derive(Debug, Default)]
pub struct Entry {
    /// 1 while the reference is held and not given back.
    used: AtomicU64,
    offset: AtomicU64,
    generation: AtomicU64,
    name: [AtomicU64; NAME_WORDS],
}

/// What an entry lists: the data segment's name, the region's offset and generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The data segment's name (`None` if the entry's bytes are not a name).
    pub name: Option<String>,
    /// Offset of the region's payload in the segment.
    pub offset: u64,
    /// The region's generation.
    pub generation: u64,
}

impl Entry {
    /// Lists a reference just adopted (the holder, on an entry of its own that is not in use).
    /// The fields are written before `used` is set with release ordering, so a reaper that
    /// clears the entry reads them whole.
    pub fn set(&self, name: &str, offset: u64, generation: u64) {
        let mut raw = [0u8; NAME_WORDS * 8];
        let n = name.len().min(raw.len());
        raw[..n].copy_from_slice(&name.as_bytes()[..n]);
        for (w, c) in self.name.iter().zip(raw.chunks_exact(8)) {
            w.store(
                u64::from_le_bytes(c.try_into().expect("8 bytes")),
                Ordering::Relaxed,
            );
        }
        self.offset.store(offset, Ordering::Relaxed);
        self.generation.store(generation, Ordering::Relaxed);
        self.used.store(1, Ordering::Release);
    }

    /// Clears the entry before its reference is given back: true for exactly one caller (the
    /// holder or a reaper), the one that gives it back.
    pub fn take(&self) -> bool {
        self.used.load(Ordering::Acquire) == 1
            && self
                .used
                .compare_exchange(1, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// What the entry lists; read after a successful [`Entry::take`].
    pub fn listed(&self) -> Listed {
        let mut raw = [0u8; NAME_WORDS * 8];
        for (w, c) in self.name.iter().zip(raw.chunks_exact_mut(8)) {
            c.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        Listed {
            name: std::str::from_utf8(&raw[..end]).ok().map(str::to_owned),
            offset: self.offset.load(Ordering::Relaxed),
            generation: self.generation.load(Ordering::Relaxed),
        }
    }
}
