//! Python payloads: a pickle (protocol 5) plus its out-of-band buffers, laid out in one task
//! payload so that a large one travels in a single shared-memory region, copied once from the
//! sender's buffers, and the receiver sees every buffer as a read-only view of that region.
//!
//! Layout (see `docs/python.md`, "Payload format"):
//! * `P` then the pickle bytes — no out-of-band buffers;
//! * `B`, 3 zero bytes, `u32` buffer count `n`, `u64` pickle length, then `n` pairs of `u64`
//!   (offset from the payload start, length), then the pickle, then each buffer at its
//!   offset, 64-byte aligned. All integers little-endian. Receivers parse it with
//!   `mizu_pool::wire::oob` (fuzzed there).
//!
//! A buffer that views a region this process holds (a shared object, an array received from
//! another process) travels by reference: its offset has the top bit set, and at that offset
//! is the region's 64-byte descriptor (carrying a counted reference, which the receiver
//! adopts) and the `u64` offset of the buffer in the region.

use std::sync::Arc;

use arrow_buffer::Buffer;
use mizu_pool::Fill;
use mizu_pool::wire::oob::{self, Dialect, PY_BY_REF as BY_REF, Place, REF_RECORD};
use mizu_pool::wire::{Region, RegionDesc};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;

use crate::shmbuf::ShmBuffer;
use pyo3::types::{PyBytes, PyList};

const TAG_PLAIN: u8 = b'P';
pub(crate) const TAG_BUFFERS: u8 = b'B';
/// Buffers at least this large that view a region this process holds go by reference.
const REF_MIN: usize = 4096;
const ALIGN: usize = 64;
/// Pickles up to this size are handed to Python as `bytes`; larger ones as views.
const COPY_PICKLE_MAX: usize = 4096;

/// A payload to send: the pickle and the out-of-band buffers, written in place by [`Fill`].
pub struct Outgoing<'a> {
    pickle: &'a [u8],
    bufs: Vec<PyBuffer<u8>>,
    size: usize,
    /// Offsets of the buffers in the payload.
    at: Vec<usize>,
    /// Per buffer: the region it views and where in it, when it goes by reference.
    refs: Vec<Option<(Arc<Region>, usize)>>,
    /// Per buffer: whether it is writable shared memory (`pymizu.empty`/`zeros`).
    writable: Vec<bool>,
}

