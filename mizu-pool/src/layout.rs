//! The pool segment: what lives where, initialised by the controller, validated by everyone
//! who attaches.
//!
//! Extents: 0 control, 1 worker records, 2 submitter records, 3 task-slot headers,
//! 4 task-slot data, 5 ring headers, 6 ring slots, 7 deque headers, 8 deque items, 9 the data
//! areas of wide slots (the first few slots of each submitter hold their payloads there
//! instead of in extent 4, so a payload of a few KiB travels inline). Ring (s, w) carries task
//! ids from submitter `s` to worker `w` (single producer, single consumer). Submitter 0 is
//! the controller, submitters `1..=max_workers` are the workers themselves (for nested tasks),
//! the rest are attached processes. The controller's and attached submitters' rows have a
//! ring to every worker; a worker's own row only to `nested_ring_span` workers, itself and the
//! ones after it (see [`Params::nested_ring_span`]), so that the matrix grows linearly with
//! the workers, not with their square. Each worker also owns a work-stealing deque of task
//! ids: its nested submissions, which it pops (newest first) and any idle worker steals
//! (oldest first).

use mizu_queue::deque::DequeHeader;
use mizu_queue::ring::{RingHeader, check_geometry};
use mizu_queue::{Deque, Ring};
use mizu_shm::sync::{AtomicU32, Ordering, SharedBytes};
use mizu_shm::{CacheLine, Extent, Layout, ProcessId, Segment, ShmSafe};

use crate::error::{PoolError, Result};
pub use crate::records::{SubmitterSlot, TaskHdr, TaskId, WorkerSlot, data_kind, reason, wstate};

/// Segment kind of a pool.
pub const POOL_KIND: u32 = u32::from_le_bytes(*b"POL1");
const MAGIC: u64 = u64::from_le_bytes(*b"MIZUPOOL");
/// Ring slot size: an 8-byte slot header and the 8-byte task id.
const RING_SLOT: u64 = 16;

/// Immutable parameters, written once by the controller before the token is shared.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Params {
    /// `MIZUPOOL`.
    pub magic: u64,
    /// Worker records.
    pub max_workers: u32,
    /// Submitter records (controller + workers + extra).
    pub submitters: u32,
    /// Task slots of the controller and of each attached submitter.
    pub slots: u32,
    /// Task slots of each worker's own submitter record (its nested tasks).
    pub nested_slots: u32,
    /// Data bytes per task slot.
    pub slot_bytes: u32,
    /// How many of the slots of the controller and of each attached submitter (the first
    /// ones) are wide.
    pub wide_slots: u32,
    /// How many of the slots of each worker's own record (the first ones) are wide.
    pub nested_wide_slots: u32,
    /// Data bytes per wide slot (at least `slot_bytes`).
    pub wide_bytes: u32,
    /// Ring capacity (task ids) of the rows of the controller and attached submitters.
    pub ring_capacity: u32,
    /// Ring capacity of the rows of the workers' own records: their nested tasks go to their
    /// own deques, and to rings only when the deque is full or from another thread.
    pub nested_ring_capacity: u32,
    /// Rings in each worker's own row: worker `o`'s row reaches workers `o`, `o + 1`, ...
    /// (modulo `max_workers`), this many of them (at least 1, at most `max_workers`). Its
    /// nested tasks reach the others by stealing from its deque.
    pub nested_ring_span: u32,
    /// Spin budget of waiting workers and collectors, in microseconds.
    pub spin_us: u32,
    /// Whether workers record task start times (an execution timeout is configured).
    pub timed: u32,
    /// Items per worker deque (a power of two).
    pub deque_capacity: u32,
    /// The controller.
    pub controller: ProcessId,
}

#[repr(C)]
#[derive(Debug, Default)]
struct Control {
    params: Params,
    stop: AtomicU32,
}
// SAFETY: repr(C); params written once before sharing, the rest atomics; zero is valid.
unsafe impl ShmSafe for Control {}

