//! Python payloads: a pickle (protocol 5) plus its out-of-band buffers, laid out in one task
//! payload so that a large one travels in a single shared-memory region, copied once from the
//! sender's buffers, and the receiver sees every buffer as a read-only view of that region.
//!
//! Layout (see `docs/python.md`, "Payload format"):
//! * `P` then the pickle bytes — no out-of-band buffers;
//! * `B`, 3 zero bytes, `u32` buffer count `n`, `u64` pickle length, then `n` pairs of `u64`
//!   (offset from the payload start, length), then the pickle, then each buffer at its
//!   offset, 64-byte aligned. All integers little-endian.

use std::ffi::c_int;

use arrow_buffer::Buffer;
use mizu_pool::Fill;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

const TAG_PLAIN: u8 = b'P';
const TAG_BUFFERS: u8 = b'B';
const ALIGN: usize = 64;
/// Pickles up to this size are handed to Python as `bytes`; larger ones as views.
const COPY_PICKLE_MAX: usize = 4096;

/// A read-only view of received bytes in shared memory (or of a small private copy). It keeps
/// the memory alive for as long as any view of it — a `memoryview`, a numpy array — exists.
#[pyclass(module = "pymizu._native", frozen)]
pub struct ShmBuffer {
    buf: Buffer,
}

#[pymethods]
impl ShmBuffer {
    /// # Safety
    /// Called by Python's buffer protocol with a valid `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("Py_buffer must not be null"));
        }
        let b = &slf.get().buf;
        // SAFETY: `view` is non-null and valid (buffer protocol contract); the pointer and
        // length describe immutable memory that `slf` (stored in view.obj with a new
        // reference by PyBuffer_FillInfo) keeps alive; readonly=1 refuses writable requests.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                b.as_ptr() as *mut std::ffi::c_void,
                b.len() as pyo3::ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// # Safety
    /// Called by Python's buffer protocol; nothing was allocated for the view.
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.buf.len()
    }

    fn __repr__(&self) -> String {
        format!("<pymizu shared buffer of {} bytes>", self.buf.len())
    }
}

impl ShmBuffer {
    /// A view of `buf`.
    pub fn new(buf: Buffer) -> ShmBuffer {
        ShmBuffer { buf }
    }

    /// The bytes, sharing the same memory.
    pub fn buffer(&self) -> Buffer {
        self.buf.clone()
    }
}

/// A payload to send: the pickle and the out-of-band buffers, written in place by [`Fill`].
pub struct Outgoing<'a> {
    pickle: &'a [u8],
    bufs: Vec<PyBuffer<u8>>,
    size: usize,
    /// Offsets of the buffers in the payload.
    at: Vec<usize>,
}

impl<'a> Outgoing<'a> {
    /// Checks the buffers (contiguous bytes) and lays the payload out.
    pub fn new(py: Python<'_>, pickle: &'a [u8], bufs: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut out = Outgoing {
            pickle,
            bufs: Vec::new(),
            size: 1 + pickle.len(),
            at: Vec::new(),
        };
        if bufs.is_none() {
            return Ok(out);
        }
        for b in bufs.try_iter()? {
            let b = b?;
            // `PickleBuffer.raw()` is a contiguous byte view of any buffer, whatever its dtype.
            let raw = match b.call_method0(pyo3::intern!(py, "raw")) {
                Ok(r) => r,
                Err(_) => b,
            };
            let pb = PyBuffer::<u8>::get(&raw)?;
            if !pb.is_c_contiguous() {
                return Err(PyBufferError::new_err(
                    "pymizu: an out-of-band buffer is not contiguous",
                ));
            }
            out.bufs.push(pb);
        }
        if out.bufs.is_empty() {
            return Ok(out);
        }
        let mut at = 16 + 16 * out.bufs.len() + pickle.len();
        for b in &out.bufs {
            at = at.next_multiple_of(ALIGN);
            out.at.push(at);
            at += b.len_bytes();
        }
        out.size = at;
        Ok(out)
    }
}

