//! Bounded work-stealing deque (Chase–Lev, in the C11 formulation of Lê, Pop, Cohen and
//! Zappa Nardelli, 2013) over `u64` items in shared memory.
//!
//! The owner pushes and pops at the bottom; thieves in any process steal at the top with a
//! CAS. `top` only ever grows (64-bit), so a stale thief's CAS can never succeed against a
//! recycled value: the packed counter is what resists ABA. Items are atomics, so a thief's
//! speculative read of a slot the owner is rewriting is a benign (discarded) value, never a
//! data race.

use mizu_shm::CacheLine;
use mizu_shm::sync::{AtomicI64, AtomicU64, Ordering, fence};

const DEQUE_MAGIC: u64 = u64::from_le_bytes(*b"MIZUDEQ1");

/// Outcome of a steal attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steal {
    /// Nothing to steal.
    Empty,
    /// Took this item.
    Success(u64),
    /// Lost a race; trying again may succeed.
    Retry,
}

/// Control block of a deque, `#[repr(C)]`.
#[repr(C)]
#[derive(Debug)]
pub struct DequeHeader {
    top: CacheLine<AtomicI64>,
    bottom: CacheLine<AtomicI64>,
    params: CacheLine<[u64; 2]>,
}

#[cfg(not(mizu_loom))]
// SAFETY: repr(C); atomics plus params written once before sharing; zero is valid (and
// rejected by `Deque::new` as uninitialised).
unsafe impl mizu_shm::ShmSafe for DequeHeader {}

impl DequeHeader {
    /// A header for `capacity` items (a power of two).
    pub fn new(capacity: u64) -> Self {
        DequeHeader {
            top: CacheLine(AtomicI64::new(0)),
            bottom: CacheLine(AtomicI64::new(0)),
            params: CacheLine([DEQUE_MAGIC, capacity]),
        }
    }
}

/// A view of a deque: header plus item array.
#[derive(Clone, Copy)]
pub struct Deque<'a> {
    hdr: &'a DequeHeader,
    items: &'a [AtomicU64],
    mask: i64,
}

impl<'a> Deque<'a> {
    /// Binds a header and its item array, checking that they agree.
    pub fn new(hdr: &'a DequeHeader, items: &'a [AtomicU64]) -> Result<Self, String> {
        let [magic, cap] = hdr.params.0;
        if magic != DEQUE_MAGIC {
            return Err(format!("deque header has magic {magic:#x}, not a deque"));
        }
        if !cap.is_power_of_two() || cap > 1 << 30 || items.len() as u64 != cap {
            return Err(format!(
                "deque capacity {cap} does not match {} items or is not a power of two",
                items.len()
            ));
        }
        Ok(Deque {
            hdr,
            items,
            mask: cap as i64 - 1,
        })
    }

    /// Capacity in items.
    pub fn capacity(&self) -> usize {
        self.items.len()
    }

    fn slot(&self, i: i64) -> &AtomicU64 {
        &self.items[(i & self.mask) as usize]
    }

    /// Items present (a racy snapshot).
    pub fn len(&self) -> usize {
        let b = self.hdr.bottom.load(Ordering::Relaxed);
        let t = self.hdr.top.load(Ordering::Relaxed);
        (b - t).max(0) as usize
    }

    /// Whether the deque looks empty (a racy snapshot).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Owner: pushes at the bottom; gives the item back when full.
    pub fn push(&self, item: u64) -> Result<(), u64> {
        let b = self.hdr.bottom.load(Ordering::Relaxed);
        let t = self.hdr.top.load(Ordering::Acquire);
        if b - t > self.mask {
            return Err(item);
        }
        self.slot(b).store(item, Ordering::Relaxed);
        fence(Ordering::Release);
        self.hdr.bottom.store(b + 1, Ordering::Relaxed);
        Ok(())
    }

