//! A data segment: its control line, its arena of regions, and what a receiver may do with a
//! region of another process's (release a reference on behalf of a dead holder).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use mizu_shm::{CacheLine, Extent, Layout, Segment, SegmentName, ShmSafe};

use crate::error::{Result, WireError};
use crate::refs::{Control, RegionHeader};

/// Segment kind of a data segment.
pub const DATA_KIND: u32 = u32::from_le_bytes(*b"DAT1");
/// Alignment of every region's payload (and of Arrow bodies inside it).
pub const ALIGN: u64 = 64;
/// Default arena size of a pooled data segment.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// How long a data segment with no live region (or a mapping kept only for reuse) stays
/// before it is given back: a stream of sends keeps reusing its segments, a pause of a few
/// seconds returns their memory (`/dev/shm` is RAM) — a one-off 2 GB payload does not hold
/// 2 GB until the process exits.
pub const IDLE_RELEASE: Duration = Duration::from_secs(2);

// SAFETY: repr(C) atomics (plus an unused pad word); zero is valid.
unsafe impl ShmSafe for Control {}
// SAFETY: repr(C) atomics only; zero is "no region".
unsafe impl ShmSafe for RegionHeader {}
const _: () = assert!(std::mem::size_of::<RegionHeader>() as u64 == ALIGN);

/// A mapped data segment, owned by this process or opened from another's descriptor.
pub struct DataSegment {
    pub(super) seg: Segment,
    pub(super) arena: Extent,
    owned: bool,
    /// One more than `mizu_shm::segment::names_removed()` when the name was last seen (0:
    /// never), for a segment this process made (see `Region::still_named`).
    pub(super) named_at: AtomicU64,
}

impl std::fmt::Debug for DataSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataSegment")
            .field("name", self.seg.name())
            .field("owned", &self.owned)
            .finish()
    }
}

impl DataSegment {
    pub(super) fn create(arena_bytes: u64) -> Result<Self> {
        Self::create_in(arena_bytes, false)
    }

    /// [`DataSegment::create`] in the spill directory (`Segment::create_spilled`).
    pub(super) fn create_spilled(arena_bytes: u64) -> Result<Self> {
        Self::create_in(arena_bytes, true)
    }

    fn create_in(arena_bytes: u64, spilled: bool) -> Result<Self> {
        let mut l = Layout::new(DATA_KIND);
        l.add(std::mem::size_of::<CacheLine<Control>>() as u64, 128)?;
        l.add(arena_bytes, ALIGN)?;
        // Pre-faulted: fallocate has committed the pages already, so mapping them now costs no
        // memory and spares every later send a page fault per 4 KiB it touches first. (A
        // spilled segment's pages are a file's: mapped as they are touched.)
        let seg = if spilled {
            Segment::create_spilled(&l, false)?
        } else {
            Segment::create(&l, true)?
        };
        seg.set_unlink_on_drop(false); // lifetime is by the live count, see the module docs
        let arena = seg.extent(1)?;
        let ds = DataSegment {
            seg,
            arena,
            owned: true,
            named_at: AtomicU64::new(0),
        };
        ds.control().attach_owner();
        Ok(ds)
    }

    pub(crate) fn open(name: &str) -> Result<Self> {
        let seg = Segment::open(name, DATA_KIND)?;
        if seg.header().extents().len() != 2 {
            return Err(WireError::BadRegion {
                name: name.into(),
                offset: 0,
                len: 0,
                why: "a data segment has exactly two extents".into(),
            });
        }
        let arena = seg.extent(1)?;
        seg.get::<CacheLine<Control>>(seg.extent(0)?.offset)?;
        Ok(DataSegment {
            seg,
            arena,
            owned: false,
            named_at: AtomicU64::new(0),
        })
    }

    pub(super) fn control(&self) -> &Control {
        let off = self.seg.extent(0).expect("validated").offset;
        &self
            .seg
            .get::<CacheLine<Control>>(off)
            .expect("validated")
            .0
    }

    pub(super) fn header(&self, payload_offset: u64) -> Result<&RegionHeader> {
        Ok(self.seg.get::<RegionHeader>(payload_offset - ALIGN)?)
    }

    /// The segment's name.
    pub fn name(&self) -> &SegmentName {
        self.seg.name()
    }

    /// Regions with at least one reference, in any process.
    pub fn live_regions(&self) -> u64 {
        self.control().live()
    }

    /// A region's last reference is gone.
    pub(super) fn region_released(&self) {
        if self.control().region_gone() {
            let _ = self.seg.unlink();
        }
    }

    /// Gives back one reference to the region at `offset` on behalf of a dead holder (its
    /// ledger said it held one): only if the region is still the one it held (magic and
    /// generation) and has a reference to give. True if one was given back.
    pub(crate) fn release_on_behalf(&self, offset: u64, generation: u64) -> bool {
        let a = self.arena;
        if !offset.is_multiple_of(ALIGN) || offset < a.offset + ALIGN || offset >= a.offset + a.len
        {
            return false;
        }
        let Ok(h) = self.header(offset) else {
            return false;
        };
        match h.release_on_behalf(generation) {
            None => false,
            Some(last) => {
                if last {
                    self.region_released();
                }
                true
            }
        }
    }
}

impl Drop for DataSegment {
    fn drop(&mut self) {
        // A forked child's copy does not detach its parent from the segment.
        if self.owned
            && self.seg.me().pid == mizu_shm::current_pid()
            && self.control().detach_owner()
        {
            let _ = self.seg.unlink();
        }
    }
}