impl Fill for Outgoing<'_> {
    fn size(&self) -> usize {
        self.size
    }

    fn fill(&self, out: &mut [u8]) {
        if self.bufs.is_empty() {
            out[0] = TAG_PLAIN;
            out[1..].copy_from_slice(self.pickle);
            return;
        }
        out[..16].fill(0);
        out[0] = TAG_BUFFERS;
        out[4..8].copy_from_slice(&(self.bufs.len() as u32).to_le_bytes());
        out[8..16].copy_from_slice(&(self.pickle.len() as u64).to_le_bytes());
        for (i, (b, &at)) in self.bufs.iter().zip(&self.at).enumerate() {
            let e = 16 + 16 * i;
            out[e..e + 8].copy_from_slice(&(at as u64).to_le_bytes());
            out[e + 8..e + 16].copy_from_slice(&(b.len_bytes() as u64).to_le_bytes());
        }
        let p = 16 + 16 * self.bufs.len();
        out[p..p + self.pickle.len()].copy_from_slice(self.pickle);
        let mut end = p + self.pickle.len();
        for (b, &at) in self.bufs.iter().zip(&self.at) {
            out[end..at].fill(0);
            let n = b.len_bytes();
            // SAFETY: the exporter keeps buf_ptr..+len_bytes valid while the PyBuffer lives
            // (it does: `self` owns it); the buffer is C-contiguous (checked in `new`).
            let src = unsafe { std::slice::from_raw_parts(b.buf_ptr() as *const u8, n) };
            out[at..at + n].copy_from_slice(src);
            end = at + n;
        }
    }
}

fn bad(why: impl Into<String>) -> PyErr {
    PyValueError::new_err(format!("pymizu: malformed payload: {}", why.into()))
}

/// Decodes a received payload into `(pickle, buffers)` for `pickle.loads(pickle,
/// buffers=buffers)`. Input is untrusted: every offset is checked.
pub fn decode(py: Python<'_>, buf: Buffer) -> PyResult<(Py<PyAny>, Py<PyList>)> {
    let b = buf.as_slice();
    let view = |start: usize, len: usize| -> PyResult<Py<PyAny>> {
        if len <= COPY_PICKLE_MAX {
            Ok(PyBytes::new(py, &b[start..start + len]).into_any().unbind())
        } else {
            let v = ShmBuffer {
                buf: buf.slice_with_length(start, len),
            };
            Ok(Py::new(py, v)?.into_any())
        }
    };
    match b.first() {
        Some(&TAG_PLAIN) => Ok((view(1, b.len() - 1)?, PyList::empty(py).unbind())),
        Some(&TAG_BUFFERS) => {
            if b.len() < 16 {
                return Err(bad("header truncated"));
            }
            let n = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
            let plen = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
            let table_end = n
                .checked_mul(16)
                .and_then(|t| t.checked_add(16))
                .filter(|&e| e <= b.len())
                .ok_or_else(|| bad(format!("{n} buffers do not fit")))?;
            let pend = (table_end as u64)
                .checked_add(plen)
                .filter(|&e| e <= b.len() as u64)
                .ok_or_else(|| bad("pickle out of bounds"))? as usize;
            let list = PyList::empty(py);
            for i in 0..n {
                let e = 16 + 16 * i;
                let at = u64::from_le_bytes(b[e..e + 8].try_into().expect("8 bytes"));
                let len = u64::from_le_bytes(b[e + 8..e + 16].try_into().expect("8 bytes"));
                let end = at
                    .checked_add(len)
                    .filter(|&x| at >= pend as u64 && x <= b.len() as u64)
                    .ok_or_else(|| bad(format!("buffer {i} out of bounds")))?;
                let v = ShmBuffer {
                    buf: buf.slice_with_length(at as usize, (end - at) as usize),
                };
                list.append(Py::new(py, v)?)?;
            }
            Ok((view(table_end, pend - table_end)?, list.unbind()))
        }
        Some(t) => Err(bad(format!("unknown tag {t:#04x}"))),
        None => Err(bad("empty")),
    }
}

/// Encodes a payload into bytes (for paths that need an owned copy, e.g. channels).
pub fn encode_vec(o: &Outgoing<'_>) -> Vec<u8> {
    let mut v = vec![0u8; o.size()];
    o.fill(&mut v);
    v
}