/// A validated view of a pool segment.
pub struct PoolView<'a> {
    seg: &'a Segment,
    /// The parameters.
    pub params: Params,
    ctl: &'a Control,
    workers: &'a [WorkerSlot],
    submitters: &'a [SubmitterSlot],
    tasks: &'a [TaskHdr],
    data: SharedBytes<'a>,
    rings: &'a [RingHeader],
    ring_slots: Extent,
    deques: &'a [DequeHeader],
    deque_items: &'a [mizu_shm::sync::AtomicU64],
    wide: SharedBytes<'a>,
}

/// Task slots of every submitter together (the workers' own records have `nested_slots`
/// each, the others `slots`).
fn all_slots(p: &Params) -> Option<u64> {
    let w = u64::from(p.max_workers);
    let others = u64::from(p.submitters).checked_sub(w)?;
    others
        .checked_mul(u64::from(p.slots))?
        .checked_add(w.checked_mul(u64::from(p.nested_slots))?)
}

/// Wide slots of every submitter together (each has the first few of its own: `wide_slots`,
/// or `nested_wide_slots` for a worker's own record).
fn all_wide(p: &Params) -> Option<u64> {
    let w = u64::from(p.max_workers);
    let others = u64::from(p.submitters).checked_sub(w)?;
    others
        .checked_mul(u64::from(p.wide_slots.min(p.slots)))?
        .checked_add(w.checked_mul(u64::from(p.nested_wide_slots.min(p.nested_slots)))?)
}

/// Rings of the rows of the matrix before submitter `s`'s, and ring slots (task ids) in them
/// (`s` = the submitter count: all of them). The controller's and attached submitters' rows
/// hold a ring per worker, the workers' own rows `nested_ring_span` each.
fn rings_before(p: &Params, s: u64) -> Option<(u64, u64)> {
    let w = u64::from(p.max_workers);
    let span = u64::from(p.nested_ring_span);
    let nested = s.saturating_sub(1).min(w);
    let main = s.checked_sub(nested)?;
    let rings = main
        .checked_mul(w)?
        .checked_add(nested.checked_mul(span)?)?;
    let slots = main
        .checked_mul(w)?
        .checked_mul(u64::from(p.ring_capacity))?
        .checked_add(
            nested
                .checked_mul(span)?
                .checked_mul(u64::from(p.nested_ring_capacity))?,
        )?;
    Some((rings, slots))
}

/// The workers submitter `s`'s row has rings to, in the row's order.
fn row_workers(p: &Params, s: usize) -> impl Iterator<Item = usize> {
    let n = p.max_workers as usize;
    let (first, len) = if (1..=n).contains(&s) {
        (s - 1, (p.nested_ring_span as usize).min(n))
    } else {
        (0, n)
    };
    (0..len).map(move |j| (first + j) % n)
}

/// Where ring (s, w) is in submitter `s`'s row, if the row has one to worker `w`.
fn ring_in_row(p: &Params, s: usize, w: usize) -> Option<usize> {
    let n = p.max_workers as usize;
    if w >= n || s >= p.submitters as usize {
        return None;
    }
    if (1..=n).contains(&s) {
        let j = (w + n - (s - 1)) % n;
        (j < p.nested_ring_span as usize).then_some(j)
    } else {
        Some(w)
    }
}

