//! The mapped pool segment and the payload I/O of task slots, shared by the controller,
//! submitters and workers of one process.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use arrow_buffer::Buffer;
use mizu_shm::Segment;
use mizu_wire::frame::{self, Body};
use mizu_wire::{DataPool, Mapper, Region};

use crate::error::{PoolError, Result};
use crate::layout::{POOL_KIND, PoolView, TaskHdr, data_kind};
use crate::origin::Origin;
use crate::outcome::{OutcomeBytes, SMALL_OUTCOME};

/// What this process's binding does with a payload nobody will read, before it is dropped.
static DISCARD_HOOK: OnceLock<fn(&[u8])> = OnceLock::new();

/// Sets what is done with a payload nobody will read (a cancelled input, an abandoned or
/// failed task's output, a payload whose submission was undone) before it is dropped: a
/// binding that writes references to other regions inside its payloads (each holding a
/// count of that region, see `mizu_wire::Region::share`) releases them here, or those
/// regions — and their segments — stay alive until the process exits. The payload may be
/// inline; the hook may run on any thread and must not panic. The first call wins; returns
/// whether this one did.
pub fn set_discard_hook(f: fn(&[u8])) -> bool {
    DISCARD_HOOK.set(f).is_ok()
}

/// A pool segment and its validated view. The view borrows the segment, which this struct
/// owns behind an `Arc` (a stable address) and drops last.
pub struct Shared {
    view: PoolView<'static>,
    /// Storage for payloads too large for a task slot.
    pub data_pool: DataPool,
    /// Opened data segments of other processes.
    pub mapper: Mapper,
    /// The process that mapped the segment: a forked child's copy must not act on it.
    pub origin: Origin,
    seg: Arc<Segment>,
}

impl Shared {
    /// Wraps a created or opened pool segment, validating it.
    pub fn new(seg: Segment) -> Result<Arc<Self>> {
        let seg = Arc::new(seg);
        // SAFETY: the Segment lives in the Arc stored in the same struct, so its address is
        // stable and it outlives `view`: fields drop in declaration order and `seg` is last;
        // the 'static lifetime never escapes this struct (accessors reborrow from &self).
        let seg_ref: &'static Segment = unsafe { &*Arc::as_ptr(&seg) };
        let view = PoolView::new(seg_ref)?;
        Ok(Arc::new(Shared {
            view,
            data_pool: DataPool::new(16 << 20),
            mapper: Mapper::new(),
            origin: Origin::here(),
            seg,
        }))
    }

    /// Opens a pool by token.
    pub fn open(token: &str) -> Result<Arc<Self>> {
        Shared::new(Segment::open(token, POOL_KIND)?)
    }

