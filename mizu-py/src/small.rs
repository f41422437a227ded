//! The fast path for small common values: `None`, `bool`, 64-bit `int`, `float`, `str`,
//! `bytes`, small numpy arrays and tuples, lists and dicts of them are written and read
//! natively, without pickle.
//! A trivial task (`f(1, 2)` returning `3`) spends most of its time in pickling otherwise.
//!
//! Only exact built-in types qualify (a subclass, an `IntEnum`, a big int, a string with lone
//! surrogates goes through pickle, which keeps its type), and a mutable container that occurs
//! twice sends the whole value through pickle, which keeps the sharing.
//!
//! Payloads (see `docs/python.md`, "Payload format"):
//! * `V` then one value: a task's result;
//! * `C`, `u16` length `m`, the function's pickle (`m` bytes, by reference), the arguments
//!   (a tuple value), then `n` or the keyword arguments (a dict value): a call.
//!
//! A value is a tag byte and its data, integers little-endian: `n` None, `t`/`f` booleans,
//! `i` i64, `d` f64, `s` u32 length + UTF-8, `b` u32 length + bytes, `T`/`L` u32 count +
//! items, `D` u32 count + key, value pairs, `A` a numpy array of up to 4 KiB: order `C`/`F`,
//! u8 length + the dtype's `str`, u8 dimensions + u64 each, u32 length + the bytes in that
//! order; `X` a larger array out of band: the same header, then the u64 offset of its bytes in
//! the array area and their u64 length; `R` an array that views a region this process holds
//! (one it received), by reference: the same header, the region's 64-byte descriptor (a new
//! reference, taken each time the payload is written; the receiver adopts it, and
//! [`release_refs`] gives back those of payloads nobody reads), the u64 offset of the bytes in
//! the region and their u64 length. A payload with `X` arrays is `W`, 3 zero bytes, the
//! u32 length `m` of the `V`/`C` body, the body, then (at the next multiple of 64 from the
//! start) the array area; receivers view those bytes in place. Input is untrusted: every
//! length and offset is checked and nesting is bounded.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, LazyLock, Mutex};

use arrow_buffer::Buffer;
use mizu_pool::Fill;
use mizu_wire::{Mapper, Region, RegionDesc};
use numpy::npyffi::{
    _PyArray_GET_ITEM_DATA, NPY_ARRAY_F_CONTIGUOUS, NPY_ARRAY_WRITEABLE, NpyTypes, get_type_object,
    npy_intp,
};
use numpy::{
    PY_ARRAY_API, PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

use crate::codec::ShmBuffer;

/// Payload tag of a small result value.
pub const TAG_VALUE: u8 = b'V';
/// Payload tag of a small call.
pub const TAG_CALL: u8 = b'C';
/// Containers nested deeper than this go through pickle.
const MAX_DEPTH: u32 = 16;
/// Values that encode larger than this go through pickle.
const MAX_SIZE: usize = 1 << 20;
/// Arrays up to this size are copied inline; larger ones travel out of band (below).
const INLINE_ARRAY: usize = 4096;
/// Arrays that cannot travel out of band (numpy exports no buffer of datetimes) are copied
/// inline up to this size, else the value goes through pickle.
const MAX_ARRAY: usize = 64 << 10;
/// Payload tag of small values with out-of-band arrays (`W`, the body, the array bytes).
pub const TAG_WIDE: u8 = b'W';
/// Alignment of out-of-band array bytes (from the start of their area).
const ALIGN: usize = 64;
/// numpy dtype kinds sent inline: booleans, integers, floats, complex, datetimes,
/// timedeltas, bytes and unicode strings (never objects or structured records).
const PLAIN_KINDS: &str = "biufcmMSU";

/// `numpy.ndarray`, once numpy is imported (no array can exist before).
fn ndarray_type(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
    static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    if let Some(t) = NDARRAY.get(py) {
        return Some(t.bind(py));
    }
    let modules = py.import("sys").ok()?.getattr("modules").ok()?;
    let np = modules.get_item("numpy").ok()?;
    let t = np.getattr("ndarray").ok()?.cast_into::<PyType>().ok()?;
    Some(NDARRAY.get_or_init(py, || t.unbind()).bind(py))
}

/// Received dtypes by their `str` (a handful in practice; cleared when it grows).
static DTYPES: PyOnceLock<Mutex<HashMap<Vec<u8>, Py<PyArrayDescr>>>> = PyOnceLock::new();

/// The dtype named `dstr` (cached), if it is one sent inline.
fn inline_dtype<'py>(py: Python<'py>, dstr: &[u8]) -> PyResult<Bound<'py, PyArrayDescr>> {
    let cache = DTYPES.get_or_init(py, Default::default);
    // Never held across a Python call: holding the GIL while waiting for it cannot deadlock.
    if let Some(d) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(dstr) {
        return Ok(d.bind(py).clone());
    }
    let name = std::str::from_utf8(dstr).map_err(|_| bad("a dtype is not UTF-8"))?;
    let d = PyArrayDescr::new(py, name).map_err(|_| bad("unknown dtype"))?;
    if !PLAIN_KINDS.contains(d.kind() as char)
        || d.has_object()
        || d.has_fields()
        || d.has_subarray()
        || d.itemsize() == 0
    {
        return Err(bad("an array of a dtype that is not sent inline"));
    }
    let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
    if c.len() >= 256 {
        c.clear();
    }
    c.insert(dstr.to_vec(), d.clone().unbind());
    Ok(d)
}