fn sizes(p: &Params) -> Option<[u64; 10]> {
    let w = u64::from(p.max_workers);
    let s = u64::from(p.submitters);
    let slots = all_slots(p)?;
    Some([
        std::mem::size_of::<CacheLine<Control>>() as u64,
        w.checked_mul(std::mem::size_of::<WorkerSlot>() as u64)?,
        s.checked_mul(std::mem::size_of::<SubmitterSlot>() as u64)?,
        slots.checked_mul(std::mem::size_of::<TaskHdr>() as u64)?,
        slots.checked_mul(u64::from(p.slot_bytes))?,
        rings_before(p, s)?
            .0
            .checked_mul(std::mem::size_of::<RingHeader>() as u64)?,
        rings_before(p, s)?.1.checked_mul(RING_SLOT)?,
        w.checked_mul(std::mem::size_of::<DequeHeader>() as u64)?,
        w.checked_mul(u64::from(p.deque_capacity))?.checked_mul(8)?,
        all_wide(p)?.checked_mul(u64::from(p.wide_bytes))?,
    ])
}

/// The capacity of the rings of submitter `s`'s row.
fn ring_capacity_of(p: &Params, s: u64) -> u64 {
    if (1..=u64::from(p.max_workers)).contains(&s) {
        u64::from(p.nested_ring_capacity)
    } else {
        u64::from(p.ring_capacity)
    }
}

/// Creates and initialises a pool segment.
pub fn create(p: Params) -> Result<Segment> {
    let sz = sizes(&p).ok_or_else(|| PoolError::Config("pool size overflows".into()))?;
    let mut l = Layout::new(POOL_KIND);
    for s in sz {
        l.add(s, 128)?;
    }
    let seg = Segment::create(&l, true)?;
    let off = seg.extent(0)?.offset;
    // SAFETY: nobody else knows the segment yet.
    unsafe {
        seg.init_at(
            off,
            CacheLine(Control {
                params: Params { magic: MAGIC, ..p },
                stop: AtomicU32::new(0),
            }),
        )?
    };
    let rh = seg.extent(5)?.offset;
    let mut i = 0;
    for s in 0..p.submitters as usize {
        let capacity = ring_capacity_of(&p, s as u64);
        // (A row's rings all have its capacity: their order does not matter here.)
        for _ in row_workers(&p, s) {
            let at = rh + i * std::mem::size_of::<RingHeader>() as u64;
            // SAFETY: as above.
            unsafe { seg.init_at(at, RingHeader::new(capacity, RING_SLOT))? };
            i += 1;
        }
    }
    let dh = seg.extent(7)?.offset;
    for w in 0..u64::from(p.max_workers) {
        let at = dh + w * std::mem::size_of::<DequeHeader>() as u64;
        // SAFETY: as above.
        unsafe { seg.init_at(at, DequeHeader::new(u64::from(p.deque_capacity)))? };
    }
    Ok(seg)
}

impl<'a> PoolView<'a> {
    /// Validates the segment's layout against its parameters, and every ring and deque header.
    pub fn new(seg: &'a Segment) -> Result<Self> {
        Self::validated(seg, true)
    }

    /// [`PoolView::new`] without looking at every ring's header: for a handle to one ring or
    /// deque (each checks its own header when made) of a segment this process has opened with
    /// `new`. Every producer and deque handle makes a view, one per worker slot: checking
    /// every ring in each made a pool's start quadratic in its worker slots.
    pub fn for_handle(seg: &'a Segment) -> Result<Self> {
        Self::validated(seg, false)
    }

