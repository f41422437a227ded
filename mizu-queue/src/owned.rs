//! Ring ends and deques that own (a share of) the segment they live in, so that a long-lived
//! structure — a pool's submitter, a worker, a channel — can keep them beside other fields
//! without borrowing: the segment is mapped for as long as the handle lives.
//!
//! The handle's lifetime never shows: a ring end is used inside [`OwnedProducer::with`] /
//! [`OwnedConsumer::with`], whose closure works for every lifetime and so cannot keep the end
//! (or a ring view, a park word, a slot) past the call; a deque is lent for a borrow of the
//! owner. Nothing here can make a second producer or consumer: the constructors carry the
//! same contract as [`Ring::producer`] and [`Ring::consumer`].

use std::sync::Arc;

use mizu_shm::Segment;

use crate::deque::Deque;
use crate::ring::{Consumer, Producer, Ring};

/// A ring's producer with the segment it writes into.
pub struct OwnedProducer {
    // Declared before `_segment`: dropped while the mapping still exists.
    end: Producer<'static>,
    _segment: Arc<Segment>,
}

/// A ring's consumer with the segment it reads from.
pub struct OwnedConsumer {
    end: Consumer<'static>,
    _segment: Arc<Segment>,
}

/// A work-stealing deque with the segment it lives in.
pub struct OwnedDeque {
    deque: Deque<'static>,
    _segment: Arc<Segment>,
}

/// Lets a handle made from a borrow of `segment` live as long as `segment` is held beside it.
///
/// # Safety
/// `T` must borrow nothing but `segment`'s mapping, and the result must be stored together
/// with (and dropped before) an `Arc` of `segment`, never handed out with its `'static`
/// lifetime.
unsafe fn extend<T, U>(value: T) -> U {
    // SAFETY: `T` and `U` are the same type up to a lifetime (the callers below); the
    // caller's contract keeps the mapping alive for as long as the value.
    unsafe { std::mem::transmute_copy(&std::mem::ManuallyDrop::new(value)) }
}

impl OwnedProducer {
    /// The producer of the ring `ring` finds in `segment`.
    ///
    /// # Safety
    /// As for [`Ring::producer`]: no other producer of that ring may exist, in any process,
    /// while this one lives.
    pub unsafe fn new<E>(
        segment: Arc<Segment>,
        ring: impl for<'a> FnOnce(&'a Segment) -> Result<Ring<'a>, E>,
    ) -> Result<Self, E> {
        let r = ring(&segment)?;
        // SAFETY: the caller keeps the one-producer rule; the producer borrows only the
        // mapping, which `_segment` keeps alive beside it (see `extend`).
        let end = unsafe { extend::<Producer<'_>, Producer<'static>>(r.producer()) };
        Ok(OwnedProducer {
            end,
            _segment: segment,
        })
    }

    /// Runs `f` with the producer.
    #[inline]
    pub fn with<R>(&mut self, f: impl FnOnce(&mut Producer<'_>) -> R) -> R {
        f(&mut self.end)
    }
}

impl OwnedConsumer {
    /// The consumer of the ring `ring` finds in `segment`.
    ///
    /// # Safety
    /// As for [`Ring::consumer`]: no other consumer of that ring may exist, in any process,
    /// while this one lives.
    pub unsafe fn new<E>(
        segment: Arc<Segment>,
        ring: impl for<'a> FnOnce(&'a Segment) -> Result<Ring<'a>, E>,
    ) -> Result<Self, E> {
        let r = ring(&segment)?;
        // SAFETY: as for `OwnedProducer::new`.
        let end = unsafe { extend::<Consumer<'_>, Consumer<'static>>(r.consumer()) };
        Ok(OwnedConsumer {
            end,
            _segment: segment,
        })
    }

    /// Runs `f` with the consumer.
    #[inline]
    pub fn with<R>(&mut self, f: impl FnOnce(&mut Consumer<'_>) -> R) -> R {
        f(&mut self.end)
    }
}

impl OwnedDeque {
    /// The deque `deque` finds in `segment`. (A deque has one owner by the protocol of whoever
    /// lays it out; every other process may only steal, which any handle allows.)
    pub fn new<E>(
        segment: Arc<Segment>,
        deque: impl for<'a> FnOnce(&'a Segment) -> Result<Deque<'a>, E>,
    ) -> Result<Self, E> {
        let d = deque(&segment)?;
        // SAFETY: the deque view borrows only the mapping, which `_segment` keeps alive beside
        // it; it is lent out only for borrows of `self` (see `get`).
        let deque = unsafe { extend::<Deque<'_>, Deque<'static>>(d) };
        Ok(OwnedDeque {
            deque,
            _segment: segment,
        })
    }

    /// The deque, for as long as `self` is borrowed.
    #[inline]
    pub fn get(&self) -> Deque<'_> {
        self.deque
    }
}