/// An array from its encoding: inline (`A`), a read-only private copy, as received arrays
/// are read-only views otherwise; out of band (`X`), a read-only view of the payload's
/// shared memory, which it keeps alive. Made with numpy's C API: through Python calls it
/// cost several microseconds, more than the rest of a trivial task.
fn read_array<'py>(py: Python<'py>, r: &mut Reader<'_>, tag: u8) -> PyResult<Bound<'py, PyAny>> {
    let order = r.take(1)?[0];
    let dlen = r.take(1)?[0] as usize;
    let dstr = r.take(dlen)?;
    let ndim = r.take(1)?[0] as usize;
    if ndim > 32 {
        return Err(bad("an array has too many dimensions"));
    }
    let mut dims: Vec<npy_intp> = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        let d = u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
        dims.push(npy_intp::try_from(d).map_err(|_| bad("an array dimension is too large"))?);
    }
    let fortran = match order {
        b'C' => false,
        b'F' => true,
        _ => return Err(bad("unknown array order")),
    };
    // Inline: the bytes follow; out of band: where they are in the array area; by
    // reference: a region (whose reference this takes over) and where they are in it.
    let region_view;
    let (data, view) = if tag == b'R' {
        let d = RegionDesc::read_from(r.take(64)?).map_err(bad)?;
        let at = u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
        let n = u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
        let region = Arc::new(
            MAPPER
                .adopt(&d)
                .map_err(|e| bad(&format!("an array by reference: {e}")))?,
        );
        let (at, n) = match (usize::try_from(at), usize::try_from(n)) {
            (Ok(at), Ok(n)) if at.checked_add(n).is_some_and(|e| e <= region.len()) => (at, n),
            _ => return Err(bad("an array by reference beyond its region")),
        };
        region_view = Region::buffer(&region).slice_with_length(at, n);
        (region_view.as_slice(), Some(region_view.clone()))
    } else if tag == b'X' {
        let at = u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
        let n = u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
        let (buf, area) = r
            .oob
            .ok_or_else(|| bad("an out-of-band array outside a W payload"))?;
        let start = usize::try_from(at)
            .ok()
            .and_then(|at| at.checked_add(area))
            .filter(|s| s.is_multiple_of(ALIGN))
            .ok_or_else(|| bad("an out-of-band array out of bounds"))?;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| start.checked_add(n).is_some_and(|e| e <= buf.len()))
            .ok_or_else(|| bad("an out-of-band array out of bounds"))?;
        let view = buf.slice_with_length(start, n);
        (&buf.as_slice()[start..start + n], Some(view))
    } else {
        let n = r.u32()?;
        (r.take(n)?, None)
    };
    let n = data.len();
    // An import statement's cost (a microsecond) only until numpy's array type is known.
    if ndarray_type(py).is_none() {
        py.import("numpy")
            .map_err(|_| bad("an array arrived but numpy cannot be imported"))?;
    }
    let dtype = inline_dtype(py, dstr)?;
    // The shape must account for exactly the bytes present (checked before numpy allocates).
    let elems = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize));
    if elems.and_then(|e| e.checked_mul(dtype.itemsize())) != Some(n) {
        return Err(bad("array bytes do not fit its shape"));
    }
    let flags = if fortran { NPY_ARRAY_F_CONTIGUOUS } else { 0 };
    let Some(view) = view else {
        // SAFETY: a null data pointer: numpy allocates the array's memory.
        let arr = unsafe { new_array(py, dtype, &mut dims, std::ptr::null_mut(), flags)? };
        // SAFETY: `arr` is the array just made (a PyArrayObject): its data is `n` bytes
        // (itemsize × elements, checked above) laid out in `order`, and nothing else refers
        // to it yet.
        unsafe {
            let a = _PyArray_GET_ITEM_DATA(arr.as_ptr().cast());
            if n > 0 {
                std::ptr::copy_nonoverlapping(data.as_ptr(), (*a).data.cast::<u8>(), n);
            }
            (*a).flags &= !NPY_ARRAY_WRITEABLE;
        }
        return Ok(arr);
    };
    let base = Py::new(py, ShmBuffer::new(view))?;
    // SAFETY: `data` is `n` bytes (itemsize × elements, checked) that `base` owns, and
    // `base` becomes the array's base below, so they outlive it.
    let arr = unsafe { new_array(py, dtype, &mut dims, data.as_ptr().cast_mut().cast(), flags)? };
    // SAFETY: `arr` is a PyArrayObject without a base; SetBaseObject steals the reference to
    // `base` (on failure numpy releases it, and the array, which does not own its data, frees
    // nothing else). Without WRITEABLE in its flags the array is read-only, and numpy refuses
    // to make it writable: its base exports no writable buffer.
    if unsafe { PY_ARRAY_API.PyArray_SetBaseObject(py, arr.as_ptr().cast(), base.into_ptr()) } != 0
    {
        return Err(PyErr::fetch(py));
    }
    Ok(arr)
}

