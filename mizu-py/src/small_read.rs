//! Reading the fast path's payloads (the format: `small.rs`): a task's result, a call's
//! function and arguments, and the references a payload nobody reads gives back. Input is
//! untrusted: every length and offset is checked and nesting is bounded.

use arrow_buffer::Buffer;
use mizu_pool::wire::compact::{self, form, tag};
use mizu_pool::wire::oob;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};

use crate::cursor::{Reader, bad, wire_bad};

use crate::small::MAX_DEPTH;

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
        t @ (tag::PY_NDARRAY | tag::PY_NDARRAY_OOB) => crate::ndarray::read_array(py, r, t)?,
        t => return Err(bad(&format!("unknown value tag {t:#04x}"))),
    })
}

/// The function's pickle in a small call's body at `r` (its call item's head), `r` left at the
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

/// The body of a `K` payload (after its buffer table, when it has one) and its reader, which
/// holds the payload's buffers (those by reference adopted).
fn reader(buf: &Buffer) -> PyResult<Reader<'_>> {
    let b = buf.as_slice();
    if b.first() == Some(&oob::tag::COMPACT) {
        return Ok(Reader {
            r: compact::Reader::new(b, 1, 1),
            beside: Vec::new(),
        });
    }
    let p = oob::parse(b).map_err(wire_bad)?;
    if p.tag != oob::tag::COMPACT {
        return Err(bad("not a small payload"));
    }
    let beside = oob::receive(buf, p.entries, &crate::payload::MAPPER).map_err(wire_bad)?;
    Ok(Reader {
        r: compact::Reader::new(&b[..p.body.end], p.body.start, p.body.start),
        beside,
    })
}

/// The first byte of a `K` payload's value (None for any other payload).
fn first_item(b: &[u8]) -> Option<u8> {
    match *b.first()? {
        oob::tag::COMPACT => b.get(1).copied(),
        t if t == oob::tag::COMPACT | oob::tag::WITH_BUFFERS => {
            let n = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?) as usize;
            b.get(oob::HEADER.checked_add(n.checked_mul(oob::ENTRY)?)?)
                .copied()
        }
        _ => None,
    }
}

/// Whether `b` is a small call's payload.
pub fn is_call(b: &[u8]) -> bool {
    first_item(b) == Some(tag::CALL)
}

/// Whether `b` is a small value's payload.
pub fn is_value(b: &[u8]) -> bool {
    first_item(b).is_some_and(|t| t != tag::CALL)
}

/// [`decode_value`] of a task's outcome (one without buffers read where it is: no array can
/// view its bytes).
pub fn decode_outcome(py: Python<'_>, o: mizu_pool::OutcomeBytes) -> PyResult<Bound<'_, PyAny>> {
    match o {
        mizu_pool::OutcomeBytes::Small { .. } if o.first() == Some(&oob::tag::COMPACT) => value_of(
            py,
            Reader {
                r: compact::Reader::new(&o, 1, 1),
                beside: Vec::new(),
            },
        ),
        o => decode_value(py, &o.into_buffer()),
    }
}

/// The value of a small value's payload.
pub fn decode_value<'py>(py: Python<'py>, buf: &Buffer) -> PyResult<Bound<'py, PyAny>> {
    value_of(py, reader(buf)?)
}

/// The value a reader of a value's body holds, the whole of it.
fn value_of<'py>(py: Python<'py>, mut r: Reader<'_>) -> PyResult<Bound<'py, PyAny>> {
    if r.r.bytes().get(r.r.pos) == Some(&tag::CALL) {
        return Err(bad("not a value"));
    }
    let v = read(py, &mut r, 0)?;
    if !r.r.at_end() {
        return Err(bad("trailing bytes"));
    }
    Ok(v)
}

/// A decoded small call: the function's pickle, the arguments and the keyword arguments.
pub struct Call<'a, 'py> {
    /// The function's pickle (by reference).
    pub head: &'a [u8],
    /// Positional arguments.
    pub args: Bound<'py, PyTuple>,
    /// Keyword arguments, if any.
    pub kwargs: Option<Bound<'py, PyDict>>,
}

/// Reads a small call's payload.
pub fn decode_call<'a, 'py>(py: Python<'py>, buf: &'a Buffer) -> PyResult<Call<'a, 'py>> {
    let mut r = reader(buf)?;
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
