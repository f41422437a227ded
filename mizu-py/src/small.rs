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
//! items, `D` u32 count + key, value pairs, `A` a numpy array: order `C`/`F`, u8 length + the
//! dtype's `str`, u8 dimensions + u64 each, u32 length + the bytes in that order. Input is untrusted: every length is checked and
//! nesting is bounded.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

/// Payload tag of a small result value.
pub const TAG_VALUE: u8 = b'V';
/// Payload tag of a small call.
pub const TAG_CALL: u8 = b'C';
/// Containers nested deeper than this go through pickle.
const MAX_DEPTH: u32 = 16;
/// Values that encode larger than this go through pickle.
const MAX_SIZE: usize = 1 << 20;
/// Arrays larger than this go through pickle (out of band, without a copy).
const MAX_ARRAY: usize = 64 << 10;
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

/// An array from its inline encoding: a read-only view of a private copy of the bytes.
fn read_array<'py>(py: Python<'py>, r: &mut Reader<'_>) -> PyResult<Bound<'py, PyAny>> {
    let order = r.take(1)?[0];
    let dlen = r.take(1)?[0] as usize;
    let dstr = std::str::from_utf8(r.take(dlen)?).map_err(|_| bad("a dtype is not UTF-8"))?;
    let ndim = r.take(1)?[0] as usize;
    let mut shape = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        shape.push(u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes")));
    }
    let n = r.u32()?;
    let data = PyBytes::new(py, r.take(n)?);
    let order = match order {
        b'C' => "C",
        b'F' => "F",
        _ => return Err(bad("unknown array order")),
    };
    let np = py
        .import("numpy")
        .map_err(|_| bad("an array arrived but numpy cannot be imported"))?;
    let dtype = np
        .getattr(intern!(py, "dtype"))?
        .call1((dstr,))
        .map_err(|_| bad("unknown dtype"))?;
    let kind: char = dtype.getattr(intern!(py, "kind"))?.extract()?;
    if !PLAIN_KINDS.contains(kind) {
        return Err(bad("an array of a dtype that is not sent inline"));
    }
    let flat = np
        .getattr(intern!(py, "frombuffer"))?
        .call1((data, dtype))
        .map_err(|_| bad("array bytes do not fit its dtype"))?;
    let kw = PyDict::new(py);
    kw.set_item(intern!(py, "order"), order)?;
    flat.call_method(intern!(py, "reshape"), (shape,), Some(&kw))
        .map_err(|_| bad("array bytes do not fit its shape"))
}

/// Writes small values; gives up (returns false) on anything else.
struct Writer {
    out: Vec<u8>,
    /// Mutable containers written so far (by address): one seen twice gives up.
    seen: Vec<usize>,
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
        let nbytes: usize = v.getattr(intern!(py, "nbytes"))?.extract()?;
        if nbytes > MAX_ARRAY || self.out.len() + nbytes > MAX_SIZE {
            return Ok(false);
        }
        let dtype = v.getattr(intern!(py, "dtype"))?;
        let kind: char = dtype.getattr(intern!(py, "kind"))?.extract()?;
        if !PLAIN_KINDS.contains(kind) {
            return Ok(false);
        }
        let flags = v.getattr(intern!(py, "flags"))?;
        let order = if flags.getattr(intern!(py, "c_contiguous"))?.is_truthy()? {
            b'C'
        } else if flags.getattr(intern!(py, "f_contiguous"))?.is_truthy()? {
            b'F'
        } else {
            return Ok(false);
        };
        let dstr = dtype.getattr(intern!(py, "str"))?;
        let dstr = dstr.cast::<PyString>()?.to_str()?;
        let shape: Vec<u64> = v.getattr(intern!(py, "shape"))?.extract()?;
        let (Ok(dlen), Ok(ndim)) = (u8::try_from(dstr.len()), u8::try_from(shape.len())) else {
            return Ok(false);
        };
        let data = v.call_method1(
            intern!(py, "tobytes"),
            (if order == b'C' { "C" } else { "F" },),
        )?;
        let data = data.cast::<PyBytes>()?.as_bytes();
        self.out.push(b'A');
        self.out.push(order);
        self.out.push(dlen);
        self.out.extend_from_slice(dstr.as_bytes());
        self.out.push(ndim);
        for d in shape {
            self.out.extend_from_slice(&d.to_le_bytes());
        }
        Ok(self.len_u32(data.len()) && {
            self.out.extend_from_slice(data);
            true
        })
    }

    fn tuple(&mut self, t: &Bound<'_, PyTuple>, depth: u32) -> bool {
        self.out.push(b'T');
        if !self.len_u32(t.len()) {
            return false;
        }
        t.iter().all(|x| self.value(&x, depth))
    }
}

/// The `V` payload of `v`, or None when `v` is not a small value.
pub fn encode_value(v: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    let mut w = Writer {
        out: Vec::with_capacity(16),
        seen: Vec::new(),
    };
    w.out.push(TAG_VALUE);
    w.value(v, 0).then_some(w.out)
}

/// The `C` payload of a call of the function pickled as `head` (by reference), or None when
/// an argument is not a small value or the pickle is too long.
pub fn encode_call(
    head: &[u8],
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> Option<Vec<u8>> {
    let m = u16::try_from(head.len()).ok()?;
    let mut w = Writer {
        out: Vec::with_capacity(head.len() + 32),
        seen: Vec::new(),
    };
    w.out.push(TAG_CALL);
    w.out.extend_from_slice(&m.to_le_bytes());
    w.out.extend_from_slice(head);
    if !w.tuple(args, 1) {
        return None;
    }
    match kwargs {
        Some(k) if !k.is_empty() => w.value(k.as_any(), 0).then_some(w.out),
        _ => {
            w.out.push(b'n');
            Some(w.out)
        }
    }
}

fn bad(why: &str) -> PyErr {
    PyValueError::new_err(format!("pymizu: malformed small payload: {why}"))
}

/// Reads values from untrusted bytes.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
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
        b'A' => read_array(py, r)?,
        t => return Err(bad(&format!("unknown value tag {t:#04x}"))),
    })
}

/// The value of a `V` payload (`b` includes the tag).
pub fn decode_value<'py>(py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let mut r = Reader { b, at: 1 };
    let v = read(py, &mut r, 0)?;
    if r.at != b.len() {
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

/// Reads a `C` payload (`b` includes the tag).
pub fn decode_call<'a, 'py>(py: Python<'py>, b: &'a [u8]) -> PyResult<Call<'a, 'py>> {
    let mut r = Reader { b, at: 1 };
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
    if r.at != b.len() {
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
    Small(Vec<u8>),
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