/// A numpy array of `dtype` and shape `dims` in C order (Fortran with
/// `NPY_ARRAY_F_CONTIGUOUS` in `flags`), over `data` — or over fresh memory numpy allocates
/// when it is null.
///
/// # Safety
/// numpy's C API table is available (numpy is imported); a non-null `data` points to
/// itemsize × elements bytes that live as long as the array (the caller makes their owner
/// the array's base).
unsafe fn new_array<'py>(
    py: Python<'py>,
    dtype: Bound<'py, PyArrayDescr>,
    dims: &mut [npy_intp],
    data: *mut std::ffi::c_void,
    flags: c_int,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the caller's contract; `dims` holds its length's worth of non-negative
    // dimensions; NewFromDescr steals the dtype reference `into_dtype_ptr` hands over; null
    // strides make numpy lay the array out in the order `flags` names.
    unsafe {
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            get_type_object(py, NpyTypes::PyArray_Type),
            dtype.into_dtype_ptr(),
            dims.len() as c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            data,
            flags,
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, ptr)
    }
}

/// The `str` of a dtype sent inline (`'<f8'`, `'|b1'`, `'<M8[ns]'`): built from its fields
/// for numbers, asked of numpy for the parametric kinds (dates, strings).
fn dtype_str(d: &Bound<'_, PyArrayDescr>) -> PyResult<String> {
    let kind = d.kind();
    if b"biufc".contains(&kind) {
        let size = d.itemsize();
        let order = match (size, d.byteorder()) {
            (1, _) | (_, b'|') => '|',
            (_, b'>') => '>',
            (_, b'<') => '<',
            // Native order ('='): numpy's `str` names it.
            _ if cfg!(target_endian = "little") => '<',
            _ => '>',
        };
        return Ok(format!("{order}{}{size}", kind as char));
    }
    let s = d.getattr(intern!(d.py(), "str"))?;
    Ok(s.cast::<PyString>()?.to_str()?.to_owned())
}
/// Writes small values; gives up (returns false) on anything else.
#[derive(Default)]
struct Writer {
    out: Vec<u8>,
    /// Mutable containers written so far (by address): one seen twice gives up.
    seen: Vec<usize>,
    /// Out-of-band arrays, in order, and where each starts in the array area.
    bufs: Vec<(PyUntypedBuffer, usize)>,
    /// The array area's length so far.
    area: usize,
    /// Arrays sent by reference: their regions and where each descriptor goes in `out`.
    refs: Vec<(Arc<Region>, usize)>,
    /// Whether arrays may go by reference (not for bytes that are never delivered).
    refs_ok: bool,
}

impl Writer {
    fn len_u32(&mut self, n: usize) -> bool {
        match u32::try_from(n) {
            Ok(n) => {
                self.out.extend_from_slice(&n.to_le_bytes());
                true
            }
            Err(_) => false,
        }
    }

    fn bytes(&mut self, tag: u8, b: &[u8]) -> bool {
        if self.out.len() + b.len() > MAX_SIZE {
            return false;
        }
        self.out.push(tag);
        self.len_u32(b.len()) && {
            self.out.extend_from_slice(b);
            true
        }
    }

    fn mutable(&mut self, v: &Bound<'_, PyAny>) -> bool {
        let p = v.as_ptr() as usize;
        if self.seen.contains(&p) {
            return false;
        }
        self.seen.push(p);
        true
    }

