//! Regions: the reference a frame carries ([`RegionDesc`]), a counted reference held in this
//! process ([`Region`]), a region being filled ([`RegionMut`]), and the registry that finds the
//! region holding an address.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use rustc_hash::FxHashMap;

use crate::error::{Result, WireError};

use super::segment::DataSegment;

/// The reference a frame carries: which region, checked by the receiver before use. It names
/// one allocation for as long as the region is referenced (a key for what a process learned of
/// its bytes, which are immutable meanwhile).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegionDesc {
    /// Data segment name.
    pub name: String,
    /// Byte offset of the payload in the segment (64-byte aligned).
    pub offset: u64,
    /// Payload length.
    pub len: u64,
    /// The segment generation the region was allocated in.
    pub generation: u64,
}

/// Bytes of a segment name in an encoded descriptor (NUL-padded).
const DESC_NAME_LEN: usize = 40;

impl RegionDesc {
    /// Writes the 64-byte encoding (name NUL-padded to 40 bytes, then offset, length and
    /// generation as little-endian u64) into `out[..64]`.
    pub fn write_to(&self, out: &mut [u8]) {
        let b = &mut out[..64];
        b.fill(0);
        let name = &self.name.as_bytes()[..self.name.len().min(DESC_NAME_LEN)];
        b[..name.len()].copy_from_slice(name);
        b[40..48].copy_from_slice(&self.offset.to_le_bytes());
        b[48..56].copy_from_slice(&self.len.to_le_bytes());
        b[56..64].copy_from_slice(&self.generation.to_le_bytes());
    }

    /// Parses the 64-byte encoding of [`RegionDesc::write_to`]; the error says what is wrong.
    pub fn read_from(b: &[u8]) -> std::result::Result<RegionDesc, &'static str> {
        let b = b
            .get(..64)
            .ok_or("region descriptor shorter than 64 bytes")?;
        let raw = &b[..DESC_NAME_LEN];
        let end = raw.iter().position(|&c| c == 0).unwrap_or(DESC_NAME_LEN);
        if raw[end..].iter().any(|&c| c != 0) {
            return Err("region name is not NUL-padded");
        }
        let name = std::str::from_utf8(&raw[..end])
            .map_err(|_| "region name is not ASCII")?
            .to_owned();
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(RegionDesc {
            name,
            offset: word(40),
            len: word(48),
            generation: word(56),
        })
    }
}

/// One counted reference to a region (sender's or receiver's); dropping it releases the
/// reference. The payload is immutable once the region was committed.
pub struct Region {
    pub(super) seg: Arc<DataSegment>,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) generation: u64,
    /// Its entry in this process's ledger (see `ledger.rs`), if recorded there.
    pub(super) entry: Option<crate::ledger::Recorded>,
    /// The process that holds this reference: a forked child's copy of the handle holds none
    /// (dropping it there must not give back the parent's).
    pub(super) pid: u32,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Region({}+{}, {} bytes)",
            self.seg.name(),
            self.offset,
            self.len
        )
    }
}

impl Region {
    /// The payload bytes.
    pub fn bytes(&self) -> &[u8] {
        let p = self.ptr();
        // SAFETY: offset..offset+len was validated inside the mapping, which the Arc keeps; a
        // region is never written after commit while any reference exists.
        unsafe { std::slice::from_raw_parts(p.as_ptr(), self.len as usize) }
    }

    fn ptr(&self) -> NonNull<u8> {
        // SAFETY: offset + len is inside the mapping (validated at allocation or adoption).
        NonNull::new(unsafe { self.seg.seg.as_ptr().add(self.offset as usize) }).expect("non-null")
    }

    /// Byte offset of the payload in its segment.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Payload length.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment holding the region.
    pub fn segment(&self) -> &DataSegment {
        &self.seg
    }

    /// Whether this process wrote the region (its segment was made here): a reference to it
    /// that came back in a task's result pins this process's own shared memory.
    pub fn made_here(&self) -> bool {
        self.seg.seg.created_here()
    }

    /// A descriptor carrying one new reference, for a frame: re-sending passes the reference,
    /// never the bytes. The receiver adopts it with [`Mapper::adopt`].
    pub fn share(&self) -> RegionDesc {
        let h = self.seg.header(self.offset).expect("validated");
        h.add_ref();
        RegionDesc {
            name: self.seg.name().to_string(),
            offset: self.offset,
            len: self.len,
            generation: self.generation,
        }
    }