    /// The validated view.
    pub fn view(&self) -> &PoolView<'_> {
        &self.view
    }

    /// The segment.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// A share of the segment, for handles that keep it mapped themselves
    /// (`mizu_queue::OwnedProducer` and friends).
    pub fn segment_arc(&self) -> Arc<Segment> {
        self.seg.clone()
    }

    /// Writes a payload into task slot (s, k): inline when it fits its data area (`slot_bytes`,
    /// or `wide_bytes` for a wide slot), else through a region.
    ///
    /// The caller must own the slot's data area by protocol (a submitter before publishing
    /// `Pending`, a worker while `Running`).
    pub fn write_payload(&self, s: usize, k: usize, bytes: &[u8]) -> Result<()> {
        self.write_payload_with(s, k, &bytes)
    }

    /// [`Shared::write_payload`] for a payload that writes itself in place: large payloads go
    /// straight into their region, without an intermediate buffer.
    pub fn write_payload_with(&self, s: usize, k: usize, payload: &dyn Fill) -> Result<()> {
        let hdr = self.view.task(s, k);
        let (data, granule, cap) = self.view.data(s, k);
        let len = payload.size();
        if len <= cap {
            // SAFETY: the caller owns the slot's data area (see above).
            unsafe { data.with_mut(granule, |d| payload.fill(&mut d[..len])) };
            hdr.kind.store(data_kind::INLINE, Ordering::Relaxed);
            hdr.len.store(len as u32, Ordering::Relaxed);
        } else {
            let mut r = self.data_pool.alloc(len)?;
            payload.fill(r.bytes_mut());
            let region = r.commit();
            let mut f = [0u8; frame::HEADER_LEN + frame::DESC_LEN];
            let n = frame::write_region(&region, 0, &mut f)?;
            // SAFETY: as above.
            unsafe { data.with_mut(granule, |d| d[..n].copy_from_slice(&f[..n])) };
            hdr.kind.store(data_kind::REGION, Ordering::Relaxed);
            hdr.len.store(n as u32, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Takes the payload out of task slot (s, k): inline bytes are copied, a region is adopted
    /// (its reference moves to the returned buffer, which views it in place).
    ///
    /// The caller must own the slot's data area by protocol; a payload can be taken once (the
    /// slot then holds none, so a later discard releases nothing twice).
    pub fn take_payload(&self, s: usize, k: usize) -> Result<Buffer> {
        self.take(s, k, false).map(Buffer::from)
    }

    /// [`Shared::take_payload`], a small inline payload by value (see [`OutcomeBytes`]).
    pub fn take_outcome(&self, s: usize, k: usize) -> Result<OutcomeBytes> {
        self.take(s, k, true)
    }

    fn take(&self, s: usize, k: usize, small: bool) -> Result<OutcomeBytes> {
        let hdr: &TaskHdr = self.view.task(s, k);
        let (data, granule, cap) = self.view.data(s, k);
        let len = (hdr.len.load(Ordering::Relaxed) as usize).min(cap);
        if small && len <= SMALL_OUTCOME && hdr.kind.load(Ordering::Relaxed) == data_kind::INLINE {
            // SAFETY: the caller owns the slot's data area (see above).
            let small = unsafe { data.with(granule, |d| OutcomeBytes::small(&d[..len])) };
            hdr.kind.store(0, Ordering::Relaxed);
            return Ok(small.expect("at most SMALL_OUTCOME bytes"));
        }
        // SAFETY: the caller owns the slot's data area (see above).
        let bytes = unsafe { data.with(granule, |d| d[..len].to_vec()) };
        match hdr.kind.load(Ordering::Relaxed) {
            data_kind::INLINE => {
                hdr.kind.store(0, Ordering::Relaxed);
                Ok(Buffer::from_vec(bytes).into())
            }
            data_kind::REGION => {
                let Body::Region(desc) = frame::read(&bytes)?.body else {
                    return Err(PoolError::Layout(
                        "a region payload without a region frame".into(),
                    ));
                };
                hdr.kind.store(0, Ordering::Relaxed);
                let region = Arc::new(self.mapper.adopt(&desc)?);
                Ok(Region::buffer(&region).into())
            }
            k => Err(PoolError::Layout(format!("task slot data kind {k}"))),
        }
    }

    /// Releases a payload nobody will read (a cancelled input, an abandoned output), after
    /// the binding's discard hook (see [`set_discard_hook`]) has seen it.
    pub fn discard_payload(&self, s: usize, k: usize) {
        let hook = DISCARD_HOOK.get();
        let kind = self.view.task(s, k).kind.load(Ordering::Relaxed);
        if (kind == data_kind::REGION || (kind == data_kind::INLINE && hook.is_some()))
            && let Ok(b) = self.take_payload(s, k)
            && let Some(h) = hook
        {
            h(b.as_slice());
        }
    }
}

/// A payload that writes itself into the place it travels in (a task slot or a data region),
/// so large payloads are copied once, from their source.
pub trait Fill {
    /// Its size in bytes.
    fn size(&self) -> usize;
    /// Writes exactly `size()` bytes into `out`.
    fn fill(&self, out: &mut [u8]);
}

impl Fill for &[u8] {
    fn size(&self) -> usize {
        self.len()
    }

    fn fill(&self, out: &mut [u8]) {
        out.copy_from_slice(self);
    }
}

impl Fill for Vec<u8> {
    fn size(&self) -> usize {
        self.len()
    }

    fn fill(&self, out: &mut [u8]) {
        out.copy_from_slice(self);
    }
}

#[cfg(not(mizu_loom))]
impl<B: mizu_wire::oob::Source, S: mizu_wire::oob::Source> Fill for mizu_wire::oob::Writer<B, S> {
    fn size(&self) -> usize {
        mizu_wire::oob::Writer::size(self)
    }

    fn fill(&self, out: &mut [u8]) {
        self.write(out);
    }
}

#[cfg(not(mizu_loom))]
impl Fill for mizu_wire::envelope::Envelope {
    fn size(&self) -> usize {
        self.len()
    }

    fn fill(&self, out: &mut [u8]) {
        self.write_to(out);
    }
}
