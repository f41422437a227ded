//! Python payloads: a pickle (protocol 5) and its out-of-band buffers, written by the runtime's
//! one writer of a language's own payloads (`mizu_pool::wire::oob`: the layout is in
//! `docs/wire-format.md`, "Same-language payloads"), so that a large one travels in a single
//! shared-memory region, copied once from the sender's buffers, and the receiver sees every
//! buffer as a read-only view of that region.
//!
//! A call whose function pickles by reference is a `C` payload: the function's pickle (which
//! the worker unpickles once and keeps) ahead of the arguments' pickle. A buffer that views a
//! region this process holds (a shared object, an array received from another process)
//! travels by reference to it.

use std::sync::Arc;

use arrow_buffer::Buffer;
use mizu_pool::Fill;
use mizu_pool::wire::oob::{self, Source, code, tag};
use mizu_pool::wire::{Region, compact};
use pyo3::buffer::{PyBuffer, PyUntypedBuffer};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;

use crate::shmbuf::ShmBuffer;
use pyo3::types::{PyBytes, PyList};

/// Buffers at least this large that view a region this process holds go by reference.
const REF_MIN: usize = 4096;
/// Pickles up to this size are handed to Python as `bytes`; larger ones as views.
const COPY_PICKLE_MAX: usize = 4096;

/// The bytes of a buffer a Python object exports, copied into a payload when it is written.
/// Holding it keeps the exporter's memory in place.
pub(crate) struct Exported(pub(crate) PyUntypedBuffer);

impl Source for Exported {
    fn len(&self) -> usize {
        self.0.len_bytes()
    }

    fn write_to(&self, out: &mut [u8]) {
        // SAFETY: the exporter keeps buf_ptr..+len_bytes valid while the buffer is held (it
        // is: `self` holds it), and every `Exported` is contiguous (checked where it is made).
        let src = unsafe { std::slice::from_raw_parts(self.0.buf_ptr().cast::<u8>(), self.len()) };
        src.write_to(out);
    }
}

/// A payload to send: the pickle (after a call's function, for a `C` payload) and the
/// out-of-band buffers, written in place by [`Fill`].
pub struct Outgoing<'a>(oob::Writer<(Vec<u8>, &'a [u8]), Exported>);

impl<'a> Outgoing<'a> {
    /// A `P` payload: `pickle` and its buffers `bufs` (None or an iterable of buffers).
    pub fn new(py: Python<'_>, pickle: &'a [u8], bufs: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::with(py, tag::PICKLE, Vec::new(), pickle, bufs)
    }

    /// A `C` payload: a call of the function pickled as `head` (`fn_ref`), whose arguments
    /// (a tuple, or `[args, kwargs]`) pickle as `pickle` with the buffers `bufs`.
    pub fn call(
        py: Python<'_>,
        head: &[u8],
        pickle: &'a [u8],
        bufs: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let mut prefix = Vec::with_capacity(head.len() + 2);
        compact::put_varint(&mut prefix, head.len() as u64);
        prefix.extend_from_slice(head);
        Self::with(py, tag::PICKLED_CALL, prefix, pickle, bufs)
    }

    fn with(
        py: Python<'_>,
        tag: u8,
        prefix: Vec<u8>,
        pickle: &'a [u8],
        bufs: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let mut w = oob::Writer::new(tag, (prefix, pickle));
        if bufs.is_none() {
            return Ok(Outgoing(w));
        }
        for b in bufs.try_iter()? {
            let b = b?;
            // `PickleBuffer.raw()` is a contiguous byte view of any buffer, whatever its dtype.
            let raw = match b.call_method0(pyo3::intern!(py, "raw")) {
                Ok(r) => r,
                Err(_) => b,
            };
            let pb = PyUntypedBuffer::get(&raw)?;
            if !pb.is_c_contiguous() {
                return Err(PyBufferError::new_err(
                    "pymizu: an out-of-band buffer is not contiguous",
                ));
            }
            let n = pb.len_bytes();
            // Writable shared memory (every other view of shared memory is read-only) goes by
            // reference whatever its size, and is never copied: tasks may be writing it.
            let writable = !pb.readonly();
            let shared = (n >= REF_MIN || writable)
                .then(|| Region::containing(pb.buf_ptr().cast_const().cast::<u8>()))
                .flatten()
                .filter(|(r, off)| off + n <= r.len());
            let writable = writable && shared.is_some();
            match shared.filter(|(r, _)| r.still_named()) {
                Some((region, off)) => {
                    w.push_ref(code::BYTES, region, off, n, writable, None);
                }
                None if writable => {
                    return Err(PyValueError::new_err(
                        "pymizu: a writable shared array whose memory is being released cannot be sent",
                    ));
                }
                None => {
                    w.push(code::BYTES, Exported(pb));
                }
            }
        }
        Ok(Outgoing(w))
    }