    fn value(&mut self, v: &Bound<'_, PyAny>, depth: u32) -> bool {
        if self.out.len() > MAX_SIZE {
            return false;
        }
        if v.is_none() {
            self.out.push(b'n');
        } else if let Ok(b) = v.cast_exact::<PyBool>() {
            self.out.push(if b.is_true() { b't' } else { b'f' });
        } else if v.is_exact_instance_of::<PyInt>() {
            let Ok(i) = v.extract::<i64>() else {
                return false;
            };
            self.out.push(b'i');
            self.out.extend_from_slice(&i.to_le_bytes());
        } else if let Ok(f) = v.cast_exact::<PyFloat>() {
            self.out.push(b'd');
            self.out.extend_from_slice(&f.value().to_le_bytes());
        } else if let Ok(s) = v.cast_exact::<PyString>() {
            let Ok(s) = s.to_str() else {
                return false; // lone surrogates: pickle keeps them
            };
            return self.bytes(b's', s.as_bytes());
        } else if let Ok(b) = v.cast_exact::<PyBytes>() {
            return self.bytes(b'b', b.as_bytes());
        } else if let Ok(t) = v.cast_exact::<PyTuple>() {
            return depth < MAX_DEPTH && self.tuple(t, depth + 1);
        } else if let Ok(l) = v.cast_exact::<PyList>() {
            if depth >= MAX_DEPTH || !self.mutable(v) {
                return false;
            }
            self.out.push(b'L');
            if !self.len_u32(l.len()) {
                return false;
            }
            // Items are read by index with the length checked each time: a change made by a
            // finalizer (writing an array calls numpy) cannot read past the end. The count
            // written first must still hold.
            let (n, mut k) = (l.len(), 0);
            return l.iter().all(|x| {
                k += 1;
                self.value(&x, depth + 1)
            }) && k == n;
        } else if let Ok(d) = v.cast_exact::<PyDict>() {
            if depth >= MAX_DEPTH || !self.mutable(v) {
                return false;
            }
            // A snapshot of the items: writing an array calls numpy, and a garbage collection
            // there could run a finalizer that changes this dict.
            let items = d.items();
            self.out.push(b'D');
            if !self.len_u32(items.len()) {
                return false;
            }
            return items.iter().all(|kv| {
                kv.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()
                    .is_ok_and(|(k, x)| self.value(&k, depth + 1) && self.value(&x, depth + 1))
            });
        } else {
            return depth < MAX_DEPTH && self.mutable(v) && self.array(v).unwrap_or(false);
        }
        true
    }

