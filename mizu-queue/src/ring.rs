//! Single-producer single-consumer ring of fixed power-of-two slots.
//!
//! * `tail` (messages published) is written only by the producer, `head` (messages released)
//!   only by the consumer, each on its own cache line; each side keeps a cached copy of the
//!   other's index and reloads it only when the cache says full/empty.
//! * Publication is batched: [`Producer::write_with`] fills slots in place (zero copy) and
//!   [`Producer::publish`] makes them visible with one release store; the consumer releases
//!   slots every `capacity / 4` messages and before it parks.
//! * A parked flag per side (the [`ParkWord`] sleeper count) means a wake syscall happens only
//!   when the other side actually sleeps.
//!
//! Slot format: a little-endian `u32` payload length, 4 reserved bytes, then the payload.

use mizu_shm::sync::{AtomicU32, AtomicU64, HeapBytes, Ordering, SharedBytes};
use mizu_shm::{CacheLine, ParkWord};

/// Bytes at the start of each slot before the payload.
pub const SLOT_HEADER: usize = 8;
const RING_MAGIC: u64 = u64::from_le_bytes(*b"MIZURNG1");

/// Why a message could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// No free slot right now.
    Full,
    /// The payload exceeds the slot's capacity.
    TooLarge {
        /// Payload length.
        len: usize,
        /// Largest payload a slot holds.
        max: usize,
    },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Full => f.write_str("ring is full"),
            SendError::TooLarge { len, max } => write!(
                f,
                "payload of {len} bytes exceeds the slot payload limit of {max}"
            ),
        }
    }
}
impl std::error::Error for SendError {}

/// Immutable ring parameters, written once at initialisation.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RingParams {
    /// `b"MIZURNG1"`.
    pub magic: u64,
    /// Number of slots (a power of two).
    pub capacity: u64,
    /// Bytes per slot (a power of two, at least 16).
    pub slot_size: u64,
}

/// The ring's control block, `#[repr(C)]`, one cache line per independently written word.
#[repr(C)]
#[derive(Debug)]
pub struct RingHeader {
    tail: CacheLine<AtomicU64>,
    head: CacheLine<AtomicU64>,
    /// Woken by the producer: the consumer parks here when the ring is empty.
    consumer_park: CacheLine<ParkWord>,
    /// Woken by the consumer: the producer parks here when the ring is full.
    producer_park: CacheLine<ParkWord>,
    closed: CacheLine<AtomicU32>,
    params: CacheLine<RingParams>,
}

#[cfg(not(mizu_loom))]
// SAFETY: repr(C); atomics plus `params`, which is written once before the segment is shared;
// all-zero is a valid (not yet initialised, rejected by `attach`) value.
unsafe impl mizu_shm::ShmSafe for RingHeader {}

impl RingHeader {
    /// A header for a ring of `capacity` slots of `slot_size` bytes.
    pub fn new(capacity: u64, slot_size: u64) -> Self {
        RingHeader {
            tail: CacheLine(AtomicU64::new(0)),
            head: CacheLine(AtomicU64::new(0)),
            consumer_park: CacheLine(ParkWord::new()),
            producer_park: CacheLine(ParkWord::new()),
            closed: CacheLine(AtomicU32::new(0)),
            params: CacheLine(RingParams {
                magic: RING_MAGIC,
                capacity,
                slot_size,
            }),
        }
    }

    /// The immutable parameters.
    pub fn params(&self) -> &RingParams {
        &self.params.0
    }
}

/// Checks ring geometry; returns a message for the caller's error type.
pub fn check_geometry(capacity: u64, slot_size: u64) -> Result<(), String> {
    if !capacity.is_power_of_two() || capacity > 1 << 30 {
        return Err(format!(
            "ring capacity {capacity} must be a power of two no larger than 2^30"
        ));
    }
    if !slot_size.is_power_of_two() || !(16..=1 << 20).contains(&slot_size) {
        return Err(format!(
            "slot size {slot_size} must be a power of two between 16 and 1 MiB"
        ));
    }
    Ok(())
}

/// A view of a ring: its header and its slots, wherever they live.
#[derive(Clone, Copy)]
pub struct Ring<'a> {
    hdr: &'a RingHeader,
    slots: SharedBytes<'a>,
    mask: u64,
}

impl<'a> Ring<'a> {
    /// Binds a header and slot memory, checking that they agree.
    pub fn new(hdr: &'a RingHeader, slots: SharedBytes<'a>) -> Result<Self, String> {
        // `params` is plain data written once before the memory was shared.
        let p = hdr.params.0;
        if p.magic != RING_MAGIC {
            return Err(format!("ring header has magic {:#x}, not a ring", p.magic));
        }
        check_geometry(p.capacity, p.slot_size)?;
        if slots.count() as u64 != p.capacity || slots.granule() as u64 != p.slot_size {
            return Err(format!(
                "ring header says {}x{} bytes but its slot region holds {}x{}",
                p.capacity,
                p.slot_size,
                slots.count(),
                slots.granule()
            ));
        }
        Ok(Ring {
            hdr,
            slots,
            mask: p.capacity - 1,
        })
    }

