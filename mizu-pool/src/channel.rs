//! Channels: a duplex pair of SPSC rings between this process and one peer (launched by us or
//! attached by token). `send` never blocks; `recv` waits with a timeout. Messages are bytes:
//! one that fits a ring slot is copied into it behind a one-byte tag (`RAW`); larger ones
//! travel through `mizu-wire` data segments, as a wire frame in the slot (which never starts
//! with that tag).

use std::ffi::OsString;
use std::mem::ManuallyDrop;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_buffer::Buffer;
use mizu_queue::{Duplex, OwnedConsumer, OwnedProducer, RecvError, SendError};
use mizu_shm::Waiter;
use mizu_wire::{DataPool, Mapper, Value, read_value, write_value};

use crate::error::{PoolError, Result};
use crate::origin::Origin;

/// First byte of a message stored raw in its ring slot (a wire frame starts with `M`).
const RAW: u8 = 0;

/// Why a send did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelSendError {
    /// The peer's ring is full now; nothing was sent.
    #[error("channel is full")]
    Full,
    /// The peer process is gone (sticky).
    #[error("the peer process is gone")]
    PeerGone,
    /// This side closed the channel.
    #[error("the channel is closed")]
    Closed,
    /// The message could not be stored.
    #[error("cannot send: {0}")]
    Storage(String),
}

/// One end of a channel, as the process that made it uses it.
struct End {
    tx: OwnedProducer,
    rx: OwnedConsumer,
    duplex: Duplex,
    waiter: Waiter,
    pool: Arc<DataPool>,
    mapper: Mapper,
    child: Option<Child>,
    closed: bool,
    gone: bool,
}

impl End {
    fn wrap(duplex: Duplex, child: Option<Child>) -> End {
        let (tx, rx) = duplex
            .split_owned()
            .expect("a new duplex's ends are not taken yet");
        End {
            tx,
            rx,
            duplex,
            waiter: Waiter::new(Duration::from_micros(50), Duration::from_millis(10)),
            pool: Arc::new(DataPool::new(16 << 20)),
            mapper: Mapper::new(),
            child,
            closed: false,
            gone: false,
        }
    }

