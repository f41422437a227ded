//! Reading the fast path's payloads (the format: `small.rs`): a task's result, a call's
//! function and arguments, and the references a payload nobody reads gives back. Input is
//! untrusted: every length and offset is checked and nesting is bounded.

use arrow_buffer::Buffer;
use mizu_pool::wire::RegionDesc;
use mizu_pool::wire::compact::{self, form, tag};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};

use crate::cursor::{ALIGN, Reader, bad, wire_bad};

use crate::small::{MAX_DEPTH, TAG_CALL, TAG_VALUE, TAG_WIDE, VALUE_BASE};

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

/// The tuple at `r` (its count first). One of up to three items (most calls' arguments) is
/// read without a vector: one per call's arguments was a tenth of the cost of reading a
/// small call.
fn read_tuple<'py>(
    py: Python<'py>,
    r: &mut Reader<'_>,
    depth: u32,
) -> PyResult<Bound<'py, PyTuple>> {
    let n = r.count()?;
    let mut item = || read(py, r, depth + 1);
    match n {
        0 => Ok(PyTuple::empty(py)),
        1 => PyTuple::new(py, [item()?]),
        2 => PyTuple::new(py, [item()?, item()?]),
        3 => PyTuple::new(py, [item()?, item()?, item()?]),
        _ => PyTuple::new(py, (0..n).map(|_| item()).collect::<PyResult<Vec<_>>>()?),
    }
}

/// Reads one value at `r`. An `int`, the commonest item, is read here, outside the frame of
/// the function that reads everything else.
#[inline(always)]
fn read<'py>(py: Python<'py>, r: &mut Reader<'_>, depth: u32) -> PyResult<Bound<'py, PyAny>> {
    let at = r.r.pos;
    if let Some(&[tag::INT, ref v @ ..]) = r.r.bytes().get(at..at + 9)
        && depth <= MAX_DEPTH
    {
        r.r.pos = at + 9;
        let i = i64::from_le_bytes(v.try_into().expect("8 bytes"));
        return Ok(i.into_pyobject(py)?.into_any());
    }
    read_other(py, r, depth)
}

fn read_other<'py>(py: Python<'py>, r: &mut Reader<'_>, depth: u32) -> PyResult<Bound<'py, PyAny>> {
    if depth > MAX_DEPTH {
        return Err(bad("nested too deep"));
    }
    let t = r.take(1)?[0];
    Ok(match t {
        tag::NONE => py.None().into_bound(py),
        tag::TRUE => PyBool::new(py, true).to_owned().into_any(),
        tag::FALSE => PyBool::new(py, false).to_owned().into_any(),
        tag::INT => {
            r.r.i64("int")
                .map_err(wire_bad)?
                .into_pyobject(py)?
                .into_any()
        }
        tag::FLOAT => PyFloat::new(py, r.r.f64("float").map_err(wire_bad)?).into_any(),
        tag::STR => PyString::new(py, r.r.str("str").map_err(wire_bad)?).into_any(),
        tag::BYTES => PyBytes::new(py, r.r.bytes_item("bytes").map_err(wire_bad)?).into_any(),
        tag::PY_TUPLE => read_tuple(py, r, depth)?.into_any(),
        tag::LIST => PyList::new(py, read_items(py, r, depth)?)?.into_any(),
        tag::DICT => {
            let n = r.count()?;
            let d = PyDict::new(py);
            for _ in 0..n {
                let k = r.r.str("dict key").map_err(wire_bad)?;
                d.set_item(k, read(py, r, depth + 1)?)?;
            }
            d.into_any()
        }
        tag::PY_DICT => {
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
        t @ (tag::PY_NDARRAY
        | tag::PY_NDARRAY_OOB
        | tag::PY_NDARRAY_REF
        | tag::PY_NDARRAY_REF_MUT) => crate::ndarray::read_array(py, r, t)?,
        t => return Err(bad(&format!("unknown value tag {t:#04x}"))),
    })
}

/// Walks one value of a small payload without making Python objects, calling `f` with the
/// descriptor of every array by reference; None when the bytes are malformed.
fn walk(r: &mut compact::Reader<'_>, depth: u32, f: &mut impl FnMut(&[u8])) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    match r.u8("tag").ok()? {
        tag::NONE | tag::TRUE | tag::FALSE => {}
        tag::INT | tag::FLOAT => {
            r.take("number", 8).ok()?;
        }
        tag::STR => {
            r.str("str").ok()?;
        }
        tag::BYTES => {
            r.bytes_item("bytes").ok()?;
        }
        tag::PY_TUPLE | tag::LIST => {
            for _ in 0..r.len("count").ok()? {
                walk(r, depth + 1, f)?;
            }
        }
        tag::DICT => {
            for _ in 0..r.len("count").ok()? {
                r.str("key").ok()?;
                walk(r, depth + 1, f)?;
            }
        }
        tag::PY_DICT => {
            for _ in 0..r.len("count").ok()? {
                walk(r, depth + 1, f)?;
                walk(r, depth + 1, f)?;
            }
        }
        t @ (tag::PY_NDARRAY
        | tag::PY_NDARRAY_OOB
        | tag::PY_NDARRAY_REF
        | tag::PY_NDARRAY_REF_MUT) => {
            r.take("order", 1).ok()?;
            let dlen = r.u8("dtype").ok()? as usize;
            r.take("dtype", dlen).ok()?;
            let ndim = r.u8("ndim").ok()? as usize;
            r.take("shape", 8 * ndim).ok()?;
            match t {
                tag::PY_NDARRAY => {
                    let n = u32::from_le_bytes(r.array("length").ok()?) as usize;
                    r.take("data", n).ok()?;
                }
                tag::PY_NDARRAY_OOB => {
                    r.take("place", 16).ok()?;
                }
                _ => {
                    f(r.take("descriptor", 64).ok()?);
                    r.take("place", 16).ok()?;
                }
            }
        }
        _ => return None,
    }
    Some(())
}