    /// The payload as bytes (for paths that need an owned copy, e.g. channels).
    pub fn to_vec(&self) -> Vec<u8> {
        self.0.to_vec()
    }
}

impl Fill for Outgoing<'_> {
    fn size(&self) -> usize {
        self.0.size()
    }

    /// Each write takes a new reference of every region referred to: adopted by the receiver,
    /// or given back by [`release_refs`] when the runtime discards the payload.
    fn fill(&self, out: &mut [u8]) {
        self.0.write(out);
    }
}

fn bad(why: impl Into<String>) -> PyErr {
    PyValueError::new_err(format!("pymizu: malformed payload: {}", why.into()))
}

/// A received pickled payload: for a `C` payload the function's pickle, then the pickle (as
/// `bytes`, or a view when it is large) and the buffers for `pickle.loads(pickle,
/// buffers=buffers)`.
pub struct Pickled {
    /// The function's pickle (by reference) of a call.
    pub head: Option<Py<PyBytes>>,
    /// The pickle.
    pub data: Py<PyAny>,
    /// Its out-of-band buffers, as read-only (or, for `pymizu.empty`/`zeros` memory,
    /// writable) views.
    pub bufs: Py<PyList>,
}

impl Pickled {
    /// `(pickle, buffers)`, for a payload that is not a call.
    pub fn pair(self) -> (Py<PyAny>, Py<PyList>) {
        (self.data, self.bufs)
    }
}

/// Decodes a received `P` or `C` payload. Input is untrusted: every offset is checked.
pub fn decode(py: Python<'_>, buf: Buffer) -> PyResult<Pickled> {
    let b = buf.as_slice();
    let layout = oob::parse(b).map_err(|e| bad(e.to_string()))?;
    let mut body = layout.body;
    let head = match layout.tag {
        tag::PICKLE => None,
        tag::PICKLED_CALL => {
            let mut r = compact::Reader::new(&b[..body.end], body.start, body.start);
            let n = r.len("function").map_err(|e| bad(e.to_string()))?;
            let h = r.take("function", n).map_err(|e| bad(e.to_string()))?;
            body.start = r.pos;
            Some(PyBytes::new(py, h).unbind())
        }
        t => return Err(bad(format!("not a pickle (tag {t:#04x})"))),
    };
    let list = PyList::empty(py);
    let received = oob::receive(&buf, layout.entries, &crate::payload::MAPPER)
        .map_err(|e| bad(e.to_string()))?;
    for r in received {
        let view = if r.writable {
            ShmBuffer::writable(r.bytes)
        } else {
            ShmBuffer::new(r.bytes)
        };
        list.append(Py::new(py, view)?)?;
    }
    let data = if body.len() <= COPY_PICKLE_MAX {
        PyBytes::new(py, &b[body]).into_any().unbind()
    } else {
        Py::new(
            py,
            ShmBuffer::new(buf.slice_with_length(body.start, body.len())),
        )?
        .into_any()
    };
    Ok(Pickled {
        head,
        data,
        bufs: list.unbind(),
    })
}

/// Gives back the region references of a payload nobody will read (the runtime's discard
/// hook, and a task's outcome dropped unread): runs on any thread, touches no Python object,
/// stops at the first malformed byte.
pub fn release_refs(b: &[u8]) {
    for d in oob::references(b) {
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
    crate::spill::warn_if_spilled(py);
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
    crate::spill::warn_if_spilled(py);
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