    /// A small numpy array of a plain dtype (numbers, booleans, dates, fixed-width strings),
    /// C- or Fortran-contiguous, copied inline: pickling one costs tens of microseconds.
    /// Larger ones go through pickle, whose out-of-band buffers cross without a copy.
    fn array(&mut self, v: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = v.py();
        let Some(ndarray) = ndarray_type(py) else {
            return Ok(false);
        };
        if !v.get_type().is(ndarray) {
            return Ok(false);
        }
        // SAFETY: exactly `numpy.ndarray` (checked above) is a PyArrayObject.
        let a = unsafe { v.cast_unchecked::<PyUntypedArray>() };
        let dtype = a.dtype();
        let kind = dtype.kind();
        if !PLAIN_KINDS.contains(kind as char)
            || dtype.has_object()
            || dtype.has_fields()
            || dtype.has_subarray()
            || dtype.itemsize() == 0
        {
            return Ok(false);
        }
        let Some(nbytes) = a
            .shape()
            .iter()
            .try_fold(dtype.itemsize(), |acc, &d| acc.checked_mul(d))
        else {
            return Ok(false);
        };
        let order = if a.is_c_contiguous() {
            b'C'
        } else if a.is_fortran_contiguous() {
            b'F'
        } else {
            return Ok(false);
        };
        // A view of a region we hold (a received array, or a slice of one) goes by reference.
        let by_ref = (nbytes > INLINE_ARRAY && self.refs_ok)
            .then(|| Region::containing(data_ptr(a)))
            .flatten()
            .filter(|(r, off)| off + nbytes <= r.len() && r.still_named());
        // The exported buffer keeps the array's memory in place until the payload is written.
        let oob = (nbytes > INLINE_ARRAY && by_ref.is_none())
            .then(|| PyUntypedBuffer::get(v).ok())
            .flatten()
            .filter(|b| {
                b.len_bytes() == nbytes
                    && b.buf_ptr().cast_const().cast::<u8>() == data_ptr(a)
                    && if order == b'C' {
                        b.is_c_contiguous()
                    } else {
                        b.is_fortran_contiguous()
                    }
            });
        if oob.is_none()
            && by_ref.is_none()
            && (nbytes > MAX_ARRAY || self.out.len() + nbytes > MAX_SIZE)
        {
            return Ok(false);
        }
        let dstr = dtype_str(&dtype)?;
        let (Ok(dlen), Ok(ndim)) = (u8::try_from(dstr.len()), u8::try_from(a.ndim())) else {
            return Ok(false);
        };
        self.out.push(match (&by_ref, &oob) {
            (Some(_), _) => b'R',
            (_, Some(_)) => b'X',
            _ => b'A',
        });
        self.out.push(order);
        self.out.push(dlen);
        self.out.extend_from_slice(dstr.as_bytes());
        self.out.push(ndim);
        for &d in a.shape() {
            self.out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        if let Some((region, off)) = by_ref {
            // The descriptor (a new reference) is written when the payload is.
            self.refs.push((region, self.out.len()));
            self.out.extend_from_slice(&[0u8; 64]);
            self.out.extend_from_slice(&(off as u64).to_le_bytes());
            self.out.extend_from_slice(&(nbytes as u64).to_le_bytes());
            return Ok(true);
        }
        if let Some(b) = oob {
            self.out
                .extend_from_slice(&(self.area as u64).to_le_bytes());
            self.out.extend_from_slice(&(nbytes as u64).to_le_bytes());
            self.bufs.push((b, self.area));
            self.area = (self.area + nbytes).next_multiple_of(ALIGN);
            return Ok(true);
        }
        if !self.len_u32(nbytes) {
            return Ok(false);
        }
        if nbytes > 0 {
            // SAFETY: the array is contiguous in `order` (its flags say so), so its `nbytes`
            // bytes start at its data pointer; they stay valid while we hold it and the GIL
            // (no Python code runs during the copy).
            let src = unsafe { std::slice::from_raw_parts(data_ptr(a), nbytes) };
            self.out.extend_from_slice(src);
        }
        Ok(true)
    }

    fn tuple(&mut self, t: &Bound<'_, PyTuple>, depth: u32) -> bool {
        self.out.push(b'T');
        if !self.len_u32(t.len()) {
            return false;
        }
        t.iter().all(|x| self.value(&x, depth))
    }
}

/// The start of a contiguous array's bytes.
fn data_ptr(a: &Bound<'_, PyUntypedArray>) -> *const u8 {
    // SAFETY: `a` is a live PyArrayObject (its type was checked); reading its data field.
    unsafe {
        (*_PyArray_GET_ITEM_DATA(a.as_array_ptr()))
            .data
            .cast::<u8>()
    }
}

/// A small-value payload ready to write: the values (`V` or `C`), and the out-of-band arrays
/// that follow them (then it is a `W` payload: `W`, 3 zero bytes, `u32` body length `m`, the
/// body, zeros up to the array area at the next multiple of 64, each array at its offset).
pub struct Payload {
    body: Vec<u8>,
    bufs: Vec<(PyUntypedBuffer, usize)>,
    refs: Vec<(Arc<Region>, usize)>,
    /// Where the array area starts (bufs present).
    area_at: usize,
    size: usize,
}

impl Payload {
    fn new(w: Writer) -> Option<Payload> {
        if w.bufs.is_empty() {
            let size = w.out.len();
            return Some(Payload {
                body: w.out,
                bufs: Vec::new(),
                refs: w.refs,
                area_at: 0,
                size,
            });
        }
        u32::try_from(w.out.len()).ok()?;
        let area_at = (8 + w.out.len()).next_multiple_of(ALIGN);
        let end = w.bufs.last().map_or(0, |(b, at)| at + b.len_bytes());
        Some(Payload {
            size: area_at + end,
            body: w.out,
            bufs: w.bufs,
            refs: w.refs,
            area_at,
        })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.size
    }

    /// The payload as bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.size];
        self.fill(&mut v);
        v
    }
}

impl Fill for Payload {
    fn size(&self) -> usize {
        self.size
    }

    /// Each fill takes a new reference of every region referred to: adopted by the receiver,
    /// or given back by [`release_refs`] when the runtime discards the payload.
    fn fill(&self, out: &mut [u8]) {
        let m = self.body.len();
        let base = if self.bufs.is_empty() { 0 } else { 8 };
        out[base..base + m].copy_from_slice(&self.body);
        for (region, at) in &self.refs {
            region.share().write_to(&mut out[base + at..base + at + 64]);
        }
        if self.bufs.is_empty() {
            return;
        }
        out[..8].fill(0);
        out[0] = TAG_WIDE;
        out[4..8].copy_from_slice(&(m as u32).to_le_bytes());
        let mut end = 8 + m;
        for (b, at) in &self.bufs {
            let at = self.area_at + at;
            out[end..at].fill(0);
            let n = b.len_bytes();
            // SAFETY: the exporter keeps buf_ptr..+len_bytes valid while the buffer is held
            // (`self` holds it), and it is contiguous (checked when the array was written).
            let src = unsafe { std::slice::from_raw_parts(b.buf_ptr().cast::<u8>(), n) };
            out[at..at + n].copy_from_slice(src);
            end = at + n;
        }
    }
}

