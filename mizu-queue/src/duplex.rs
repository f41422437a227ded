//! A duplex pair of SPSC rings between two processes in one segment, with a registry of the
//! two ends so each side can tell whether the other is alive. This is the transport under
//! `mizu-pool`'s channels and the fixture of this crate's cross-process tests.
//!
//! Extents: 0 registry, 1–2 ring host→guest, 3–4 ring guest→host.

use std::sync::Arc;
use std::time::Duration;

use mizu_shm::{
    CacheLine, DeathWatch, Layout, ParkWord, ProcessId, Segment, ShmSafe, WaitError, Waiter,
};

use crate::error::QueueError;
use crate::layout::{add_ring, attach_ring, init_ring};
use crate::owned::{OwnedConsumer, OwnedProducer};
use crate::peer::PeerSlot;
use crate::ring::{Consumer, Producer, Ring, SendError};

/// Segment kind tag of a duplex.
pub const DUPLEX_KIND: u32 = u32::from_le_bytes(*b"DPX1");

#[repr(C)]
#[derive(Debug, Default)]
struct Registry {
    host: CacheLine<PeerSlot>,
    guest: CacheLine<PeerSlot>,
    joined: CacheLine<ParkWord>,
}

// SAFETY: repr(C) atomics only; zero is "nobody registered".
unsafe impl ShmSafe for Registry {}

fn peer(slot: &PeerSlot) -> Option<ProcessId> {
    slot.get().map(|(pid, nonce)| ProcessId::new(pid, nonce))
}

/// Which end of the duplex this process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The creator.
    Host,
    /// The process that joined by token.
    Guest,
}

/// Why a blocking receive returned without a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvError {
    /// Nothing arrived within the timeout.
    Timeout,
    /// The peer closed its sending ring and every message was read.
    Closed,
    /// The peer process died (every message it published was read first).
    PeerGone,
}

/// One end of a duplex channel.
pub struct Duplex {
    // Field order matters: the watch (which holds a segment Arc) stops before the segment drops.
    watch: Option<DeathWatch>,
    seg: Arc<Segment>,
    side: Side,
    /// Whether [`Duplex::split`] handed the ends out.
    split: std::sync::atomic::AtomicBool,
}

impl Duplex {
    /// Creates the segment with two rings of `capacity` slots of `slot_size` bytes and
    /// registers this process as the host.
    pub fn create(capacity: u64, slot_size: u64) -> Result<Self, QueueError> {
        let mut l = Layout::new(DUPLEX_KIND);
        l.add(std::mem::size_of::<Registry>() as u64, 128)?;
        add_ring(&mut l, capacity, slot_size)?;
        add_ring(&mut l, capacity, slot_size)?;
        let seg = Segment::create(&l, true)?;
        // SAFETY: the segment was created just now; its token is not handed out yet.
        unsafe {
            init_ring(&seg, 1, 2, capacity, slot_size)?;
            init_ring(&seg, 3, 4, capacity, slot_size)?;
        }
        let d = Duplex {
            watch: None,
            seg: Arc::new(seg),
            side: Side::Host,
            split: Default::default(),
        };
        let me = d.seg.me();
        d.registry()?.host.set(me.pid, me.nonce);
        Ok(d)
    }

    /// Joins the duplex named by `token` as the guest.
    pub fn join(token: &str) -> Result<Self, QueueError> {
        let seg = Segment::open(token, DUPLEX_KIND)?;
        attach_ring(&seg, 1, 2)?;
        attach_ring(&seg, 3, 4)?;
        let mut d = Duplex {
            watch: None,
            seg: Arc::new(seg),
            side: Side::Guest,
            split: Default::default(),
        };
        let reg = d.registry()?;
        let me = d.seg.me();
        if !reg.guest.claim(me.pid, me.nonce) {
            return Err(QueueError::Layout {
                segment: token.to_owned(),
                why: "a guest has already joined this duplex".into(),
            });
        }
        reg.joined.wake_all();
        if let Some(host) = peer(&reg.host) {
            d.watch_peer(host)?;
        }
        Ok(d)
    }

    fn registry(&self) -> Result<&Registry, QueueError> {
        Ok(self.seg.get(self.seg.extent(0)?.offset)?)
    }

    fn reg(&self) -> &Registry {
        self.registry().expect("registry validated at create/join")
    }

    fn watch_peer(&mut self, peer: ProcessId) -> Result<(), QueueError> {
        let seg = Arc::clone(&self.seg);
        self.watch = Some(DeathWatch::spawn(peer, move || {
            // Wake whoever sleeps on any of our words so they look at the peer's liveness.
            if let Ok(d) = DuplexView::new(&seg) {
                d.wake_everyone();
            }
        })?);
        Ok(())
    }

    /// The token a guest passes to [`Duplex::join`].
    pub fn token(&self) -> &str {
        self.seg.token()
    }

    /// The underlying segment.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Which end this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The other end, once it has registered.
    pub fn peer(&self) -> Option<ProcessId> {
        match self.side {
            Side::Host => peer(&self.reg().guest),
            Side::Guest => peer(&self.reg().host),
        }
    }

    /// Host: waits until a guest joins (or `check` fails, e.g. the launched child exited),
    /// then unlinks the segment's name so nothing can leak from here on, whatever dies.
    pub fn wait_guest<E>(
        &mut self,
        timeout: Duration,
        mut check: impl FnMut() -> Result<(), E>,
    ) -> Result<ProcessId, WaitError<E>> {
        let reg = self.reg();
        let mut w = Waiter::new(Duration::from_micros(50), Duration::from_millis(10));
        let guest = w.wait(&reg.joined, || peer(&reg.guest), Some(timeout), &mut check)?;
        let _ = self.seg.unlink();
        // Without a watch (no threads left, say) death is still noticed at the end of each
        // park slice, so a failure here only costs promptness.
        let _ = self.watch_peer(guest);
        Ok(guest)
    }

