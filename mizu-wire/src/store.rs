//! Payload storage: data segments holding regions that other processes read in place.
//!
//! A data segment (kind `DAT1`) has a control line and an arena. The owning process allocates
//! regions from the arena with a bump pointer; each region is a 64-byte header (magic,
//! reference count, length, generation — all atomics) followed by the payload, 64-byte
//! aligned. The control line counts live regions and says whether the owner is still attached.
//!
//! Lifetime:
//! * a region starts with one reference (the allocator's handle); sending it adds one that the
//!   frame carries and the receiver adopts; re-sending a received region adds one more — the
//!   bytes never move;
//! * dropping the last reference of a region decrements the segment's live count;
//! * the owner resets a segment whose live count is zero and reuses it (no `shm_open` per send);
//! * the name is unlinked by whoever sees "live == 0 and owner detached" last — the owner
//!   detaching or a receiver releasing — and by `mizu_shm::prune` once the owner is dead
//!   (`kill -9`). Mappings stay valid after the unlink, so a received view outlives its sender.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

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
    seg: Segment,
    arena: Extent,
    owned: bool,
    /// One more than `mizu_shm::segment::names_removed()` when the name was last seen (0:
    /// never), for a segment this process made (see `Region::still_named`).
    named_at: AtomicU64,
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
    fn create(arena_bytes: u64) -> Result<Self> {
        let mut l = Layout::new(DATA_KIND);
        l.add(std::mem::size_of::<CacheLine<Control>>() as u64, 128)?;
        l.add(arena_bytes, ALIGN)?;
        // Pre-faulted: fallocate has committed the pages already, so mapping them now costs no
        // memory and spares every later send a page fault per 4 KiB it touches first.
        let seg = Segment::create(&l, true)?;
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

    fn control(&self) -> &Control {
        let off = self.seg.extent(0).expect("validated").offset;
        &self
            .seg
            .get::<CacheLine<Control>>(off)
            .expect("validated")
            .0
    }

    fn header(&self, payload_offset: u64) -> Result<&RegionHeader> {
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
    fn region_released(&self) {
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
    seg: Arc<DataSegment>,
    offset: u64,
    len: u64,
    generation: u64,
    /// Its entry in this process's ledger (see `ledger.rs`), if recorded there.
    entry: Option<crate::ledger::Recorded>,
    /// The process that holds this reference: a forked child's copy of the handle holds none
    /// (dropping it there must not give back the parent's).
    pid: u32,
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
    region: Region,
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
        crate::value::written::committed(&r.describe(), r.ptr().as_ptr(), r.len());
        self.region
    }
}

struct PoolInner {
    segments: Vec<Pooled>,
    current: usize,
    bump: u64,
    idle_release: Duration,
    /// When a region was last allocated in any segment.
    last_alloc: Instant,
    /// The arena size of an ordinary segment (larger ones hold one large payload).
    segment_bytes: u64,
}

/// A segment of the pool and when a region was last allocated in it.
struct Pooled {
    seg: Arc<DataSegment>,
    used: Instant,
}

/// The pool's state, shared with the janitor (which trims it).
struct PoolState(Mutex<PoolInner>);

impl PoolState {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl crate::janitor::Trim for PoolState {
    fn trim(&self, now: Instant) {
        let mut g = self.lock();
        let (keep, current, ordinary) = (g.idle_release, g.current, g.segment_bytes);
        // While sends go on, the ordinary segments they cycle through stay (giving one back
        // only to make it again a moment later would cost a segment creation per lap); a
        // pause gives everything back, and a segment made for one large payload goes on its
        // own once unused.
        let quiet = now.saturating_duration_since(g.last_alloc) >= keep;
        let mut at = None;
        let mut i = 0;
        // Dropped outside the loop's borrow: the last reference unlinks the segment (no
        // region lives in any process, so nobody can be reading it).
        let mut gone = Vec::new();
        g.segments.retain(|p| {
            let idle = p.seg.live_regions() == 0
                && now.saturating_duration_since(p.used) >= keep
                && (quiet || p.seg.arena.len > ordinary);
            if !idle && i == current {
                at = Some(i - gone.len());
            }
            if idle {
                gone.push(Arc::clone(&p.seg));
            }
            i += 1;
            !idle
        });
        // Without its current segment the pool has none: the next allocation picks or makes
        // one and starts at its beginning (never a kept segment's start: it has live regions).
        g.current = at.unwrap_or(usize::MAX);
        drop(g);
        drop(gone);
    }
}

/// This process's data segments, reused across sends; those idle for [`IDLE_RELEASE`] are
/// given back (unlinked and unmapped) by a background thread.
pub struct DataPool {
    inner: Arc<PoolState>,
}

impl DataPool {
    /// A pool whose segments have `segment_bytes` of arena (payloads larger than that get a
    /// segment of their own size), at most a 32nd of `/dev/shm` (a container's 64 MiB holds
    /// 2 MiB segments: a handful of processes each keeping a few 16 MiB ones would fill it).
    /// Nothing is created until the first allocation.
    pub fn new(segment_bytes: u64) -> Self {
        let segment_bytes = segment_bytes.min((mizu_shm::space::capacity() / 32).max(1 << 20));
        let inner = Arc::new(PoolState(Mutex::new(PoolInner {
            segments: Vec::new(),
            current: 0,
            bump: 0,
            idle_release: IDLE_RELEASE,
            last_alloc: Instant::now(),
            segment_bytes: segment_bytes.max(ALIGN * 2),
        })));
        let weak: Weak<dyn crate::janitor::Trim> = Arc::downgrade(&inner) as _;
        crate::janitor::register(weak);
        DataPool { inner }
    }

    /// Data segments currently held.
    pub fn segments(&self) -> usize {
        self.inner.lock().segments.len()
    }

    /// Regions of this pool's segments with at least one reference, in any process.
    pub fn live_regions(&self) -> u64 {
        self.inner
            .lock()
            .segments
            .iter()
            .map(|p| p.seg.live_regions())
            .sum()
    }

    /// Sets how long a segment without live regions is kept for reuse (default
    /// [`IDLE_RELEASE`]).
    pub fn set_idle_release(&self, d: Duration) {
        self.inner.lock().idle_release = d;
    }

    /// Allocates a region of `len` bytes (64-byte aligned) for filling.
    pub fn alloc(&self, len: usize) -> Result<RegionMut> {
        let len = len as u64;
        let need = ALIGN
            .checked_add(
                len.checked_next_multiple_of(ALIGN)
                    .ok_or_else(|| too_big(len))?,
            )
            .ok_or_else(|| too_big(len))?;
        match self.alloc_in(need, len, false) {
            Err(e) if no_space(&e) => self.alloc_under_pressure(need, len),
            r => r,
        }
    }

    /// `/dev/shm` is full: give back what this process keeps only for reuse (idle segments of
    /// every pool, kept mappings) and try again with a segment of just the size needed, for up
    /// to [`ROOM_WAIT`] — the other processes' janitors give back what they keep idle within
    /// a tick once `/dev/shm` is nearly full, and readers let go of regions. The error after
    /// that is still [`WireError::is_no_space`]: a binding can free what its runtime holds
    /// unused (R's collector: views nobody uses) and try again.
    fn alloc_under_pressure(&self, need: u64, len: u64) -> Result<RegionMut> {
        with_room(|| self.alloc_in(need, len, true), WireError::is_no_space)
    }

    /// Carves a region of `need` bytes (header included) from the current segment, an idle
    /// one, or a new one (of the pool's segment size, or of `need` bytes when `exact`).
    fn alloc_in(&self, need: u64, len: u64, exact: bool) -> Result<RegionMut> {
        crate::value::written::forget();
        let mut g = self.inner.lock();
        let fits =
            |s: &DataSegment, bump: u64| bump.checked_add(need).is_some_and(|e| e <= s.arena.len);
        let usable = g.segments.get(g.current).is_some_and(|p| {
            // An idle current segment restarts from the beginning.
            fits(&p.seg, if p.seg.live_regions() == 0 { 0 } else { g.bump })
        });
        let now = Instant::now();
        if !usable {
            let reuse = g
                .segments
                .iter()
                .position(|p| p.seg.live_regions() == 0 && p.seg.arena.len >= need);
            let idx = match reuse {
                Some(i) => i,
                None => {
                    let size = if exact {
                        need
                    } else {
                        g.segment_bytes.max(need)
                    };
                    let seg = Arc::new(DataSegment::create(size)?);
                    g.segments.push(Pooled { seg, used: now });
                    crate::janitor::ensure_running();
                    g.segments.len() - 1
                }
            };
            g.current = idx;
            g.bump = 0;
        }
        let cur = g.current;
        g.segments[cur].used = now;
        g.last_alloc = now;
        let seg = Arc::clone(&g.segments[cur].seg);
        let ctl = seg.control();
        if ctl.live() == 0 && g.bump != 0 {
            g.bump = 0;
        }
        // A new lap over the arena: descriptors of older laps no longer match.
        let generation = if g.bump == 0 {
            ctl.new_lap()
        } else {
            ctl.generation()
        };
        let offset = seg.arena.offset + g.bump + ALIGN;
        g.bump += need;
        let h = seg.header(offset)?;
        h.publish(len, generation);
        ctl.region_added();
        Ok(RegionMut {
            region: Region {
                seg,
                offset,
                len,
                generation,
                entry: None,
                pid: mizu_shm::current_pid(),
            },
        })
    }

    /// Lets go of every segment as if this process had exited: each is unlinked as soon as
    /// its regions are released (at once when none is live). Later allocations use new
    /// segments. For a process about to exit with its data still being read elsewhere.
    pub fn detach(&self) {
        let mut g = self.inner.lock();
        g.segments.clear();
        g.current = 0;
        g.bump = 0;
    }

    /// Removes every segment's name now, even with regions still referenced (their readers
    /// keep their mappings; descriptors not yet adopted can no longer be opened). For a
    /// process that exits and whose in-flight sends are moot.
    pub fn unlink_all(&self) {
        let mut g = self.inner.lock();
        for p in g.segments.drain(..) {
            let _ = p.seg.seg.unlink();
        }
        g.current = 0;
        g.bump = 0;
    }

    /// Allocates and fills a region with `bytes`.
    pub fn store(&self, bytes: &[u8]) -> Result<Region> {
        let mut r = self.alloc(bytes.len())?;
        r.bytes_mut().copy_from_slice(bytes);
        Ok(r.commit())
    }
}

/// How long an allocation waits for room in a full `/dev/shm` before it fails: three of the
/// janitors' looks.
pub const ROOM_WAIT: Duration = Duration::from_millis(1500);

/// Runs `make` (which creates a segment); while it fails for lack of room in `/dev/shm`
/// (`no_room`), gives back what this process keeps only for reuse and tries again, for up to
/// [`ROOM_WAIT`] — the other processes' janitors give back what they keep idle once
/// `/dev/shm` is nearly full. The error after that is `make`'s last.
pub fn with_room<T, E>(
    mut make: impl FnMut() -> std::result::Result<T, E>,
    no_room: impl Fn(&E) -> bool,
) -> std::result::Result<T, E> {
    let start = Instant::now();
    loop {
        match make() {
            Err(e) if no_room(&e) && start.elapsed() < ROOM_WAIT => {
                crate::janitor::release_idle_now();
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// Gives back at once what this process keeps only for reuse: idle data segments of every
/// pool and kept mappings (for a binding that just freed views and wants the room now).
pub fn give_back_idle_now() {
    crate::janitor::release_idle_now();
}

fn no_space(e: &WireError) -> bool {
    e.is_no_space()
}

fn too_big(len: u64) -> WireError {
    WireError::Unsupported(format!("a payload of {len} bytes"))
}

/// Segments a [`Mapper`] keeps mapped after their last region is released: a steady stream
/// of sends from a few peers then costs no `shm_open`/`mmap`/`munmap` per message.
const KEEP_MAPPED: usize = 8;

/// This process's cache of data segments opened from descriptors: a region of a segment the
/// receiver already holds costs no `shm_open`, and the last few segments used stay mapped
/// (until they have been unused for [`IDLE_RELEASE`]: a mapping keeps the segment's memory
/// alive after its owner removed it).
pub struct Mapper {
    open: Mutex<HashMap<String, Weak<DataSegment>>>,
    recent: Arc<Recent>,
}

/// The segments a [`Mapper`] keeps mapped for reuse, most recently used first, with when.
#[derive(Default)]
struct Recent {
    list: Mutex<std::collections::VecDeque<(Arc<DataSegment>, Instant)>>,
    /// The first segment was used again since the janitor last looked: its time is then
    /// (adoptions from the segment in front read no clock, which costs more in a VM than the
    /// rest of the lookup).
    front_used: AtomicBool,
}

impl Recent {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(Arc<DataSegment>, Instant)>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The segment in front if it is the one named `name`, marked used.
    fn front_named(&self, name: &str) -> Option<Arc<DataSegment>> {
        let r = self.lock();
        let f = r.front().filter(|f| f.0.seg.name().as_str() == name)?;
        self.front_used.store(true, Ordering::Relaxed);
        Some(Arc::clone(&f.0))
    }
}

impl crate::janitor::Trim for Recent {
    fn trim(&self, now: Instant) {
        let gone: Vec<_> = {
            let mut r = self.lock();
            if self.front_used.swap(false, Ordering::Relaxed)
                && let Some(f) = r.front_mut()
            {
                // Its last use is the present, not `now`: a sweep that gives back everything
                // passes a moment a day ahead, which stamped here would keep this mapping
                // through every later trim for a day.
                f.1 = now.min(Instant::now());
            }
            let keep = r
                .iter()
                .take_while(|(_, t)| now.saturating_duration_since(*t) < IDLE_RELEASE)
                .count();
            r.drain(keep..).collect()
        };
        drop(gone);
    }
}

impl Default for Mapper {
    fn default() -> Self {
        Mapper::new()
    }
}

impl Mapper {
    /// An empty cache.
    pub fn new() -> Self {
        let recent = Arc::new(Recent::default());
        let weak: Weak<dyn crate::janitor::Trim> = Arc::downgrade(&recent) as _;
        crate::janitor::register(weak);
        Mapper {
            open: Mutex::new(HashMap::new()),
            recent,
        }
    }

    /// Segments kept mapped only for reuse.
    pub fn kept(&self) -> usize {
        self.recent.lock().len()
    }

    /// Takes over the reference a received descriptor carries, after validating it: the
    /// segment (name, header, kind), the bounds, and the region header (magic, length,
    /// generation, a reference present).
    pub fn adopt(&self, d: &RegionDesc) -> Result<Region> {
        let seg = self.checked(d)?;
        Ok(Region {
            seg,
            offset: d.offset,
            len: d.len,
            generation: d.generation,
            entry: crate::ledger::record(d),
            pid: mizu_shm::current_pid(),
        })
    }

    /// The segment of a descriptor whose region checks out (see [`Mapper::adopt`]).
    fn checked(&self, d: &RegionDesc) -> Result<Arc<DataSegment>> {
        let bad = |why: &str| WireError::BadRegion {
            name: d.name.clone(),
            offset: d.offset,
            len: d.len,
            why: why.into(),
        };
        let seg = self.segment(&d.name)?;
        let a = seg.arena;
        let end = d
            .offset
            .checked_add(d.len)
            .ok_or_else(|| bad("offset + length overflows"))?;
        if !d.offset.is_multiple_of(ALIGN) || d.offset < a.offset + ALIGN || end > a.offset + a.len
        {
            return Err(bad("outside the segment's arena or misaligned"));
        }
        let h = seg.header(d.offset)?;
        if !h.is_region() {
            return Err(bad("no region header there"));
        }
        if !h.matches(d.len, d.generation) {
            return Err(bad("stale: the region was released and its space reused"));
        }
        if h.refs() == 0 {
            return Err(bad("the region holds no reference for this descriptor"));
        }
        Ok(seg)
    }

    fn segment(&self, name: &str) -> Result<Arc<DataSegment>> {
        // Most adoptions name the segment of the one before: no hashing, no clock.
        if let Some(s) = self.recent.front_named(name) {
            return Ok(s);
        }
        let mut m = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = m.get(name).and_then(Weak::upgrade) {
            self.keep(&s);
            return Ok(s);
        }
        m.retain(|_, w| w.strong_count() > 0);
        let s = Arc::new(DataSegment::open(name)?);
        m.insert(name.to_owned(), Arc::downgrade(&s));
        self.keep(&s);
        crate::janitor::ensure_running();
        Ok(s)
    }

    /// Marks `s` most recently used; the least recently used beyond [`KEEP_MAPPED`] is let go.
    fn keep(&self, s: &Arc<DataSegment>) {
        let now = Instant::now();
        let mut r = self.recent.lock();
        if let Some(f) = r.front_mut()
            && Arc::ptr_eq(&f.0, s)
        {
            f.1 = now;
            return;
        }
        r.retain(|x| !Arc::ptr_eq(&x.0, s));
        r.push_front((Arc::clone(s), now));
        r.truncate(KEEP_MAPPED);
    }

    /// Unmaps the segments kept only for reuse (regions still held stay mapped).
    pub fn release_unused(&self) {
        self.recent.lock().clear();
    }
}
