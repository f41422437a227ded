//! numpy arrays in small payloads (see `small.rs` for the format): written and read with
//! numpy's C API (the `numpy` crate) — through Python calls an array cost several
//! microseconds, more than the rest of a trivial task. Up to 4 KiB an array is copied inline;
//! a larger one travels out of band (its bytes after the values, viewed in place on arrival);
//! one that views a region this process holds (a received array, or a slice of one) goes by
//! reference.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;

use mizu_pool::wire::Region;
use numpy::npyffi::{
    _PyArray_GET_ITEM_DATA, NPY_ARRAY_F_CONTIGUOUS, NPY_ARRAY_WRITEABLE, NpyTypes, get_type_object,
    npy_intp,
};
use numpy::{
    PY_ARRAY_API, PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

use crate::codec::Exported;
use crate::cursor::{Beside, MAX_SIZE, Reader, Writer, bad};
use crate::shmbuf::ShmBuffer;
use mizu_pool::wire::compact::tag;

/// Arrays up to this size are copied inline; larger ones travel out of band (below).
const INLINE_ARRAY: usize = 4096;
/// Arrays that cannot travel out of band (numpy exports no buffer of datetimes) are copied
/// inline up to this size, else the value goes through pickle.
const MAX_ARRAY: usize = 64 << 10;
/// numpy dtype kinds sent inline: booleans, integers, floats, complex, datetimes,
/// timedeltas, bytes and unicode strings (never objects or structured records).
const PLAIN_KINDS: &str = "biufcmMSU";

/// `numpy.ndarray`, once numpy is imported (no array can exist before).
pub(crate) fn ndarray_type(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
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

/// An array from its item (`tag`): inline, a read-only private copy, as received arrays are
/// read-only views otherwise; out of band, a read-only view of the payload's shared memory,
/// which it keeps alive; by reference, a view of the region it names. Made with numpy's C API: through Python calls it
/// cost several microseconds, more than the rest of a trivial task.
pub(crate) fn read_array<'py>(
    py: Python<'py>,
    r: &mut Reader<'_>,
    item: u8,
) -> PyResult<Bound<'py, PyAny>> {
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
    // Inline: the bytes follow; beside the values: the index of the payload's buffer that
    // holds them (in the payload, or in a region it names, whose reference the payload's
    // reader took over). Bytes are handled by address and length: writable memory must
    // never sit behind a Rust reference while other processes may write it.
    let mut writable = false;
    let (data, view) = if item == tag::PY_NDARRAY_OOB {
        let i =
            r.r.varint("buffer index")
                .map_err(crate::cursor::wire_bad)?;
        let b = usize::try_from(i)
            .ok()
            .and_then(|i| r.beside.get(i))
            .ok_or_else(|| bad("an array names a buffer the payload does not have"))?;
        if b.code != mizu_pool::wire::oob::code::BYTES {
            return Err(bad("an array's buffer holds something else"));
        }
        writable = b.writable;
        let view = b.bytes.clone();
        ((view.as_ptr(), view.len()), Some(view))
    } else {
        let n = r.u32()?;
        let b = r.take(n)?;
        ((b.as_ptr(), n), None)
    };
    let (data, n) = data;
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
                std::ptr::copy_nonoverlapping(data, (*a).data.cast::<u8>(), n);
            }
            (*a).flags &= !NPY_ARRAY_WRITEABLE;
        }
        return Ok(arr);
    };
    let base = Py::new(
        py,
        if writable {
            ShmBuffer::writable(view)
        } else {
            ShmBuffer::new(view)
        },
    )?;
    let flags = if writable {
        flags | NPY_ARRAY_WRITEABLE
    } else {
        flags
    };
    // SAFETY: `data` is `n` bytes (itemsize × elements, checked) that `base` owns, and
    // `base` becomes the array's base below, so they outlive it.
    let arr = unsafe { new_array(py, dtype, &mut dims, data.cast_mut().cast(), flags)? };
    // SAFETY: `arr` is a PyArrayObject without a base; SetBaseObject steals the reference to
    // `base` (on failure numpy releases it, and the array, which does not own its data, frees
    // nothing else). Without WRITEABLE in its flags the array is read-only, and numpy refuses
    // to make it writable: its base exports no writable buffer (only the memory of
    // `pymizu.empty`/`zeros` is writable, and its views say so).
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
fn dtype_str(d: &Bound<'_, PyArrayDescr>) -> PyResult<DtypeStr> {
    let kind = d.kind();
    if b"biufc".contains(&kind) {
        let size = d.itemsize();
        let order = match (size, d.byteorder()) {
            (1, _) | (_, b'|') => b'|',
            (_, b'>') => b'>',
            (_, b'<') => b'<',
            // Native order ('='): numpy's `str` names it.
            _ if cfg!(target_endian = "little") => b'<',
            _ => b'>',
        };
        // (Written without `format!`: this is on the path of every array sent.)
        let mut s = DtypeStr::Short([0; 8], 0);
        s.push(order);
        s.push(kind);
        let mut digits = [0u8; 20];
        let (mut k, mut rest) = (digits.len(), size);
        loop {
            k -= 1;
            digits[k] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        digits[k..].iter().for_each(|&b| s.push(b));
        return Ok(s);
    }
    let s = d.getattr(intern!(d.py(), "str"))?;
    Ok(DtypeStr::Long(s.cast::<PyString>()?.to_str()?.to_owned()))
}

/// numpy's `dtype.str`: short ones (a number type) on the stack.
enum DtypeStr {
    Short([u8; 8], usize),
    Long(String),
}

impl DtypeStr {
    fn push(&mut self, b: u8) {
        if let DtypeStr::Short(buf, n) = self
            && *n < buf.len()
        {
            buf[*n] = b;
            *n += 1;
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            DtypeStr::Short(buf, n) => &buf[..*n],
            DtypeStr::Long(s) => s.as_bytes(),
        }
    }

    fn len(&self) -> usize {
        self.as_bytes().len()
    }
}
impl Writer {
    /// A numpy array of a plain dtype (numbers, booleans, dates, fixed-width strings), C- or
    /// Fortran-contiguous: inline up to 4 KiB, else by reference when it views a region we
    /// hold, else out of band (its buffer is exported until the payload is written). False
    /// (pickle) for anything else, and for datetimes over 64 KiB (they export no buffer).
    pub(crate) fn array(&mut self, v: &Bound<'_, PyAny>) -> PyResult<bool> {
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
        // A writable one is memory of `pymizu.empty`/`zeros` (every other view of shared
        // memory is read-only): it goes by reference whatever its size, writable, and never
        // by value (its bytes are not Rust's to read while tasks may write them).
        let writable = is_writeable(a);
        let shared = (nbytes > INLINE_ARRAY || writable)
            .then(|| Region::containing(data_ptr(a)))
            .flatten()
            .filter(|(r, off)| off + nbytes <= r.len());
        if writable && shared.is_some() && !self.refs_ok {
            return Ok(false);
        }
        let writable = writable && shared.is_some();
        let by_ref = shared.filter(|(r, _)| self.refs_ok && r.still_named());
        if writable && by_ref.is_none() {
            // A region whose name is gone cannot be adopted by a receiver: pickle (which
            // refuses nothing) would copy it; say so instead.
            return Err(pyo3::exceptions::PyValueError::new_err(
                "pymizu: a writable shared array whose memory is being released cannot be sent",
            ));
        }
        // A large array of this process's own memory goes by reference to a shared copy,
        // which serves its later sends as long as its bytes stay the same (`repeats.rs`).
        let by_ref = match (by_ref, self.repeats) {
            (None, Some(pool)) if !writable && nbytes >= crate::repeats::REPEAT_MIN => Some((
                crate::repeats::shared_copy(v, data_ptr(a), nbytes, pool)?,
                0,
            )),
            (r, _) => r,
        };
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
        self.out.push(if by_ref.is_some() || oob.is_some() {
            tag::PY_NDARRAY_OOB
        } else {
            tag::PY_NDARRAY
        });
        self.out.push(order);
        self.out.push(dlen);
        self.out.extend_from_slice(dstr.as_bytes());
        self.out.push(ndim);
        for &d in a.shape() {
            self.out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        let beside = match (by_ref, oob) {
            // The descriptor (a new reference) is written when the payload is.
            (Some((region, offset)), _) => Beside::Ref {
                region,
                offset,
                len: nbytes,
                writable,
            },
            (None, Some(b)) => Beside::Copy(Exported(b)),
            (None, None) => {
                if !self.len_u32(nbytes) {
                    return Ok(false);
                }
                if nbytes > 0 {
                    // SAFETY: the array is contiguous in `order` (its flags say so), so its
                    // `nbytes` bytes start at its data pointer; they stay valid while we hold it
                    // and the GIL (no Python code runs during the copy).
                    let src = unsafe { std::slice::from_raw_parts(data_ptr(a), nbytes) };
                    self.out.extend_from_slice(src);
                }
                return Ok(true);
            }
        };
        self.count(self.beside.len());
        self.beside.push(beside);
        Ok(true)
    }
}

/// Whether numpy lets `a` be written.
fn is_writeable(a: &Bound<'_, PyUntypedArray>) -> bool {
    // SAFETY: `a` is a live PyArrayObject (its type was checked); reading its flags field.
    unsafe { (*_PyArray_GET_ITEM_DATA(a.as_array_ptr())).flags & NPY_ARRAY_WRITEABLE != 0 }
}

/// The start of a contiguous array's bytes.
pub(crate) fn data_ptr(a: &Bound<'_, PyUntypedArray>) -> *const u8 {
    // SAFETY: `a` is a live PyArrayObject (its type was checked); reading its data field.
    unsafe {
        (*_PyArray_GET_ITEM_DATA(a.as_array_ptr()))
            .data
            .cast::<u8>()
    }
}
