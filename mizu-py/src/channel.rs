//! `Channel`: a duplex pair of shared-memory rings between this process and one peer (see
//! `mizu_pool::Channel`); messages are Python payloads (see `codec`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use mizu_pool::{ChannelSendError, RecvError};

use crate::codec::{Outgoing, decode};
use crate::{err, forked};

/// How long one GIL-free wait lasts before signals are checked.
const SLICE: Duration = Duration::from_millis(50);

/// Send status: 0 sent, 1 full, 2 closed, 3 peer gone.
fn send_status(e: &ChannelSendError) -> PyResult<u8> {
    match e {
        ChannelSendError::Full => Ok(1),
        ChannelSendError::Closed => Ok(2),
        ChannelSendError::PeerGone => Ok(3),
        ChannelSendError::Storage(m) => Err(err(m)),
    }
}

/// One end of a channel.
#[pyclass(module = "pymizu._native", frozen)]
pub struct Channel {
    /// `None` once finished: closed, its launched peer exited and nothing left to receive
    /// (its shared memory is gone then, not when this object is).
    inner: Mutex<Option<mizu_pool::Channel>>,
    token: String,
    origin: mizu_pool::Origin,
}

impl Channel {
    /// Sends encoded messages without blocking: `(sent, status)` (0 all sent, 1 full, 2
    /// closed, 3 peer gone).
    fn send_payloads(&self, py: Python<'_>, bytes: &[Vec<u8>]) -> PyResult<(usize, u8)> {
        let r = py.detach(|| {
            let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            match c.as_mut() {
                Some(c) => c.send_batch(bytes.iter().map(Vec::as_slice)),
                None => Err(ChannelSendError::Closed),
            }
        });
        match r {
            Ok(n) if n == bytes.len() => Ok((n, 0)),
            Ok(n) => Ok((n, 1)),
            Err(e) => Ok((0, send_status(&e)?)),
        }
    }

    fn new(c: mizu_pool::Channel) -> Channel {
        Channel {
            token: c.token().to_owned(),
            inner: Mutex::new(Some(c)),
            origin: mizu_pool::Origin::here(),
        }
    }
}

#[pymethods]
impl Channel {
    /// Launches `program args… <token>` as the peer; returns once it attached.
    #[staticmethod]
    #[pyo3(signature = (program, args, capacity=None, slot_size=None, timeout=30.0))]
    fn launch(
        py: Python<'_>,
        program: String,
        args: Vec<String>,
        capacity: Option<i64>,
        slot_size: Option<i64>,
        timeout: f64,
    ) -> PyResult<Channel> {
        let t = crate::bounded_secs(timeout, "timeout")?;
        // (Out of range for the runtime's u64, as for its own bounds: its error says which.)
        let size = |v: Option<i64>, default: u64| v.map_or(default, |v| v.max(0) as u64);
        let capacity = size(capacity, mizu_pool::DEFAULT_CAPACITY);
        let slot_size = size(slot_size, mizu_pool::DEFAULT_SLOT_SIZE);
        py.detach(|| mizu_pool::Channel::launch(program, args, capacity, slot_size, t))
            .map(Channel::new)
            .map_err(err)
    }

    /// Attaches to the channel named by `token` (the peer's side).
    #[staticmethod]
    fn attach(py: Python<'_>, token: String) -> PyResult<Channel> {
        py.detach(|| mizu_pool::Channel::attach(&token))
            .map(Channel::new)
            .map_err(err)
    }

    /// The token a peer attaches with.
    #[getter]
    fn token(&self) -> String {
        self.token.clone()
    }

    /// Sends `[(pickle, buffers), ...]` without blocking: `(sent, status)` with the status of
    /// the first message not sent (0 when all were).
    fn send_batch(
        &self,
        py: Python<'_>,
        msgs: Vec<(Py<PyBytes>, Py<PyAny>)>,
    ) -> PyResult<(usize, u8)> {
        forked(self.origin)?;
        let bytes = msgs
            .iter()
            .map(|(p, b)| Outgoing::new(py, p.as_bytes(py), b.bind(py)).map(|o| o.to_vec()))
            .collect::<PyResult<Vec<_>>>()?;
        self.send_payloads(py, &bytes)
    }

    /// Sends values in the cross-language format (a channel to a peer of another language),
    /// without blocking: `(sent, status)` as `send_batch`.
    fn send_values(&self, py: Python<'_>, objs: Vec<Bound<'_, PyAny>>) -> PyResult<(usize, u8)> {
        forked(self.origin)?;
        let bytes = objs
            .iter()
            .enumerate()
            .map(|(i, o)| {
                crate::xarray::at(format!("message {i}: "), || crate::xlang::value_payload(o))
            })
            .collect::<PyResult<Vec<_>>>()?;
        self.send_payloads(py, &bytes)
    }

    /// Waits for a message: `(status, data, buffers)` — status 0 a Python payload (`data` and
    /// `buffers` to unpickle), 4 a cross-language value (`data` is the value), 1 timeout,
    /// 2 closed, 3 peer gone.
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<(u8, Py<PyAny>, Py<PyList>)> {
        forked(self.origin)?;
        let start = Instant::now();
        let timeout = crate::wait_secs(timeout, "timeout")?;
        let empty = |s: u8| {
            (
                s,
                PyBytes::new(py, b"").into_any().unbind(),
                PyList::empty(py).unbind(),
            )
        };
        loop {
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            let r = py.detach(|| {
                let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                match c.as_mut() {
                    Some(c) => c.recv(Some(slice)),
                    None => Err(RecvError::Closed),
                }
            });
            match r {
                Ok(buf) if mizu_pool::wire::envelope::is_envelope(&buf) => {
                    let (_, v) = crate::xlang::outcome(py, &buf)?;
                    return Ok((4, v, PyList::empty(py).unbind()));
                }
                Ok(buf) => {
                    let (d, b) = decode(py, buf)?.pair();
                    return Ok((0, d, b));
                }
                Err(RecvError::Timeout) => {
                    if left.is_some_and(|l| l <= slice) {
                        return Ok(empty(1));
                    }
                    py.check_signals()?;
                }
                Err(RecvError::Closed) => return Ok(empty(2)),
                Err(RecvError::PeerGone) => return Ok(empty(3)),
            }
        }
    }

    /// Closes this side: the peer reads what was sent, then sees the channel closed.
    fn close(&self, py: Python<'_>) {
        if self.origin.is_here() {
            py.detach(|| {
                if let Some(c) = self
                    .inner
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_mut()
                {
                    c.close();
                }
            });
        }
    }

    /// Closes, then waits up to `timeout` seconds for a launched peer to exit (killing it
    /// after that); returns its exit code (None if it was killed or this end attached).
    #[pyo3(signature = (timeout=5.0))]
    fn finish(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<i32>> {
        forked(self.origin)?;
        self.close(py);
        let timeout = crate::bounded_secs(timeout, "timeout")?;
        Ok(py.detach(|| {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let c = g.as_mut()?;
            let code = c.finish(timeout);
            // The peer is gone: with nothing left to read, the channel's shared memory goes
            // now.
            if !c.has_pending() {
                *g = None;
            }
            code
        }))
    }
}