/// The `V` payload of `v`, or None when `v` is not a small value. With `refs`, arrays that
/// view a region this process holds are sent by reference (the payload must then be
/// delivered or discarded by the runtime).
pub fn encode_value(v: &Bound<'_, PyAny>, refs: bool) -> Option<Payload> {
    let mut w = Writer {
        refs_ok: refs,
        ..Writer::default()
    };
    w.out.reserve(16);
    w.out.push(TAG_VALUE);
    if w.value(v, 0) { Payload::new(w) } else { None }
}

/// The `C` payload of a call of the function pickled as `head` (by reference), or None when
/// an argument is not a small value or the pickle is too long.
pub fn encode_call(
    head: &[u8],
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> Option<Payload> {
    let m = u16::try_from(head.len()).ok()?;
    let mut w = Writer {
        refs_ok: true,
        ..Writer::default()
    };
    w.out.reserve(head.len() + 32);
    w.out.push(TAG_CALL);
    w.out.extend_from_slice(&m.to_le_bytes());
    w.out.extend_from_slice(head);
    if !w.tuple(args, 1) {
        return None;
    }
    match kwargs {
        Some(k) if !k.is_empty() => {
            if !w.value(k.as_any(), 0) {
                return None;
            }
        }
        _ => w.out.push(b'n'),
    }
    Payload::new(w)
}

fn bad(why: &str) -> PyErr {
    PyValueError::new_err(format!("pymizu: malformed small payload: {why}"))
}

/// Reads values from untrusted bytes.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    /// A `W` payload's bytes and where its array area starts.
    oob: Option<(&'a Buffer, usize)>,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> PyResult<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| bad("truncated"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> PyResult<usize> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes(s.try_into().expect("4 bytes")) as usize)
    }

    /// A count of items, each at least one byte: more than the bytes left is malformed
    /// (and must not size an allocation).
    fn count(&mut self) -> PyResult<usize> {
        let n = self.u32()?;
        if n > self.b.len() - self.at {
            return Err(bad("count beyond the payload"));
        }
        Ok(n)
    }
}

/// The items of a tuple or list at `r` (its count first).
fn read_items<'py>(
    py: Python<'py>,
    r: &mut Reader<'_>,
    depth: u32,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let n = r.count()?;
    let mut items = Vec::with_capacity(n);
    for _ in 0..n {
        items.push(read(py, r, depth + 1)?);
    }
    Ok(items)
}

/// Reads one value at `r`.
fn read<'py>(py: Python<'py>, r: &mut Reader<'_>, depth: u32) -> PyResult<Bound<'py, PyAny>> {
    if depth > MAX_DEPTH {
        return Err(bad("nested too deep"));
    }
    let tag = r.take(1)?[0];
    Ok(match tag {
        b'n' => py.None().into_bound(py),
        b't' => PyBool::new(py, true).to_owned().into_any(),
        b'f' => PyBool::new(py, false).to_owned().into_any(),
        b'i' => {
            let s = r.take(8)?;
            i64::from_le_bytes(s.try_into().expect("8 bytes"))
                .into_pyobject(py)?
                .into_any()
        }
        b'd' => {
            let s = r.take(8)?;
            PyFloat::new(py, f64::from_le_bytes(s.try_into().expect("8 bytes"))).into_any()
        }
        b's' => {
            let n = r.u32()?;
            let s = std::str::from_utf8(r.take(n)?).map_err(|_| bad("a str is not UTF-8"))?;
            PyString::new(py, s).into_any()
        }
        b'b' => {
            let n = r.u32()?;
            PyBytes::new(py, r.take(n)?).into_any()
        }
        b'T' => PyTuple::new(py, read_items(py, r, depth)?)?.into_any(),
        b'L' => PyList::new(py, read_items(py, r, depth)?)?.into_any(),
        b'D' => {
            let n = r.count()?;
            let d = PyDict::new(py);
            for _ in 0..n {
                let k = read(py, r, depth + 1)?;
                let v = read(py, r, depth + 1)?;
                d.set_item(k, v)
                    .map_err(|_| bad("a dict key is not hashable"))?;
            }
            d.into_any()
        }
        t @ (b'A' | b'X' | b'R') => read_array(py, r, t)?,
        t => return Err(bad(&format!("unknown value tag {t:#04x}"))),
    })
}

