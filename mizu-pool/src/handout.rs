//! How a map's runners share out its elements: one cursor, chunks taken by `fetch_add`
//! (large first, smaller towards the end, so runners finish together), and the smallest
//! failing index, after which nothing more starts. Segment-free, so the loom model
//! `map_handout_runs_each_element_once` runs this code.

use std::ops::Range;

use mizu_shm::sync::{AtomicU32, AtomicU64, Ordering};

/// A map's control block (extent 0 of its segment).
#[repr(C)]
#[derive(Debug, Default)]
pub struct MapControl {
    cursor: AtomicU64,
    /// Elements.
    pub n: AtomicU64,
    /// A fixed chunk size, or 0 for adaptive chunks.
    pub chunk: AtomicU64,
    /// Bytes per typed result (0: results are returned, not written in place).
    pub elem: AtomicU64,
    /// Runner tasks sharing the elements.
    pub runners: AtomicU64,
    first_error: AtomicU64,
    cancel: AtomicU32,
    _pad: AtomicU32,
}

#[cfg(not(mizu_loom))]
// SAFETY: atomics only, repr(C); zero is valid.
unsafe impl mizu_shm::ShmSafe for MapControl {}

impl MapControl {
    /// The control block of a map of `n` elements shared by `runners` runners.
    pub fn new(n: u64, chunk: u64, elem: u64, runners: u64) -> Self {
        MapControl {
            n: AtomicU64::new(n),
            chunk: AtomicU64::new(chunk),
            elem: AtomicU64::new(elem),
            runners: AtomicU64::new(runners),
            first_error: AtomicU64::new(u64::MAX),
            ..Default::default()
        }
    }

    /// The next chunk for a runner, `None` once every element was handed out, one failed
    /// before them, or the map was cancelled. Each element is in exactly one chunk.
    pub fn next_chunk(&self) -> Option<Range<u64>> {
        if self.cancelled() {
            return None;
        }
        let n = self.n.load(Ordering::Acquire);
        let fixed = self.chunk.load(Ordering::Relaxed);
        // A chunk larger than the map could wrap the cursor round to elements already handed
        // out.
        let chunk = if fixed > 0 {
            fixed.min(n.max(1))
        } else {
            let left = n.saturating_sub(self.cursor.load(Ordering::Relaxed));
            (left
                / self
                    .runners
                    .load(Ordering::Relaxed)
                    .max(1)
                    .saturating_mul(2))
            .max(1)
        };
        let start = self.cursor.fetch_add(chunk, Ordering::AcqRel);
        (start < n.min(self.first_error.load(Ordering::Acquire)))
            .then(|| start..start.saturating_add(chunk).min(n))
    }

    /// Whether element `i` of a chunk may still start: after a failure only the elements
    /// before it run, so the error reported is always the smallest failing index — what a
    /// sequential run would report.
    pub fn may_run(&self, i: u64) -> bool {
        !self.cancelled() && i <= self.first_error.load(Ordering::Acquire)
    }

    /// Element `i` failed.
    pub fn fail(&self, i: u64) {
        self.first_error.fetch_min(i, Ordering::AcqRel);
    }

    /// Stops every runner before its next element.
    pub fn cancel(&self) {
        self.cancel.store(1, Ordering::Release);
    }

    /// Whether the map was cancelled.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire) != 0
    }

    /// How far the cursor got (an element index, at most `n`).
    pub fn handed_out(&self) -> u64 {
        self.cursor
            .load(Ordering::Acquire)
            .min(self.n.load(Ordering::Relaxed))
    }
}
