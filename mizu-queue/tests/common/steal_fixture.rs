// A segment with one deque and one result ring per thief, shared by the cross-process steal
// test and the peer binary (included by path in both).

use mizu_queue::layout::{add_deque, add_ring, attach_deque, attach_ring, init_deque, init_ring};
use mizu_queue::{Deque, QueueError, Ring};
use mizu_shm::sync::{AtomicU32, Ordering};
use mizu_shm::{Layout, Segment};

pub const STEAL_KIND: u32 = u32::from_le_bytes(*b"STL1");
pub const THIEVES: usize = 2;

pub fn create(deque_cap: u64, ring_cap: u64) -> Result<Segment, QueueError> {
    let mut l = Layout::new(STEAL_KIND);
    l.add(128, 128)?; // extent 0: done flag
    add_deque(&mut l, deque_cap)?; // 1, 2
    for _ in 0..THIEVES {
        add_ring(&mut l, ring_cap, 64)?; // 3-4, 5-6
    }
    let seg = Segment::create(&l, true)?;
    // SAFETY: the segment was created just now; its token is not handed out yet.
    unsafe {
        init_deque(&seg, 1, 2)?;
        for t in 0..THIEVES {
            init_ring(&seg, 3 + 2 * t, 4 + 2 * t, ring_cap, 64)?;
        }
    }
    Ok(seg)
}

pub fn deque(seg: &Segment) -> Result<Deque<'_>, QueueError> {
    attach_deque(seg, 1, 2)
}

pub fn ring(seg: &Segment, thief: usize) -> Result<Ring<'_>, QueueError> {
    attach_ring(seg, 3 + 2 * thief, 4 + 2 * thief)
}

pub fn done(seg: &Segment) -> &AtomicU32 {
    seg.get(seg.extent(0).unwrap().offset).unwrap()
}

#[allow(dead_code)]
pub fn set_done(seg: &Segment) {
    done(seg).store(1, Ordering::Release);
}