    fn launch(
        program: impl Into<OsString>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        capacity: u64,
        slot_size: u64,
        timeout: Duration,
    ) -> Result<End> {
        let (capacity, slot_size) = ring_shape(capacity, slot_size)?;
        let mut d = Duplex::create(capacity, slot_size).map_err(queue_err)?;
        let program = program.into();
        let mut child = Command::new(&program)
            .args(args.into_iter().map(Into::into))
            .arg(d.token())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| PoolError::PeerLaunch(format!("{program:?}: {e}")))?;
        d.wait_guest(timeout, || match child.try_wait() {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        })
        .map_err(|e| PoolError::PeerLaunch(format!("it did not attach: {e:?}")))?;
        Ok(End::wrap(d, Some(child)))
    }

    fn attach(token: &str) -> Result<End> {
        let d = Duplex::join(token).map_err(queue_err)?;
        // What this end adopts is recorded, so that the other end gives it back should this
        // process be killed while holding it.
        mizu_wire::ledger::enable_until_exit();
        Ok(End::wrap(d, None))
    }

    fn data_pool(&self) -> &DataPool {
        &self.pool
    }

    fn token(&self) -> &str {
        self.duplex.token()
    }

    fn child(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    fn peer_dead(&mut self) -> bool {
        if !self.gone && self.duplex.peer().is_some_and(|p| !p.is_alive()) {
            self.peer_gone();
        }
        self.gone
    }

    /// The peer died: what it held of ours (its ledger) comes back now, not when this end
    /// drops.
    fn peer_gone(&mut self) {
        if !self.gone {
            self.gone = true;
            if let Some(p) = self.duplex.peer() {
                mizu_wire::ledger::release_dead(Some(&[p.pid]));
            }
        }
    }

    fn send(&mut self, msg: &[u8]) -> Result<(), ChannelSendError> {
        self.send_batch(std::iter::once(msg)).and_then(|n| {
            if n == 1 {
                Ok(())
            } else {
                Err(ChannelSendError::Full)
            }
        })
    }

    fn send_batch<'m>(
        &mut self,
        msgs: impl IntoIterator<Item = &'m [u8]>,
    ) -> Result<usize, ChannelSendError> {
        if self.closed {
            return Err(ChannelSendError::Closed);
        }
        // Liveness costs syscalls: it is checked only when nothing could be sent (below).
        if self.gone {
            return Err(ChannelSendError::PeerGone);
        }
        let mut n = 0;
        for m in msgs {
            let mut res = Ok(0);
            let pool = &self.pool;
            let wrote = self.tx.with(|tx| {
                tx.write_with(|slot| {
                    res = if m.len() < slot.len() {
                        slot[0] = RAW;
                        slot[1..=m.len()].copy_from_slice(m);
                        Ok(m.len() + 1)
                    } else {
                        let v = Value::Bytes(Buffer::from_slice_ref(m));
                        write_value(&v, 0, slot, pool).map_err(|e| e.to_string())
                    };
                    *res.as_ref().unwrap_or(&0)
                })
            });
            match (wrote, res) {
                (Ok(()), Ok(_)) => n += 1,
                (Err(SendError::Full), _) => break,
                (_, Err(e)) => {
                    self.tx.with(|tx| tx.publish());
                    return Err(ChannelSendError::Storage(e));
                }
                (Err(e), _) => return Err(ChannelSendError::Storage(e.to_string())),
            }
        }
        self.tx.with(|tx| tx.publish());
        if n == 0 && self.peer_dead() {
            return Err(ChannelSendError::PeerGone);
        }
        Ok(n)
    }

    fn recv(&mut self, timeout: Option<Duration>) -> Result<Buffer, RecvError> {
        let (mapper, duplex, waiter) = (&self.mapper, &self.duplex, &mut self.waiter);
        let got = self.rx.with(|rx| {
            duplex.recv_with(rx, waiter, timeout, |m| {
                match m.split_first() {
                    // From a `Vec`: `from_slice_ref` makes a 64-byte-aligned allocation, which
                    // costs ~40 ns more (glibc's slow path) on every message.
                    Some((&RAW, raw)) => Ok(Buffer::from_vec(raw.to_vec())),
                    _ => read_value(m, mapper).map(|r| match r.value {
                        Value::Bytes(b) => b,
                        _ => Buffer::from_vec(Vec::<u8>::new()),
                    }),
                }
            })
        });
        match got {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(_)) => Err(RecvError::Closed),
            Err(e) => {
                if e == RecvError::PeerGone {
                    self.peer_gone();
                }
                Err(e)
            }
        }
    }

    fn has_pending(&mut self) -> bool {
        self.rx.with(|rx| rx.poll())
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.tx.with(|tx| tx.close());
            // Nothing more is sent from this end: its data segments go as soon as the peer has
            // read what is in flight (at once if it has), not when this end is dropped.
            self.pool.detach();
        }
    }
}