    /// Number of slots.
    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Largest payload one message can carry.
    pub fn max_payload(&self) -> usize {
        self.slots.granule() - SLOT_HEADER
    }

    /// The producer's handle.
    ///
    /// # Safety
    /// No other producer of this ring may exist, in this process or any other, while the
    /// returned one lives: two producers would write the same slot. Owners of a ring make
    /// that true by a protocol of their own (a duplex end is claimed once; a pool's submitter
    /// record is taken by CAS); [`HeapRing::split`] is the safe way for a ring on the heap.
    pub unsafe fn producer(&self) -> Producer<'a> {
        let tail = self.hdr.tail.load(Ordering::Relaxed);
        Producer {
            ring: *self,
            tail,
            published: tail,
            cached_head: self.hdr.head.load(Ordering::Acquire),
        }
    }

    /// The consumer's handle.
    ///
    /// # Safety
    /// No other consumer of this ring may exist, in this process or any other, while the
    /// returned one lives (as for [`Ring::producer`]).
    pub unsafe fn consumer(&self) -> Consumer<'a> {
        let head = self.hdr.head.load(Ordering::Relaxed);
        Consumer {
            ring: *self,
            head,
            released: head,
            cached_tail: self.hdr.tail.load(Ordering::Acquire),
            release_every: (self.capacity() / 4).max(1),
        }
    }

    /// Whether the producer has closed the ring.
    pub fn is_closed(&self) -> bool {
        self.hdr.closed.load(Ordering::Acquire) != 0
    }

    /// The word the consumer parks on (the producer wakes it).
    pub fn consumer_park(&self) -> &'a ParkWord {
        &self.hdr.consumer_park
    }

    /// The word the producer parks on (the consumer wakes it).
    pub fn producer_park(&self) -> &'a ParkWord {
        &self.hdr.producer_park
    }
}

/// The writing side's process-local state.
pub struct Producer<'a> {
    ring: Ring<'a>,
    tail: u64,
    published: u64,
    cached_head: u64,
}

impl<'a> Producer<'a> {
    /// The ring this handle writes.
    pub fn ring(&self) -> Ring<'a> {
        self.ring
    }

    fn has_space(&mut self) -> bool {
        if self.tail - self.cached_head <= self.ring.mask {
            return true;
        }
        self.cached_head = self.ring.hdr.head.load(Ordering::Acquire);
        self.tail - self.cached_head <= self.ring.mask
    }

    /// Writes one message in place without publishing it: `f` gets the slot's payload area
    /// and returns how many bytes it wrote. Publish with [`Producer::publish`].
    pub fn write_with(&mut self, f: impl FnOnce(&mut [u8]) -> usize) -> Result<(), SendError> {
        if !self.has_space() {
            return Err(SendError::Full);
        }
        let idx = (self.tail & self.ring.mask) as usize;
        let max = self.ring.max_payload();
        // SAFETY: slot `tail` is free (tail - head < capacity) and unpublished, so the consumer
        // does not read it and no other producer exists; we have it exclusively.
        unsafe {
            self.ring.slots.with_mut(idx, |s| {
                let len = f(&mut s[SLOT_HEADER..]).min(max);
                s[..4].copy_from_slice(&(len as u32).to_le_bytes());
            })
        };
        self.tail += 1;
        Ok(())
    }

    /// Makes every written message visible and wakes the consumer if it sleeps.
    #[inline]
    pub fn publish(&mut self) {
        if self.published != self.tail {
            self.ring.hdr.tail.store(self.tail, Ordering::Release);
            self.published = self.tail;
            self.ring.hdr.consumer_park.wake_all();
        }
    }

    /// Makes every written message visible without waking the ring's consumer word — for
    /// consumers that park on a word of their own (a pool worker serving many rings), which
    /// the caller wakes instead.
    #[inline]
    pub fn publish_quiet(&mut self) {
        if self.published != self.tail {
            self.ring.hdr.tail.store(self.tail, Ordering::Release);
            self.published = self.tail;
        }
    }

    /// Sends one message now (copy into the slot, publish).
    pub fn try_send(&mut self, msg: &[u8]) -> Result<(), SendError> {
        let max = self.ring.max_payload();
        if msg.len() > max {
            return Err(SendError::TooLarge {
                len: msg.len(),
                max,
            });
        }
        self.write_with(|buf| {
            buf[..msg.len()].copy_from_slice(msg);
            msg.len()
        })?;
        self.publish();
        Ok(())
    }

    /// Sends as many of `msgs` as fit, with a single publication; returns how many were sent.
    pub fn send_batch<'m>(
        &mut self,
        msgs: impl IntoIterator<Item = &'m [u8]>,
    ) -> Result<usize, SendError> {
        let max = self.ring.max_payload();
        let mut n = 0;
        let mut res = Ok(());
        for m in msgs {
            if m.len() > max {
                res = Err(SendError::TooLarge { len: m.len(), max });
                break;
            }
            if self
                .write_with(|buf| {
                    buf[..m.len()].copy_from_slice(m);
                    m.len()
                })
                .is_err()
            {
                break;
            }
            n += 1;
        }
        self.publish();
        res.map(|_| n)
    }

    /// Free slots as last seen (may be stale low, never high).
    pub fn free_slots(&mut self) -> u64 {
        self.cached_head = self.ring.hdr.head.load(Ordering::Acquire);
        self.ring.capacity() - (self.tail - self.cached_head)
    }

    /// Whether a send would find a free slot now (refreshes the cached head).
    pub fn poll_space(&mut self) -> bool {
        self.has_space()
    }

    /// Publishes what is pending and marks the ring closed: the consumer gets every message
    /// sent so far, then "closed".
    pub fn close(&mut self) {
        self.publish();
        self.ring.hdr.closed.store(1, Ordering::Release);
        self.ring.hdr.consumer_park.wake_all();
    }
}