    fn validated(seg: &'a Segment, rings: bool) -> Result<Self> {
        let bad = |w: String| PoolError::Layout(format!("{}: {w}", seg.token()));
        let ctl: &CacheLine<Control> = seg.get(seg.extent(0)?.offset)?;
        let p = ctl.params;
        if p.magic != MAGIC {
            return Err(bad("not a pool control block".into()));
        }
        if p.max_workers == 0
            || p.submitters <= p.max_workers
            || !(1..=crate::MAX_SLOTS).contains(&p.slots)
            || !(1..=crate::MAX_SLOTS).contains(&p.nested_slots)
        {
            return Err(bad(format!("impossible parameters {p:?}")));
        }
        if p.slot_bytes < 128 || !p.slot_bytes.is_multiple_of(64) || p.submitters >= 1 << 11 {
            return Err(bad(format!("impossible parameters {p:?}")));
        }
        if p.wide_slots > p.slots
            || p.nested_wide_slots > p.nested_slots
            || !(1..=p.max_workers).contains(&p.nested_ring_span)
            || p.wide_bytes < p.slot_bytes
            || !p.wide_bytes.is_multiple_of(64)
            || p.wide_bytes > 1 << 20
        {
            return Err(bad(format!("impossible parameters {p:?}")));
        }
        check_geometry(u64::from(p.ring_capacity), RING_SLOT).map_err(bad)?;
        check_geometry(u64::from(p.nested_ring_capacity), RING_SLOT).map_err(bad)?;
        if !p.deque_capacity.is_power_of_two() || p.deque_capacity > 1 << 20 {
            return Err(bad(format!("impossible parameters {p:?}")));
        }
        let sz = sizes(&p).ok_or_else(|| bad("sizes overflow".into()))?;
        for (i, want) in sz.iter().enumerate() {
            if seg.extent(i)?.len != *want {
                return Err(bad(format!(
                    "extent {i} has {} bytes, parameters need {want}",
                    seg.extent(i)?.len
                )));
            }
        }
        let n_rings = rings_before(&p, u64::from(p.submitters))
            .ok_or_else(|| bad("sizes overflow".into()))?
            .0 as usize;
        let n_slots = all_slots(&p).ok_or_else(|| bad("sizes overflow".into()))? as usize;
        let deques: &[DequeHeader] =
            seg.get_slice(seg.extent(7)?.offset, p.max_workers as usize)?;
        let deque_items: &[mizu_shm::sync::AtomicU64] = seg.get_slice(
            seg.extent(8)?.offset,
            (p.max_workers * p.deque_capacity) as usize,
        )?;
        let cap = p.deque_capacity as usize;
        for (w, h) in deques.iter().enumerate() {
            Deque::new(h, &deque_items[w * cap..(w + 1) * cap])
                .map_err(|e| bad(format!("deque of worker {w}: {e}")))?;
        }
        let view = PoolView {
            seg,
            params: p,
            ctl,
            workers: seg.get_slice(seg.extent(1)?.offset, p.max_workers as usize)?,
            submitters: seg.get_slice(seg.extent(2)?.offset, p.submitters as usize)?,
            tasks: seg.get_slice(seg.extent(3)?.offset, n_slots)?,
            data: seg.bytes(seg.extent(4)?, p.slot_bytes as usize)?,
            rings: seg.get_slice(seg.extent(5)?.offset, n_rings)?,
            ring_slots: seg.extent(6)?,
            deques,
            deque_items,
            wide: seg.bytes(seg.extent(9)?, p.wide_bytes as usize)?,
        };
        if rings {
            for s in 0..p.submitters as usize {
                for w in row_workers(&p, s) {
                    view.ring(s, w)?;
                }
            }
        }
        Ok(view)
    }

    /// Whether the pool is stopping.
    pub fn stopped(&self) -> bool {
        self.ctl.stop.load(Ordering::Acquire) != 0
    }

    /// Asks everyone to stop.
    pub fn set_stop(&self) {
        self.ctl.stop.store(1, Ordering::Release);
    }