/// Maps the regions that arrays by reference live in (segments stay mapped while views of
/// them live).
static MAPPER: LazyLock<Mapper> = LazyLock::new(Mapper::new);

/// Walks one value of a small payload without making Python objects, calling `f` with the
/// descriptor of every array by reference; None when the bytes are malformed.
fn walk(b: &[u8], at: &mut usize, depth: u32, f: &mut impl FnMut(&[u8])) -> Option<()> {
    fn take<'a>(b: &'a [u8], at: &mut usize, n: usize) -> Option<&'a [u8]> {
        let s = b.get(*at..at.checked_add(n)?)?;
        *at += n;
        Some(s)
    }
    fn u32_at(b: &[u8], at: &mut usize) -> Option<usize> {
        Some(u32::from_le_bytes(take(b, at, 4)?.try_into().ok()?) as usize)
    }
    if depth > MAX_DEPTH {
        return None;
    }
    match take(b, at, 1)?[0] {
        b'n' | b't' | b'f' => {}
        b'i' | b'd' => {
            take(b, at, 8)?;
        }
        b's' | b'b' => {
            let n = u32_at(b, at)?;
            take(b, at, n)?;
        }
        b'T' | b'L' => {
            for _ in 0..u32_at(b, at)? {
                walk(b, at, depth + 1, f)?;
            }
        }
        b'D' => {
            for _ in 0..u32_at(b, at)? {
                walk(b, at, depth + 1, f)?;
                walk(b, at, depth + 1, f)?;
            }
        }
        t @ (b'A' | b'X' | b'R') => {
            take(b, at, 1)?;
            let dlen = take(b, at, 1)?[0] as usize;
            take(b, at, dlen)?;
            let ndim = take(b, at, 1)?[0] as usize;
            take(b, at, 8 * ndim)?;
            match t {
                b'A' => {
                    let n = u32_at(b, at)?;
                    take(b, at, n)?;
                }
                b'X' => {
                    take(b, at, 16)?;
                }
                _ => {
                    f(take(b, at, 64)?);
                    take(b, at, 16)?;
                }
            }
        }
        _ => return None,
    }
    Some(())
}

/// Gives back the region references inside a payload nobody will read (the runtime's
/// discard hook, `mizu_pool::set_discard_hook`; also a task's outcome dropped unread): each
/// was taken by the sender when it wrote the payload. Runs on any thread, touches no Python
/// object; stops at the first malformed byte.
pub fn release_refs(p: &[u8]) {
    let body = match p.first() {
        Some(&TAG_WIDE) => {
            let Some(m) = p.get(4..8) else { return };
            let m = u32::from_le_bytes(m.try_into().expect("4 bytes")) as usize;
            match p.get(8..8usize.saturating_add(m)) {
                Some(b) => b,
                None => return,
            }
        }
        _ => p,
    };
    let mut release = |d: &[u8]| {
        if let Ok(d) = RegionDesc::read_from(d) {
            // Adopting takes the reference over; dropping the region gives it back.
            drop(MAPPER.adopt(&d));
        }
    };
    let mut at = 1;
    match body.first() {
        Some(&TAG_VALUE) => {
            let _ = walk(body, &mut at, 0, &mut release);
        }
        Some(&TAG_CALL) => {
            let Some(m) = body.get(1..3) else { return };
            at = 3 + u16::from_le_bytes(m.try_into().expect("2 bytes")) as usize;
            let _ = walk(body, &mut at, 0, &mut release)
                .and_then(|()| walk(body, &mut at, 0, &mut release));
        }
        _ => {}
    }
}

/// The body of a small payload (a `W` payload's `V` or `C` part) and its reader.
fn reader(buf: &Buffer) -> PyResult<Reader<'_>> {
    let b = buf.as_slice();
    if b.first() != Some(&TAG_WIDE) {
        return Ok(Reader {
            b,
            at: 1,
            oob: None,
        });
    }
    let m = b
        .get(4..8)
        .map(|m| u32::from_le_bytes(m.try_into().expect("4 bytes")) as usize)
        .ok_or_else(|| bad("truncated"))?;
    let area = (8 + m).next_multiple_of(ALIGN);
    if area > b.len() || m == 0 {
        return Err(bad("the body does not fit"));
    }
    Ok(Reader {
        b: &b[8..8 + m],
        at: 1,
        oob: Some((buf, area)),
    })
}