/// The reading side's process-local state.
///
/// It releases slots every `max(1, capacity / 4)` messages, so it never holds back more than
/// that: a consumer waiting on an empty ring can therefore never be why the producer is full,
/// and waiting needs no extra release (the loom ring model relies on exactly this).
pub struct Consumer<'a> {
    ring: Ring<'a>,
    head: u64,
    released: u64,
    cached_tail: u64,
    release_every: u64,
}

impl<'a> Consumer<'a> {
    /// The ring this handle reads.
    pub fn ring(&self) -> Ring<'a> {
        self.ring
    }

    /// Whether a message is ready (refreshes the cached tail when needed).
    #[inline]
    pub fn poll(&mut self) -> bool {
        if self.head != self.cached_tail {
            return true;
        }
        self.cached_tail = self.ring.hdr.tail.load(Ordering::Acquire);
        self.head != self.cached_tail
    }

    /// Reads the next message in place with `f`, then frees its slot. `None` when empty.
    #[inline]
    pub fn try_recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if !self.poll() {
            return None;
        }
        let idx = (self.head & self.ring.mask) as usize;
        let max = self.ring.max_payload();
        // SAFETY: slot `head` was published (head < tail, acquired) and is not released yet, so
        // the producer does not write it and we are the only consumer.
        let r = unsafe {
            self.ring.slots.with(idx, |s| {
                let len = (u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize).min(max);
                f(&s[SLOT_HEADER..SLOT_HEADER + len])
            })
        };
        self.head += 1;
        if self.head - self.released >= self.release_every {
            self.release();
        }
        Some(r)
    }

    /// Receives the next message into `out` (cleared first); false when empty.
    pub fn try_recv(&mut self, out: &mut Vec<u8>) -> bool {
        self.try_recv_with(|m| {
            out.clear();
            out.extend_from_slice(m);
        })
        .is_some()
    }

    /// Hands consumed slots back to the producer and wakes it if it sleeps.
    #[inline]
    pub fn release(&mut self) {
        if self.released != self.head {
            self.ring.hdr.head.store(self.head, Ordering::Release);
            self.released = self.head;
            self.ring.hdr.producer_park.wake_all();
        }
    }

    /// True once the producer closed the ring and every message before the close was read.
    pub fn is_drained_and_closed(&mut self) -> bool {
        // Read `closed` first: the producer published everything before setting it.
        self.ring.is_closed() && !self.poll()
    }
}

/// A ring on the heap, for loom models and property tests of the very same code.
pub struct HeapRing {
    hdr: Box<RingHeader>,
    slots: HeapBytes,
}

impl HeapRing {
    /// `capacity` slots of `slot_size` bytes.
    pub fn new(capacity: u64, slot_size: u64) -> Self {
        check_geometry(capacity, slot_size).expect("valid geometry");
        HeapRing {
            hdr: Box::new(RingHeader::new(capacity, slot_size)),
            slots: HeapBytes::new(capacity as usize, slot_size as usize),
        }
    }

    /// The ring view.
    pub fn ring(&self) -> Ring<'_> {
        Ring::new(&self.hdr, self.slots.view()).expect("heap ring is consistent")
    }

    /// The ring's two ends. Borrowing the ring mutably for as long as they live makes them the
    /// only producer and consumer.
    pub fn split(&mut self) -> (Producer<'_>, Consumer<'_>) {
        let r = self.ring();
        // SAFETY: `&mut self` is held while the handles live, and `ring()` (the only other way
        // to reach this ring) cannot be called meanwhile; safe code has no other handle.
        unsafe { (r.producer(), r.consumer()) }
    }
}