    /// Every worker slot.
    pub fn workers(&self) -> &'a [WorkerSlot] {
        self.workers
    }

    /// Worker slot `w`.
    pub fn worker(&self, w: usize) -> &'a WorkerSlot {
        &self.workers[w]
    }

    /// How many submitter slots the pool has.
    pub fn submitter_count(&self) -> usize {
        self.submitters.len()
    }

    /// Submitter slot `s`.
    pub fn submitter(&self, s: usize) -> &'a SubmitterSlot {
        &self.submitters[s]
    }

    /// How many task slots submitter `s` has: `nested_slots` for a worker's own record,
    /// `slots` for the others. A slot index read from shared memory (a task id) must be
    /// checked against it before [`PoolView::task`] or [`PoolView::data`].
    pub fn slots_of(&self, s: usize) -> usize {
        if (1..=self.params.max_workers as usize).contains(&s) {
            self.params.nested_slots as usize
        } else {
            self.params.slots as usize
        }
    }

    /// How many of submitter `s`'s slots are wide (the first ones).
    pub(crate) fn wide_of(&self, s: usize) -> usize {
        let wide = if (1..=self.params.max_workers as usize).contains(&s) {
            self.params.nested_wide_slots
        } else {
            self.params.wide_slots
        };
        (wide as usize).min(self.slots_of(s))
    }

    /// The index of submitter `s`'s first slot among all, given each submitter's count of
    /// them (`per`).
    fn first_of(&self, s: usize, per: impl Fn(usize) -> usize) -> usize {
        let w = self.params.max_workers as usize;
        let (main, nested) = (per(0), per(1));
        match s {
            0 => 0,
            s if s <= w => main + (s - 1) * nested,
            s => main + w * nested + (s - 1 - w) * main,
        }
    }

    /// Task slot header `k` of submitter `s` (`k < slots_of(s)`).
    pub fn task(&self, s: usize, k: usize) -> &'a TaskHdr {
        debug_assert!(k < self.slots_of(s));
        &self.tasks[self.first_of(s, |s| self.slots_of(s)) + k]
    }

    /// Where the data area of task slot `k` of submitter `s` is (`k < slots_of(s)`): the
    /// bytes, the granule index in them, and its capacity.
    pub fn data(&self, s: usize, k: usize) -> (SharedBytes<'a>, usize, usize) {
        debug_assert!(k < self.slots_of(s));
        if k < self.wide_of(s) {
            let at = self.first_of(s, |s| self.wide_of(s)) + k;
            (self.wide, at, self.params.wide_bytes as usize)
        } else {
            let at = self.first_of(s, |s| self.slots_of(s)) + k;
            (self.data, at, self.params.slot_bytes as usize)
        }
    }

    /// Whether submitter `s` has a ring to worker `w` (every submitter but a worker's own
    /// record has one to every worker).
    pub fn has_ring(&self, s: usize, w: usize) -> bool {
        ring_in_row(&self.params, s, w).is_some()
    }

    /// Ring (s, w): task ids from submitter `s` to worker `w` (validated again: its header
    /// is shared memory); an error when `s` has no ring to `w` ([`PoolView::has_ring`]).
    pub fn ring(&self, s: usize, w: usize) -> Result<Ring<'a>> {
        let p = &self.params;
        let no = || PoolError::Layout(format!("ring ({s}, {w}) of no pool"));
        let j = ring_in_row(p, s, w).ok_or_else(no)? as u64;
        let capacity = ring_capacity_of(p, s as u64);
        let (rings, slots) = rings_before(p, s as u64).ok_or_else(no)?;
        let i = (rings + j) as usize;
        let before = slots.checked_add(j * capacity).ok_or_else(no)?;
        let ext = Extent {
            offset: self.ring_slots.offset + before * RING_SLOT,
            len: capacity * RING_SLOT,
        };
        let bytes = self.seg.bytes(ext, RING_SLOT as usize)?;
        Ring::new(&self.rings[i], bytes)
            .map_err(|e| PoolError::Layout(format!("{}: ring ({s}, {w}): {e}", self.seg.token())))
    }

    /// Worker `w`'s deque (validated again: its header is shared memory).
    pub fn deque(&self, w: usize) -> Result<Deque<'a>> {
        let cap = self.params.deque_capacity as usize;
        Deque::new(&self.deques[w], &self.deque_items[w * cap..(w + 1) * cap]).map_err(|e| {
            PoolError::Layout(format!("{}: deque of worker {w}: {e}", self.seg.token()))
        })
    }
}

/// CLOCK_MONOTONIC in nanoseconds (comparable across processes).
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
