//! A process's cache of other processes' data segments ([`Mapper`]): a region of a segment
//! already held costs no `shm_open`, and the last few used stay mapped for a while.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::error::{Result, WireError};

use super::region::{Region, RegionDesc};
use super::segment::{ALIGN, DataSegment, IDLE_RELEASE};

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
            entry: crate::ledger::record(&d.name, d.offset, d.generation),
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