impl<'a> Outgoing<'a> {
    /// Checks the buffers (contiguous bytes) and lays the payload out.
    pub fn new(py: Python<'_>, pickle: &'a [u8], bufs: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut out = Outgoing {
            pickle,
            bufs: Vec::new(),
            size: 1 + pickle.len(),
            at: Vec::new(),
            refs: Vec::new(),
            writable: Vec::new(),
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
            let n = b.len_bytes();
            // Writable shared memory (every other view of shared memory is read-only) goes by
            // reference whatever its size, and is never copied: tasks may be writing it.
            let writable = !b.readonly();
            let shared = (n >= REF_MIN || writable)
                .then(|| Region::containing(b.buf_ptr().cast_const().cast::<u8>()))
                .flatten()
                .filter(|(r, off)| off + n <= r.len());
            let writable = writable && shared.is_some();
            let by_ref = shared.filter(|(r, _)| r.still_named());
            if writable && by_ref.is_none() {
                return Err(PyValueError::new_err(
                    "pymizu: a writable shared array whose memory is being released cannot be sent",
                ));
            }
            at = at.next_multiple_of(ALIGN);
            out.at.push(at);
            at += if by_ref.is_some() { REF_RECORD } else { n };
            out.refs.push(by_ref);
            out.writable.push(writable);
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
        for (i, ((b, &at), r)) in self.bufs.iter().zip(&self.at).zip(&self.refs).enumerate() {
            let e = 16 + 16 * i;
            let flag = match (r, self.writable[i]) {
                (Some(_), true) => BY_REF | oob::PY_WRITABLE_REF,
                (Some(_), false) => BY_REF,
                (None, _) => 0,
            };
            out[e..e + 8].copy_from_slice(&(at as u64 | flag).to_le_bytes());
            out[e + 8..e + 16].copy_from_slice(&(b.len_bytes() as u64).to_le_bytes());
        }
        let p = 16 + 16 * self.bufs.len();
        out[p..p + self.pickle.len()].copy_from_slice(self.pickle);
        let mut end = p + self.pickle.len();
        for ((b, &at), r) in self.bufs.iter().zip(&self.at).zip(&self.refs) {
            out[end..at].fill(0);
            if let Some((region, off)) = r {
                // Each fill takes a new reference: adopted by the receiver, or given back by
                // `release_refs` when the runtime discards the payload.
                region.share().write_to(&mut out[at..at + 64]);
                out[at + 64..at + REF_RECORD].copy_from_slice(&(*off as u64).to_le_bytes());
                end = at + REF_RECORD;
                continue;
            }
            let n = b.len_bytes();
            // SAFETY: the exporter keeps buf_ptr..+len_bytes valid while the PyBuffer lives
            // (it does: `self` owns it); the buffer is C-contiguous (checked in `new`).
            let src = unsafe { std::slice::from_raw_parts(b.buf_ptr() as *const u8, n) };
            mizu_pool::wire::copy_large(&mut out[at..at + n], src);
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
            let v = ShmBuffer::new(buf.slice_with_length(start, len));
            Ok(Py::new(py, v)?.into_any())
        }
    };
    match b.first() {
        Some(&TAG_PLAIN) => Ok((view(1, b.len() - 1)?, PyList::empty(py).unbind())),
        Some(&TAG_BUFFERS) => {
            let layout = oob::parse(b, Dialect::Python).map_err(|e| bad(e.to_string()))?;
            let list = PyList::empty(py);
            for (i, entry) in layout.entries.into_iter().enumerate() {
                let buf = match entry.place {
                    Place::Inline(r) => buf.slice_with_length(r.start, r.len()),
                    Place::Ref {
                        desc, offset, len, ..
                    } => by_reference(&desc, offset, len)
                        .map_err(|why| bad(format!("buffer {i}: {why}")))?,
                };
                let view = if entry.code == oob::PY_WRITABLE {
                    ShmBuffer::writable(buf)
                } else {
                    ShmBuffer::new(buf)
                };
                list.append(Py::new(py, view)?)?;
            }
            let body = layout.body;
            Ok((view(body.start, body.len())?, list.unbind()))
        }
        Some(t) => Err(bad(format!("unknown tag {t:#04x}"))),
        None => Err(bad("empty")),
    }
}

/// A buffer by reference: adopts the region `d` names and views `len` bytes of it at `off`.
fn by_reference(d: &RegionDesc, off: u64, len: u64) -> Result<Buffer, String> {
    let region = Arc::new(
        crate::payload::MAPPER
            .adopt(d)
            .map_err(|e| format!("its region: {e}"))?,
    );
    let (off, len) = match (usize::try_from(off), usize::try_from(len)) {
        (Ok(o), Ok(n)) if o.checked_add(n).is_some_and(|e| e <= region.len()) => (o, n),
        _ => return Err("it is beyond its region".into()),
    };
    Ok(Region::buffer(&region).slice_with_length(off, len))
}

/// Gives back the region references of a `B` payload nobody will read (see
/// `small_read::release_refs`, which calls it): runs on any thread, touches no Python object,
/// stops at the first malformed byte.
pub fn release_refs(b: &[u8]) {
    for d in oob::references(b, Dialect::Python) {
        // Adopting takes the reference over; dropping the region gives it back.
        drop(crate::payload::MAPPER.adopt(&d));
    }
}

/// Copies `data` (a contiguous buffer) into a region of this process's store of shared
/// objects and returns a read-only view of it: sending the view (or a slice of it) anywhere
/// passes a reference to the region, never the bytes.
#[pyfunction]
pub fn share_buffer(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<ShmBuffer> {
    let pb = PyBuffer::<u8>::get(data)?;
    if !pb.is_c_contiguous() {
        return Err(PyBufferError::new_err(
            "pymizu.share: the buffer is not contiguous",
        ));
    }
    let n = pb.len_bytes();
    // SAFETY: the exporter keeps buf_ptr..+n valid and unchanged while `pb` lives (it does,
    // to the end of this function); the buffer is contiguous (checked above).
    let src = unsafe { std::slice::from_raw_parts(pb.buf_ptr() as *const u8, n) };
    let region = py.detach(|| mizu_pool::share::copy(src));
    let region = Arc::new(region.map_err(crate::err)?);
    Ok(ShmBuffer::new(
        Region::buffer(&region).slice_with_length(0, n),
    ))
}

/// `nbytes` of shared memory that this process and the tasks it sends views of it to may all
/// write (`pymizu.empty`, and `pymizu.zeros` with `zero`): sending a view passes a reference,
/// and the receiver's view is writable too.
#[pyfunction]
pub fn shared_empty(py: Python<'_>, nbytes: usize, zero: bool) -> PyResult<ShmBuffer> {
    // A region may reuse memory an earlier value left (a new segment's pages are zero).
    let region = py.detach(|| {
        mizu_pool::share::filled(nbytes, |b| {
            if zero {
                b.fill(0)
            }
        })
    });
    let region = Arc::new(region.map_err(crate::err)?);
    Ok(ShmBuffer::writable(
        Region::buffer(&region).slice_with_length(0, nbytes),
    ))
}

/// Where `obj`'s memory lives when it is shared: (segment name, offset of its region in the
/// segment, offset of the memory in the region); None when it is this process's own memory.
#[pyfunction]
pub fn shared_region(obj: &Bound<'_, PyAny>) -> PyResult<Option<(String, u64, usize)>> {
    let addr = match pyo3::buffer::PyUntypedBuffer::get(obj) {
        Ok(pb) => pb.buf_ptr() as usize,
        // numpy exports no buffer of dates and times: its array interface names the address.
        Err(e) => match obj.getattr(pyo3::intern!(obj.py(), "__array_interface__")) {
            Ok(ai) => ai.get_item("data")?.get_item(0)?.extract::<usize>()?,
            Err(_) => return Err(e),
        },
    };
    Ok(Region::containing(addr as *const u8)
        .map(|(r, off)| (r.segment().name().to_string(), r.offset(), off)))
}

/// At interpreter exit (`atexit`, registered by the first `share()`): the names of the
/// segments holding shared objects go (processes still reading them keep their mappings), so
/// that nothing of this process's is left in /dev/shm by objects never freed.
#[pyfunction]
pub fn release_shared() {
    mizu_pool::share::release();
}

/// Encodes a payload into bytes (for paths that need an owned copy, e.g. channels).
pub fn encode_vec(o: &Outgoing<'_>) -> Vec<u8> {
    let mut v = vec![0u8; o.size()];
    o.fill(&mut v);
    v
}
