//! The counting protocol of data segments: a reference count per region, a live-region count
//! per segment and the owner's attachment, shared by holders, reapers and the owner reusing
//! its space — in any process.
//!
//! It lives apart from the segment code so that the same functions run on a segment and,
//! under `--cfg mizu_loom`, on the heap inside the loom models (`tests/loom.rs`):
//! * the owner reuses a segment's space only after every holder's reads are done (the last
//!   `release` happens before the owner's `live() == 0`);
//! * a reference is given back exactly once whoever gives it (holder or reaper, see
//!   `ledger_entry.rs`), and the segment counts each region gone exactly once;
//! * the last of "owner detached" and "no live region" is seen by at least one side, which
//!   removes the segment's name.

use mizu_shm::sync::{AtomicU32, AtomicU64, Ordering, fence};

/// Marks a region header (`RGN1`).
pub const REGION_MAGIC: u32 = u32::from_le_bytes(*b"RGN1");

/// A data segment's control line.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Control {
    live: AtomicU64,
    owner_attached: AtomicU32,
    _pad: u32,
    generation: AtomicU64,
}

impl Control {
    /// The owner has the segment (set once, when it makes it).
    pub fn attach_owner(&self) {
        self.owner_attached.store(1, Ordering::Release);
    }

    /// The owner lets go; true if the segment's name should go now (no live region).
    pub fn detach_owner(&self) -> bool {
        self.owner_attached.store(0, Ordering::SeqCst);
        self.unused()
    }

    /// Regions with at least one reference, in any process. When the owner reads zero, every
    /// holder's reads of the segment's regions happened before: it may reuse the space.
    pub fn live(&self) -> u64 {
        self.live.load(Ordering::Acquire)
    }

    /// A new lap over the arena (the owner, when it restarts from the beginning): descriptors
    /// of older laps no longer match. Returns the new generation.
    pub fn new_lap(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The current lap's generation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A region was published (owner only).
    pub fn region_added(&self) {
        self.live.fetch_add(1, Ordering::AcqRel);
    }

    /// A region's last reference is gone; true if the segment's name should go now (the
    /// owner has detached).
    pub fn region_gone(&self) -> bool {
        self.live.fetch_sub(1, Ordering::AcqRel) == 1 && self.unused()
    }

    /// Both stores (`owner_attached = 0`, the last `live` decrement) are followed by a
    /// sequentially consistent fence and a read of the other: whichever side comes last sees
    /// both, so the name is removed at least once (twice is harmless).
    fn unused(&self) -> bool {
        fence(Ordering::SeqCst);
        self.live.load(Ordering::SeqCst) == 0 && self.owner_attached.load(Ordering::SeqCst) == 0
    }
}

/// The 64-byte header before every region's payload.
#[repr(C)]
#[derive(Debug, Default)]
pub struct RegionHeader {
    magic: AtomicU32,
    refs: AtomicU32,
    len: AtomicU64,
    generation: AtomicU64,
    _reserved: [AtomicU64; 5],
}

impl RegionHeader {
    /// Publishes a fresh region with one reference (the allocator's): the count and the magic
    /// are stored after the length and generation, with release ordering, so whoever reads
    /// them with acquire ordering reads this region's length and generation.
    pub fn publish(&self, len: u64, generation: u64) {
        self.len.store(len, Ordering::Relaxed);
        self.generation.store(generation, Ordering::Relaxed);
        self.refs.store(1, Ordering::Release);
        self.magic.store(REGION_MAGIC, Ordering::Release);
    }

    /// Whether a region header is here at all.
    pub fn is_region(&self) -> bool {
        self.magic.load(Ordering::Acquire) == REGION_MAGIC
    }

    /// Whether this is the region a descriptor of `len` bytes and `generation` names, and
    /// still holds a reference (a receiver adopting one that was counted for it checks this).
    pub fn matches(&self, len: u64, generation: u64) -> bool {
        self.is_region()
            && self.len.load(Ordering::Relaxed) == len
            && self.generation.load(Ordering::Relaxed) == generation
    }

    /// References held, in any process.
    pub fn refs(&self) -> u32 {
        self.refs.load(Ordering::Acquire)
    }

    /// One more reference from a holder (for a descriptor it sends).
    pub fn add_ref(&self) {
        self.refs.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives back a reference this process holds; true if it was the last (the region is
    /// gone: tell the segment, [`Control::region_gone`]).
    pub fn release(&self) -> bool {
        self.refs.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Gives back a reference on behalf of a dead holder whose ledger listed this region
    /// (`generation`): only if the header is still that region's and has a reference to give.
    /// `Some(last)` if one was given back.
    pub fn release_on_behalf(&self, generation: u64) -> Option<bool> {
        if self.magic.load(Ordering::Acquire) != REGION_MAGIC
            || self.generation.load(Ordering::Relaxed) != generation
        {
            return None;
        }
        self.refs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(1))
            .ok()
            .map(|before| before == 1)
    }
}