    /// Owner: pops at the bottom (LIFO).
    pub fn pop(&self) -> Option<u64> {
        let b = self.hdr.bottom.load(Ordering::Relaxed) - 1;
        self.hdr.bottom.store(b, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let t = self.hdr.top.load(Ordering::Relaxed);
        if t > b {
            self.hdr.bottom.store(b + 1, Ordering::Relaxed);
            return None;
        }
        let item = self.slot(b).load(Ordering::Relaxed);
        if t == b {
            // Last item: race the thieves for it.
            let won = self
                .hdr
                .top
                .compare_exchange(t, t + 1, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok();
            self.hdr.bottom.store(b + 1, Ordering::Relaxed);
            return won.then_some(item);
        }
        Some(item)
    }

    /// Owner: drops the items `keep` refuses; the others stay, in their order. A full deque of
    /// items that no longer mean anything (ids of tasks cancelled while queued) is so made
    /// usable again without anyone running them. Thieves may take some of the items
    /// meanwhile, as they may at any time. Returns how many were dropped.
    pub fn retain(&self, mut keep: impl FnMut(u64) -> bool) -> usize {
        let mut kept = Vec::with_capacity(self.len());
        let mut dropped = 0;
        while let Some(item) = self.pop() {
            if keep(item) {
                kept.push(item);
            } else {
                dropped += 1;
            }
        }
        // (Popped newest first: pushed back oldest first. Each fits: they came out of here.)
        for item in kept.into_iter().rev() {
            let _ = self.push(item);
        }
        dropped
    }

    /// A new owner, the previous one dead: makes `bottom ≥ top` again. An owner killed
    /// between the two writes of a `pop` can leave `bottom` below `top`; the items a dead
    /// owner was pushing or popping are then no longer in the deque (whoever uses it must
    /// be able to find that work another way). Safe against concurrent thieves: they only
    /// move `top`, and never while the deque looks empty, which it does whenever this
    /// changes anything.
    pub fn repair(&self) {
        let t = self.hdr.top.load(Ordering::Acquire);
        if self.hdr.bottom.load(Ordering::Relaxed) < t {
            self.hdr.bottom.store(t, Ordering::Release);
        }
    }

    /// Any process: steals one item at the top (FIFO).
    pub fn steal(&self) -> Steal {
        let t = self.hdr.top.load(Ordering::Acquire);
        fence(Ordering::SeqCst);
        let b = self.hdr.bottom.load(Ordering::Acquire);
        if t >= b {
            return Steal::Empty;
        }
        let item = self.slot(t).load(Ordering::Relaxed);
        match self
            .hdr
            .top
            .compare_exchange(t, t + 1, Ordering::SeqCst, Ordering::Relaxed)
        {
            Ok(_) => Steal::Success(item),
            Err(_) => Steal::Retry,
        }
    }
}

/// A deque on the heap, for loom models and property tests of the same code.
pub struct HeapDeque {
    hdr: Box<DequeHeader>,
    items: Box<[AtomicU64]>,
}

impl HeapDeque {
    /// A deque of `capacity` items (a power of two).
    pub fn new(capacity: u64) -> Self {
        HeapDeque {
            hdr: Box::new(DequeHeader::new(capacity)),
            items: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The deque view.
    pub fn deque(&self) -> Deque<'_> {
        Deque::new(&self.hdr, &self.items).expect("heap deque is consistent")
    }
}

#[cfg(all(test, not(mizu_loom)))]
mod tests {
    use super::*;

    /// An owner killed inside `pop`, after winning the last item and before putting `bottom`
    /// back, leaves `bottom` one below `top`; a new owner repairs that and the deque works.
    #[test]
    fn repair_after_an_owner_died_inside_pop() {
        let h = HeapDeque::new(4);
        let d = h.deque();
        d.push(7).unwrap();
        assert_eq!(d.steal(), Steal::Success(7));
        // What the dead owner left: it moved `top` past its `bottom - 1`.
        let t = d.hdr.top.load(Ordering::Relaxed);
        d.hdr.bottom.store(t - 1, Ordering::Relaxed);
        d.repair();
        assert!(d.is_empty());
        d.push(8).unwrap();
        d.push(9).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d.pop(), Some(9));
        assert_eq!(d.steal(), Steal::Success(8));
        assert_eq!(d.pop(), None);
        // A healthy deque is left as it is.
        d.push(10).unwrap();
        d.repair();
        assert_eq!(d.pop(), Some(10));
    }
}