    /// A descriptor carrying no reference: names the region (to check that a reference
    /// received some other way is to this region, say).
    /// Which allocation this is, for what the process learns of its bytes.
    pub(crate) fn place(&self) -> crate::checked::Place<'_> {
        crate::checked::Place {
            name: self.seg.name().as_str(),
            generation: self.generation,
            offset: self.offset,
        }
    }

    /// The descriptor of this region (for a frame), without adding a reference.
    pub fn describe(&self) -> RegionDesc {
        RegionDesc {
            name: self.seg.name().to_string(),
            offset: self.offset,
            len: self.len,
            generation: self.generation,
        }
    }

    /// Writes `bytes` at `at` in the payload of an **output region**: one whose creator sends
    /// references to writers in other processes (each holds a counted one while it writes, so
    /// the space cannot be reused under it), each of which fills a range of its own, and which
    /// is read only after every writer is done. This is the one exception to "a committed
    /// region is immutable"; the error is for a range outside the payload.
    ///
    /// # Safety
    /// Nobody else reads or writes `at..at + bytes.len()` of this region while this runs, and
    /// nobody reads it until this writer's completion is published to the reader (a task's
    /// final state, say).
    pub unsafe fn write_at(&self, at: usize, bytes: &[u8]) -> Result<()> {
        let end = at.checked_add(bytes.len()).filter(|&e| e <= self.len());
        if end.is_none() {
            return Err(WireError::BadRegion {
                name: self.seg.name().to_string(),
                offset: self.offset,
                len: self.len,
                why: format!(
                    "a write of {} bytes at {at} is outside the region",
                    bytes.len()
                ),
            });
        }
        // SAFETY: the range is inside the mapping (checked above, the region validated when it
        // was made); the caller guarantees nobody else touches it meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr().as_ptr().add(at), bytes.len())
        };
        Ok(())
    }

    /// The payload as an Arrow buffer that keeps this reference (and the mapping) alive. The
    /// region can be found again from any address inside the buffer ([`Region::containing`]),
    /// so a view of it can be re-sent by reference.
    pub fn buffer(this: &Arc<Region>) -> arrow_buffer::Buffer {
        let (ptr, len) = (this.ptr(), this.len());
        {
            let mut g = registry().lock().unwrap_or_else(|p| p.into_inner());
            let (_, holders) = g
                .entry(ptr.as_ptr() as usize)
                .or_insert_with(|| (len, FxHashMap::default()));
            holders
                .entry(Arc::as_ptr(this) as usize)
                .or_insert_with(|| Arc::downgrade(this));
        }
        let owner: Arc<dyn arrow_buffer::alloc::Allocation> = this.clone();
        // SAFETY: ptr..ptr+len is valid, immutable memory for as long as the owner (a counted
        // reference holding the mapping) lives, which the Buffer guarantees by holding it.
        unsafe { arrow_buffer::Buffer::from_custom_allocation(ptr, len, owner) }
    }
}

/// Regions of this process that back buffers ([`Region::buffer`]), by start address: its
/// length, and every reference held to it here, by the address of its `Region` (a payload
/// may carry several references to one region — columns of one data frame — each adopted
/// as a `Region` of its own; and a task's views of a shared input live until R collects
/// them, thousands at a time: each is registered and removed in constant time).
type Registry = Mutex<std::collections::BTreeMap<usize, (usize, FxHashMap<usize, Weak<Region>>)>>;

fn registry() -> &'static Registry {
    static R: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    R.get_or_init(Default::default)
}

impl Region {
    /// The region (of this process) whose payload holds `addr`, with the offset of `addr` in
    /// it — for a buffer made by [`Region::buffer`] (or a slice of one) that is still alive.
    pub fn containing(addr: *const u8) -> Option<(Arc<Region>, usize)> {
        let a = addr as usize;
        let g = registry().lock().unwrap_or_else(|p| p.into_inner());
        let (&start, (len, holders)) = g.range(..=a).next_back()?;
        if a >= start + len {
            return None;
        }
        Some((holders.values().find_map(Weak::upgrade)?, a - start))
    }

    /// Whether the segment still has its name (nobody removed it: a descriptor sent now can
    /// be adopted).
    pub fn still_named(&self) -> bool {
        let seg = &self.seg.seg;
        // While this process holds one of its regions, the name of a segment it made goes
        // only through this process (`region_released` needs every region gone, `unlink_all`
        // and the owner's detach run here, and dead processes' cleanups spare the living):
        // once seen, it stays until this process removes some name. That saves the system
        // call, most of a small task's cost, on every send of a shared input.
        let own = seg.created_here();
        let removed = mizu_shm::segment::names_removed();
        if own && self.seg.named_at.load(Ordering::Acquire) == removed + 1 {
            return true;
        }
        let named = self.seg.name().path().exists();
        if named && own {
            self.seg.named_at.store(removed + 1, Ordering::Release);
        }
        named
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.pid != mizu_shm::current_pid() {
            return;
        }
        {
            let mut g = registry().lock().unwrap_or_else(|p| p.into_inner());
            let key = self.ptr().as_ptr() as usize;
            if let Some((_, holders)) = g.get_mut(&key) {
                // (`self` is the `Arc`'s value, at the address `buffer` registered.)
                holders.remove(&(std::ptr::from_ref(self) as usize));
                if holders.is_empty() {
                    g.remove(&key);
                }
            }
        }
        if let Some(e) = self.entry
            && !crate::ledger::take(e)
        {
            return; // given back on this holder's behalf already
        }
        let Ok(h) = self.seg.header(self.offset) else {
            return;
        };
        if h.release() {
            self.seg.region_released();
        }
    }
}

/// A region being filled by its allocator; [`RegionMut::commit`] makes it sendable.
pub struct RegionMut {
    pub(super) region: Region,
}

impl RegionMut {
    /// The payload area to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let p = self.region.ptr();
        // SAFETY: a fresh region is known to nobody else (no descriptor exists yet), so this
        // process has it exclusively until commit.
        unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), self.region.len as usize) }
    }

    /// Freezes the payload.
    pub fn commit(self) -> Region {
        let r = &self.region;
        crate::checked::written::committed(r.place(), r.ptr().as_ptr(), r.len());
        self.region
    }
}
