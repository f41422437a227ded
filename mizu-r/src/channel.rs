//! Channels: a duplex pair of shared-memory rings between this process and one peer (see
//! `mizu_pool::Channel`); messages are R payloads (see `codec`).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use extendr_api::Result;
use extendr_api::prelude::*;
use mizu_pool::{ChannelSendError, RecvError};

use crate::codec::Decoded;
use crate::decode::decode;
use crate::encode::Outgoing;
use crate::{forked, interrupt, rerr};

/// How long one wait lasts before Ctrl-C is checked.
const SLICE: Duration = Duration::from_millis(50);

/// One end of a channel.
pub struct RChannel {
    /// `None` once finished: closed, its launched peer exited and nothing left to receive
    /// (its shared memory is gone then, not at garbage collection).
    inner: RefCell<Option<mizu_pool::Channel>>,
    origin: mizu_pool::Origin,
    /// The peer is of another language (Python): messages are cross-language values.
    foreign: std::cell::Cell<bool>,
}

fn wrap(c: mizu_pool::Channel) -> Robj {
    ExternalPtr::new(RChannel {
        inner: RefCell::new(Some(c)),
        origin: mizu_pool::Origin::here(),
        foreign: std::cell::Cell::new(false),
    })
    .into()
}

fn chan(ch: &Robj) -> Result<&RChannel> {
    // SAFETY: `ch` is protected by the caller for the lifetime of the reference; the tag is
    // checked before the address is read.
    let c = unsafe { crate::handle::ext_ref::<RChannel>(ch.get()) }
        .ok_or_else(|| rerr("not a mizu channel (or one restored from a saved session)"))?;
    forked(c.origin)?;
    Ok(c)
}

pub(crate) fn channel_launch(
    program: &str,
    args: Vec<String>,
    capacity: Robj,
    timeout: f64,
) -> Result<Robj> {
    if timeout.is_nan() {
        return Err(rerr("`timeout` must be a number of seconds, not NaN"));
    }
    // An infinite (or huge) bound on the peer's start is a day.
    let t = Duration::try_from_secs_f64(timeout.clamp(0.0, 86_400.0)).map_err(rerr)?;
    // NULL: the runtime's default. (A negative count converts to 0, one beyond u64 to its
    // largest: the runtime's bounds say what it takes.)
    let cap = if capacity.is_null() {
        mizu_pool::DEFAULT_CAPACITY
    } else {
        let c = capacity
            .as_real()
            .filter(|c| !c.is_nan())
            .ok_or_else(|| rerr("`.capacity` must be a number of messages (or NULL)"))?;
        c as u64
    };
    mizu_pool::Channel::launch(program, args, cap, mizu_pool::DEFAULT_SLOT_SIZE, t)
        .map(wrap)
        .map_err(rerr)
}

pub(crate) fn channel_attach(token: &str) -> Result<Robj> {
    mizu_pool::Channel::attach(token).map(wrap).map_err(rerr)
}

pub(crate) fn channel_send_batch(ch: Robj, payloads: List) -> Result<Vec<i32>> {
    let c = chan(&ch)?;
    let bytes: Vec<Vec<u8>> = if c.foreign.get() {
        payloads
            .values()
            .enumerate()
            .map(|(i, v)| crate::xcall::message(&v, &format!("message {}", i + 1)))
            .collect::<Result<_>>()?
    } else {
        payloads
            .values()
            .map(|v| Outgoing::encode(&v).map(|o| o.to_vec()))
            .collect::<Result<_>>()?
    };
    let r = match c.inner.borrow_mut().as_mut() {
        Some(ch) => ch.send_batch(bytes.iter().map(Vec::as_slice)),
        None => Err(ChannelSendError::Closed),
    };
    Ok(match r {
        Ok(n) if n == bytes.len() => vec![n as i32, 0],
        Ok(n) => vec![n as i32, 1],
        Err(ChannelSendError::Full) => vec![0, 1],
        Err(ChannelSendError::Closed) => vec![0, 2],
        Err(ChannelSendError::PeerGone) => vec![0, 3],
        Err(ChannelSendError::Storage(m)) => return Err(rerr(m)),
    })
}

pub(crate) fn channel_recv(ch: Robj, timeout: f64) -> Result<List> {
    let c = chan(&ch)?;
    let start = Instant::now();
    let timeout = if timeout.is_infinite() || timeout.is_nan() {
        None
    } else {
        Some(Duration::try_from_secs_f64(timeout.max(0.0)).map_err(rerr)?)
    };
    let status = |s: i32| List::from_values([Robj::from(s), ().into()]);
    loop {
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        let r = match c.inner.borrow_mut().as_mut() {
            Some(ch) => ch.recv(Some(slice)),
            None => Err(RecvError::Closed),
        };
        match r {
            Ok(buf) => {
                return Ok(match decode(buf)? {
                    Decoded::Value(v) => List::from_values([Robj::from(0), v]),
                    Decoded::Text(t) => return Err(rerr(t)),
                });
            }
            Err(RecvError::Timeout) => {
                if left.is_some_and(|l| l <= slice) {
                    return Ok(status(1));
                }
                if interrupt::pending() {
                    return Ok(status(8));
                }
            }
            Err(RecvError::Closed) => return Ok(status(2)),
            Err(RecvError::PeerGone) => return Ok(status(3)),
        }
    }
}

pub(crate) fn channel_set_foreign(ch: Robj) -> Result<()> {
    chan(&ch)?.foreign.set(true);
    Ok(())
}

pub(crate) fn channel_close(ch: Robj) -> Result<()> {
    if let Some(c) = chan(&ch)?.inner.borrow_mut().as_mut() {
        c.close();
    }
    Ok(())
}

pub(crate) fn channel_finish(ch: Robj, timeout: f64) -> Result<Option<i32>> {
    let c = chan(&ch)?;
    let mut g = c.inner.borrow_mut();
    let Some(chl) = g.as_mut() else {
        return Ok(None);
    };
    let timeout = Duration::try_from_secs_f64(timeout.clamp(0.0, 86_400.0)).map_err(rerr)?;
    let code = chl.finish(timeout);
    // The peer is gone: with nothing left to read, the channel's shared memory goes now.
    if !chl.has_pending() {
        *g = None;
    }
    Ok(code)
}

pub(crate) fn channel_peer_pid(ch: Robj) -> Result<Option<f64>> {
    Ok(chan(&ch)?
        .inner
        .borrow_mut()
        .as_mut()
        .and_then(|c| c.child())
        .map(|c| f64::from(c.id())))
}