/// The tag of a small payload's values: `V`, `C`, or None for any other payload.
pub fn kind(b: &[u8]) -> Option<u8> {
    match *b.first()? {
        TAG_WIDE => b.get(8).copied(),
        t => Some(t),
    }
    .filter(|&t| t == TAG_VALUE || t == TAG_CALL)
}

/// The value of a `V` payload (or a `W` payload holding one).
pub fn decode_value<'py>(py: Python<'py>, buf: &Buffer) -> PyResult<Bound<'py, PyAny>> {
    let mut r = reader(buf)?;
    if r.b.first() != Some(&TAG_VALUE) {
        return Err(bad("not a value"));
    }
    let v = read(py, &mut r, 0)?;
    if r.at != r.b.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(v)
}

/// A decoded `C` payload: the function's pickle, the arguments and the keyword arguments.
pub struct Call<'a, 'py> {
    /// The function's pickle (by reference).
    pub head: &'a [u8],
    /// Positional arguments.
    pub args: Bound<'py, PyTuple>,
    /// Keyword arguments, if any.
    pub kwargs: Option<Bound<'py, PyDict>>,
}

/// Reads a `C` payload (or a `W` payload holding one).
pub fn decode_call<'a, 'py>(py: Python<'py>, buf: &'a Buffer) -> PyResult<Call<'a, 'py>> {
    let mut r = reader(buf)?;
    if r.b.first() != Some(&TAG_CALL) {
        return Err(bad("not a call"));
    }
    let m = u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes")) as usize;
    let head = r.take(m)?;
    let args = read(py, &mut r, 0)?
        .cast_into::<PyTuple>()
        .map_err(|_| bad("the arguments are not a tuple"))?;
    let kw = read(py, &mut r, 0)?;
    let kwargs = if kw.is_none() {
        None
    } else {
        Some(
            kw.cast_into::<PyDict>()
                .map_err(|_| bad("the keyword arguments are not a dict"))?,
        )
    };
    if r.at != r.b.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(Call { head, args, kwargs })
}

/// `types.FunctionType`, `types.BuiltinFunctionType` and `type`: what `pymizu._codec.fn_ref`
/// pickles by reference.
fn fn_types(py: Python<'_>) -> PyResult<&[Py<PyType>; 3]> {
    static TYPES: PyOnceLock<[Py<PyType>; 3]> = PyOnceLock::new();
    TYPES.get_or_try_init(py, || {
        let types = py.import("types")?;
        let t = |n: &str| -> PyResult<Py<PyType>> {
            Ok(types.getattr(n)?.cast_into::<PyType>()?.unbind())
        };
        Ok([
            t("FunctionType")?,
            t("BuiltinFunctionType")?,
            PyType::new::<PyType>(py).unbind(),
        ])
    })
}

/// A call ready to submit: written natively, or pickled by `pymizu._codec`.
pub enum CallPayload<'py> {
    /// A `C` payload.
    Small(Payload),
    /// `(pickle, out-of-band buffers)`.
    Pickled(Bound<'py, PyBytes>, Bound<'py, PyAny>),
}

/// `fn(*args, **kwargs)` as a payload: natively when `fn` is a module-level function or class
/// (its pickle by reference is cached in `pymizu._codec`) and every argument is small, else
/// pickled by `pymizu._codec.dumps_call` (which raises for what cannot be pickled).
pub fn call_payload<'py>(
    f: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<CallPayload<'py>> {
    static FN_REF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    static FN_BYTES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    static DUMPS_CALL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = f.py();
    // `fn_ref`'s cache first (it holds only functions and classes it accepted): a hit costs no
    // Python call.
    let cached = match fn_types(py)?.iter().any(|t| f.get_type().is(t)) {
        true => FN_BYTES
            .import(py, "pymizu._codec", "_fn_bytes")?
            .get_item(f)
            .ok()
            .flatten(),
        false => None,
    };
    let head = match cached {
        Some(h) => h,
        None => FN_REF.import(py, "pymizu._codec", "fn_ref")?.call1((f,))?,
    };
    if let Ok(h) = head.cast::<PyBytes>()
        && let Some(p) = encode_call(h.as_bytes(), args, kwargs)
    {
        return Ok(CallPayload::Small(p));
    }
    let kw = match kwargs {
        Some(k) => k.clone(),
        None => PyDict::new(py),
    };
    let (data, bufs) = DUMPS_CALL
        .import(py, "pymizu._codec", "dumps_call")?
        .call1((f, args, kw))?
        .extract::<(Bound<'py, PyBytes>, Bound<'py, PyAny>)>()?;
    Ok(CallPayload::Pickled(data, bufs))
}