/// Walks the arguments and keyword arguments of a `C` body at `r` (after the function).
fn walk_args(r: &mut compact::Reader<'_>, f: &mut impl FnMut(&[u8])) -> Option<()> {
    for _ in 0..r.len("count").ok()? {
        walk(r, 1, f)?;
    }
    for _ in 0..r.len("count").ok()? {
        r.str("name").ok()?;
        walk(r, 1, f)?;
    }
    Some(())
}

/// The function's pickle in a `C` body at `r` (its call item's head), `r` left at the
/// arguments.
fn call_head<'a>(r: &mut compact::Reader<'a>) -> mizu_pool::wire::Result<&'a [u8]> {
    if r.u8("call")? != tag::CALL || r.u8("call form")? != form::NATIVE {
        return Err(mizu_pool::wire::WireError::Malformed {
            offset: r.pos,
            why: "not a call of a pickled function".into(),
        });
    }
    let n = r.len("function")?;
    r.take("function", n)
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
            drop(crate::payload::MAPPER.adopt(&d));
        }
    };
    let mut r = compact::Reader::new(body, 1, VALUE_BASE);
    match body.first() {
        Some(&TAG_VALUE) => {
            let _ = walk(&mut r, 0, &mut release);
        }
        Some(&TAG_CALL) if call_head(&mut r).is_ok() => {
            let _ = walk_args(&mut r, &mut release);
        }
        _ => {}
    }
}

/// The body of a small payload (a `W` payload's `V` or `C` part) and its reader.
fn reader(buf: &Buffer) -> PyResult<Reader<'_>> {
    let b = buf.as_slice();
    if b.first() != Some(&TAG_WIDE) {
        return Ok(Reader {
            r: compact::Reader::new(b, 1, VALUE_BASE),
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
        r: compact::Reader::new(&b[8..8 + m], 1, VALUE_BASE),
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

/// [`decode_value`] of a task's outcome (a small one read where it is: no array can view
/// its bytes, since it holds no array area).
pub fn decode_outcome(py: Python<'_>, o: mizu_pool::OutcomeBytes) -> PyResult<Bound<'_, PyAny>> {
    match o {
        mizu_pool::OutcomeBytes::Small { .. } if o.first() != Some(&TAG_WIDE) => value_of(
            py,
            Reader {
                r: compact::Reader::new(&o, 1, VALUE_BASE),
                oob: None,
            },
        ),
        o => decode_value(py, &o.into_buffer()),
    }
}

/// The value of a `V` payload (or a `W` payload holding one).
pub fn decode_value<'py>(py: Python<'py>, buf: &Buffer) -> PyResult<Bound<'py, PyAny>> {
    value_of(py, reader(buf)?)
}

/// The value a reader of a `V` body holds, the whole of it.
fn value_of<'py>(py: Python<'py>, mut r: Reader<'_>) -> PyResult<Bound<'py, PyAny>> {
    if r.r.bytes().first() != Some(&TAG_VALUE) {
        return Err(bad("not a value"));
    }
    let v = read(py, &mut r, 0)?;
    if !r.r.at_end() {
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
    if r.r.bytes().first() != Some(&TAG_CALL) {
        return Err(bad("not a call"));
    }
    let head = call_head(&mut r.r).map_err(wire_bad)?;
    let args = read_tuple(py, &mut r, 0)?;
    let n = r.count()?;
    let kwargs = if n == 0 {
        None
    } else {
        let d = PyDict::new(py);
        for _ in 0..n {
            let k = r.r.str("keyword").map_err(wire_bad)?;
            d.set_item(k, read(py, &mut r, 1)?)?;
        }
        Some(d)
    };
    if !r.r.at_end() {
        return Err(bad("trailing bytes"));
    }
    Ok(Call { head, args, kwargs })
}
