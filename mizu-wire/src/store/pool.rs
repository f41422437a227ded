//! A process's data segments for the values it sends ([`DataPool`]): regions allocated with a
//! bump pointer, segments reused once their regions are all released, given back after
//! [`IDLE_RELEASE`] unused; and making room when `/dev/shm` is full.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::error::{Result, WireError};

use super::region::{Region, RegionMut};
use super::segment::{ALIGN, DataSegment, IDLE_RELEASE};

/// The segment a region needs, when no segment of the pool has room.
#[derive(Clone, Copy)]
enum Make {
    /// One of the pool's segment size (or larger, for a large value).
    Ordinary,
    /// One of just the size needed (`/dev/shm` is short of room).
    Exact,
    /// One of just the size needed, in the spill directory.
    Spilled,
}

/// Whether data segments may spill (`MIZU_SPILL_DIR` is not `none`).
fn spills() -> bool {
    mizu_shm::place::spill_dir().is_some()
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
        match self.alloc_in(need, len, Make::Ordinary) {
            // A value too big for `/dev/shm` to hold beside others takes what this process
            // keeps idle, else goes to the spill directory without waiting; a smaller one
            // waits for room first, and spills only if none comes.
            Err(e) if no_space(&e) && spills() && need > mizu_shm::space::capacity() / 4 => {
                crate::janitor::release_idle_now();
                match self.alloc_in(need, len, Make::Exact) {
                    Err(e) if no_space(&e) => self.alloc_spilled(need, len),
                    r => r,
                }
            }
            Err(e) if no_space(&e) => match self.alloc_under_pressure(need, len) {
                Err(e) if no_space(&e) && spills() => self.alloc_spilled(need, len),
                r => r,
            },
            r => r,
        }
    }

    /// A region in a new segment of the spill directory (`mizu_shm::place::spill_dir`), said
    /// once per process (`spill::notice`).
    fn alloc_spilled(&self, need: u64, len: u64) -> Result<RegionMut> {
        let r = self.alloc_in(need, len, Make::Spilled)?;
        super::spill::spilled(len);
        Ok(r)
    }

    /// `/dev/shm` is full: give back what this process keeps only for reuse (idle segments of
    /// every pool, kept mappings) and try again with a segment of just the size needed, for up
    /// to [`ROOM_WAIT`] — the other processes' janitors give back what they keep idle within
    /// a tick once `/dev/shm` is nearly full, and readers let go of regions. The error after
    /// that is still [`WireError::is_no_space`]: a binding can free what its runtime holds
    /// unused (R's collector: views nobody uses) and try again.
    fn alloc_under_pressure(&self, need: u64, len: u64) -> Result<RegionMut> {
        with_room(
            || self.alloc_in(need, len, Make::Exact),
            WireError::is_no_space,
        )
    }

    /// Carves a region of `need` bytes (header included) from the current segment, an idle
    /// one, or a new one (`make` says which).
    fn alloc_in(&self, need: u64, len: u64, make: Make) -> Result<RegionMut> {
        crate::checked::written::forget();
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
                    let seg = Arc::new(match make {
                        Make::Ordinary => DataSegment::create(g.segment_bytes.max(need))?,
                        Make::Exact => DataSegment::create(need)?,
                        Make::Spilled => DataSegment::create_spilled(need)?,
                    });
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