    /// The extents (header, slots) of this end's sending and receiving rings.
    fn ring_extents(&self) -> [(usize, usize); 2] {
        match self.side {
            Side::Host => [(1, 2), (3, 4)],
            Side::Guest => [(3, 4), (1, 2)],
        }
    }

    fn rings(&self) -> (Ring<'_>, Ring<'_>) {
        let [tx, rx] = self.ring_extents();
        let ring = |(h, s)| attach_ring(&self.seg, h, s).expect("validated at create/join");
        (ring(tx), ring(rx))
    }

    /// This end's producer of the sending ring and consumer of the receiving ring, once per
    /// duplex (`None` afterwards, as after [`Duplex::split_owned`]), so that they are this
    /// end's only ones.
    pub fn split(&self) -> Option<(Producer<'_>, Consumer<'_>)> {
        if self.split.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return None;
        }
        let (tx, rx) = self.rings();
        // SAFETY: an end belongs to one process (the creator; the one guest whose claim won)
        // and, in it, to this `Duplex`, which hands its handles out once.
        Some(unsafe { (tx.producer(), rx.consumer()) })
    }

    /// [`Duplex::split`] as handles that hold the segment themselves (to be kept beside the
    /// duplex in one structure).
    pub fn split_owned(&self) -> Option<(OwnedProducer, OwnedConsumer)> {
        if self.split.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return None;
        }
        let [tx, rx] = self.ring_extents();
        // SAFETY: as in `split`: this end's one producer and one consumer.
        unsafe {
            Some((
                OwnedProducer::new(self.seg.clone(), |s| attach_ring(s, tx.0, tx.1)).ok()?,
                OwnedConsumer::new(self.seg.clone(), |s| attach_ring(s, rx.0, rx.1)).ok()?,
            ))
        }
    }

    /// Whether the peer is registered and alive.
    pub fn peer_alive(&self) -> bool {
        self.peer().is_some_and(|p| p.is_alive())
    }

    fn peer_check(&self) -> Result<(), RecvError> {
        match self.peer() {
            Some(p) if !p.is_alive() => {
                // The survivor removes what the dead peer cannot: its lock file.
                p.reap();
                Err(RecvError::PeerGone)
            }
            _ => Ok(()),
        }
    }

    /// Receives one message with `f`, waiting at most `timeout` (forever when `None`).
    pub fn recv_with<R>(
        &self,
        rx: &mut Consumer<'_>,
        waiter: &mut Waiter,
        timeout: Option<Duration>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, RecvError> {
        // No release before sleeping is needed: a consumer holds fewer than `max(1, cap/4)`
        // unreleased slots, so while the ring is empty the producer never sees it full.
        let ring = rx.ring();
        let ready = waiter.wait(
            ring.consumer_park(),
            || {
                if rx.poll() {
                    Some(true)
                } else if ring.is_closed() {
                    Some(false)
                } else {
                    None
                }
            },
            timeout,
            || self.peer_check(),
        );
        match ready {
            Ok(true) => Ok(rx.try_recv_with(f).expect("polled ready")),
            Ok(false) => match rx.try_recv_with(f) {
                Some(r) => Ok(r),
                None => Err(RecvError::Closed),
            },
            Err(WaitError::TimedOut) => Err(RecvError::Timeout),
            Err(WaitError::Aborted(e)) => {
                // Death is sticky, but messages published before it are still delivered.
                rx.try_recv_with(f).ok_or(e)
            }
        }
    }

    /// Sends one message, waiting for space at most `timeout`.
    pub fn send(
        &self,
        tx: &mut Producer<'_>,
        waiter: &mut Waiter,
        timeout: Option<Duration>,
        msg: &[u8],
    ) -> Result<(), SendBlockingError> {
        match tx.try_send(msg) {
            Ok(()) => return Ok(()),
            Err(SendError::Full) => {}
            Err(e @ SendError::TooLarge { .. }) => return Err(SendBlockingError::Send(e)),
        }
        let ring = tx.ring();
        waiter
            .wait(
                ring.producer_park(),
                || tx.poll_space().then_some(()),
                timeout,
                || self.peer_check(),
            )
            .map_err(|e| match e {
                WaitError::TimedOut => SendBlockingError::Timeout,
                WaitError::Aborted(_) => SendBlockingError::PeerGone,
            })?;
        tx.try_send(msg).map_err(SendBlockingError::Send)
    }
}

/// Why a blocking send failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendBlockingError {
    /// No space within the timeout.
    Timeout,
    /// The peer died.
    PeerGone,
    /// The message cannot be sent at all.
    Send(SendError),
}

/// Borrowed view used by the death watch to wake sleepers.
struct DuplexView<'a> {
    rings: [Ring<'a>; 2],
    reg: &'a Registry,
}

impl<'a> DuplexView<'a> {
    fn new(seg: &'a Segment) -> Result<Self, QueueError> {
        Ok(DuplexView {
            rings: [attach_ring(seg, 1, 2)?, attach_ring(seg, 3, 4)?],
            reg: seg.get(seg.extent(0)?.offset)?,
        })
    }

    fn wake_everyone(&self) {
        for r in &self.rings {
            r.consumer_park().wake_all_unconditionally();
            r.producer_park().wake_all_unconditionally();
        }
        self.reg.joined.wake_all_unconditionally();
    }
}