impl Drop for End {
    fn drop(&mut self) {
        self.close();
        if let Some(mut c) = self.child.take() {
            let t0 = Instant::now();
            let exited = loop {
                if crate::pool::exited(&mut c) {
                    break true;
                }
                if t0.elapsed() >= Duration::from_secs(2) {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            if !exited {
                let _ = c.kill();
                let _ = c.wait();
            }
            // A peer killed (by us or anyone) leaves its lock file and data segments.
            mizu_wire::ledger::release_dead(Some(&[c.id()]));
            let _ = mizu_shm::prune_of(&[c.id()]);
        }
        // This end's data segments were kept idle for reuse until now.
        mizu_wire::store::give_back_idle_now();
    }
}

/// One end of a channel.
///
/// It belongs to the process that made it: a forked child's copy cannot be used
/// ([`Channel::check_origin`]) and, dropped there, touches nothing (the peer and the rings are
/// the parent's).
pub struct Channel {
    end: ManuallyDrop<End>,
    origin: Origin,
}

impl Channel {
    fn new(end: End) -> Channel {
        Channel {
            end: ManuallyDrop::new(end),
            origin: Origin::here(),
        }
    }

    /// Creates a channel and launches `program args… <token>` as its peer; returns once the
    /// peer has attached (or fails if it exits first or takes longer than `timeout`). Each
    /// direction holds `capacity` messages (at least 2) in slots of `slot_size` bytes, both
    /// rounded up to a power of two ([`DEFAULT_CAPACITY`] and [`DEFAULT_SLOT_SIZE`] suit most
    /// uses).
    pub fn launch(
        program: impl Into<OsString>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        capacity: u64,
        slot_size: u64,
        timeout: Duration,
    ) -> Result<Channel> {
        End::launch(program, args, capacity, slot_size, timeout).map(Channel::new)
    }

    /// Attaches to a channel whose token this process was given.
    pub fn attach(token: &str) -> Result<Channel> {
        End::attach(token).map(Channel::new)
    }

    /// `Err(PoolError::Forked)` in a forked child of the process that made this end.
    pub fn check_origin(&self) -> Result<()> {
        self.origin.check()
    }

    /// This end's data segments (where large messages go).
    pub fn data_pool(&self) -> &DataPool {
        self.end.data_pool()
    }

    /// The token a peer passes to [`Channel::attach`].
    pub fn token(&self) -> &str {
        self.end.token()
    }

    /// The launched peer process, if this end launched it.
    pub fn child(&mut self) -> Option<&mut Child> {
        self.end.child()
    }

    /// Sends one message without blocking.
    pub fn send(&mut self, msg: &[u8]) -> Result<(), ChannelSendError> {
        self.end.send(msg)
    }

    /// Sends as many messages as fit now with one publication; returns how many were sent.
    pub fn send_batch<'m>(
        &mut self,
        msgs: impl IntoIterator<Item = &'m [u8]>,
    ) -> Result<usize, ChannelSendError> {
        self.end.send_batch(msgs)
    }

    /// Receives one message, waiting at most `timeout` (forever when `None`). `Closed` once the
    /// peer closed and everything it sent was read; `PeerGone` (sticky) once it died and
    /// everything it published was read.
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Buffer, RecvError> {
        self.end.recv(timeout)
    }

    /// Whether a message is waiting to be received.
    pub fn has_pending(&mut self) -> bool {
        self.end.has_pending()
    }

    /// Closes this side: the peer reads what was sent, then `Closed`.
    pub fn close(&mut self) {
        self.end.close()
    }

    /// Closes this side, then waits up to `timeout` for a launched peer to exit, killing it
    /// after that; the peer is reaped and what it left is removed. Returns its exit code:
    /// `None` when it was killed (or died of a signal) or when this end attached.
    pub fn finish(&mut self, timeout: Duration) -> Option<i32> {
        self.end.close();
        let child = self.end.child()?;
        let t0 = Instant::now();
        let code = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break st.code();
            }
            if t0.elapsed() >= timeout {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let pid = child.id();
        mizu_wire::ledger::release_dead(Some(&[pid]));
        let _ = mizu_shm::prune_of(&[pid]);
        code
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if self.origin.is_here() {
            // SAFETY: dropped once, here; `end` is never used again.
            unsafe { ManuallyDrop::drop(&mut self.end) };
        }
    }
}

/// Messages each direction of a channel holds unless its maker says otherwise.
pub const DEFAULT_CAPACITY: u64 = 1024;
/// Bytes of a channel's ring slot unless its maker says otherwise: a message shorter than
/// this travels in the ring itself, a longer one through a data segment region (which costs
/// ~1.5 µs more each way). 1 KiB keeps the small dicts, strings and records programs pass in
/// the ring; the two rings of a default channel take 2 MiB of `/dev/shm`.
pub const DEFAULT_SLOT_SIZE: u64 = 1024;

/// A channel's rings as asked (`capacity` messages, `slot_size` bytes each), each rounded up
/// to the power of two the rings need; a clear error for what no ring can be.
fn ring_shape(capacity: u64, slot_size: u64) -> Result<(u64, u64)> {
    const MAX_CAPACITY: u64 = 1 << 30;
    const SLOTS: std::ops::RangeInclusive<u64> = 16..=(1 << 20);
    if !(1..=MAX_CAPACITY).contains(&capacity) {
        return Err(PoolError::Config(format!(
            "a channel's capacity must be 1..={MAX_CAPACITY} messages, got {capacity}"
        )));
    }
    if !SLOTS.contains(&slot_size) {
        return Err(PoolError::Config(format!(
            "a channel's slot_size must be {}..={} bytes, got {slot_size}",
            SLOTS.start(),
            SLOTS.end()
        )));
    }
    Ok((
        capacity.max(2).next_power_of_two(),
        slot_size.next_power_of_two(),
    ))
}

fn queue_err(e: mizu_queue::QueueError) -> PoolError {
    match e {
        mizu_queue::QueueError::Shm(s) => PoolError::Shm(s),
        other => PoolError::Layout(other.to_string()),
    }
}
