//! The fast path for common values: `None`, `bool`, 64-bit `int`, `float`, `str`, `bytes`,
//! contiguous numpy arrays of plain dtypes (`ndarray.rs`) and tuples, lists and dicts of them
//! are written and read natively, without pickle.
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

use std::sync::Arc;

use arrow_buffer::Buffer;
use mizu_pool::Fill;
use mizu_wire::{Region, RegionDesc};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyValueError;
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
pub(crate) const MAX_SIZE: usize = 1 << 20;
/// Payload tag of small values with out-of-band arrays (`W`, the body, the array bytes).
pub const TAG_WIDE: u8 = b'W';
/// Alignment of out-of-band array bytes (from the start of their area).
pub(crate) const ALIGN: usize = 64;
/// Writes small values; gives up (returns false) on anything else.
#[derive(Default)]
pub(crate) struct Writer {
    pub(crate) out: Vec<u8>,
    /// Mutable containers written so far (by address): one seen twice gives up.
    seen: Vec<usize>,
    /// Out-of-band arrays, in order, and where each starts in the array area.
    pub(crate) bufs: Vec<(PyUntypedBuffer, usize)>,
    /// The array area's length so far.
    pub(crate) area: usize,
    /// Arrays sent by reference: their regions and where each descriptor goes in `out`.
    pub(crate) refs: Vec<(Arc<Region>, usize)>,
    /// Whether arrays may go by reference (not for bytes that are never delivered).
    pub(crate) refs_ok: bool,
}

impl Writer {
    pub(crate) fn len_u32(&mut self, n: usize) -> bool {
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

    fn tuple(&mut self, t: &Bound<'_, PyTuple>, depth: u32) -> bool {
        self.out.push(b'T');
        if !self.len_u32(t.len()) {
            return false;
        }
        t.iter().all(|x| self.value(&x, depth))
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

pub(crate) fn bad(why: &str) -> PyErr {
    PyValueError::new_err(format!("pymizu: malformed small payload: {why}"))
}

/// Reads values from untrusted bytes.
pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) at: usize,
    /// A `W` payload's bytes and where its array area starts.
    pub(crate) oob: Option<(&'a Buffer, usize)>,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> PyResult<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| bad("truncated"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub(crate) fn u32(&mut self) -> PyResult<usize> {
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
        t @ (b'A' | b'X' | b'R') => crate::ndarray::read_array(py, r, t)?,
        t => return Err(bad(&format!("unknown value tag {t:#04x}"))),
    })
}

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
        Some(&crate::codec::TAG_BUFFERS) => return crate::codec::release_refs(p),
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
            drop(crate::ndarray::MAPPER.adopt(&d));
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
