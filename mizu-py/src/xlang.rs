//! Cross-language tasks from Python's side: a pool of R workers (`Pool(language="r")`) and a
//! Python worker serving an R pool. Payloads are `mizu_pool::wire::envelope`s; this module only
//! turns Python objects into `mizu_pool::wire::Value`s and back (`docs/interop.md`): numpy arrays
//! become Arrow arrays (their buffers referenced, not copied, until the payload is written)
//! and received numeric Arrow arrays become read-only numpy views of the shared memory.

use std::cell::RefCell;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, DurationMicrosecondType, Float64Type, Int32Type, Int64Type,
    TimestampMicrosecondType, UInt8Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field, TimeUnit};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString};

use mizu_pool::wire::envelope::{self, Context, Envelope, Received, RemoteError};
use mizu_pool::wire::{CallTarget, Value};

use crate::shmbuf::{ShmBuffer, Source};
use crate::xarray::{at, helper, not_portable};

fn view(
    py: Python<'_>,
    values: Buffer,
    dtype: &str,
    dim: &Option<Vec<i32>>,
    source: Option<(Buffer, &Arc<Field>, &ArrayRef)>,
) -> PyResult<Py<PyAny>> {
    let buf = match source {
        Some((bytes, field, array)) => {
            let shape = match dim {
                Some(d) => d.iter().map(|&x| x as usize).collect(),
                None => vec![array.len()],
            };
            let src = Source {
                bytes,
                field: field.clone(),
                array: array.clone(),
                dtype: dtype.to_owned(),
                shape,
            };
            Py::new(py, ShmBuffer::sourced(values, src))?
        }
        None => Py::new(py, ShmBuffer::new(values))?,
    };
    Ok(helper(py)?
        .getattr("view")?
        .call1((buf, dtype, dim.clone()))?
        .unbind())
}

/// A received Arrow array as the Python object users expect: a read-only numpy view for
/// numbers, dates and times without nulls (and doubles whose nulls hold NaN), a numpy copy for
/// booleans, doubles with other nulls, dates and times with nulls (NaT in their place) and
/// strings, else the `ArrowArray` itself (factors, integers, booleans and strings with NA,
/// zoned timestamps, `difftime`s with NA in units other than seconds: any Arrow consumer takes
/// it).
fn array_to_py(
    py: Python<'_>,
    field: Arc<Field>,
    array: ArrayRef,
    src: Option<Buffer>,
) -> PyResult<Py<PyAny>> {
    // Received metadata that does not fit is a malformed payload, not a value of the wrong
    // type.
    let dim = mizu_pool::wire::rmeta::dim(&field, array.len())
        .map_err(|e| crate::err(format!("cannot read a cross-language value: {e}")))?;
    let no_nulls = array.null_count() == 0;
    // A view of a copy or conversion, and a view of the array's own values (sent on by
    // reference while unchanged).
    let plain = |b: &Buffer, dtype: &str| view(py, b.clone(), dtype, &dim, None);
    let own = |b: &Buffer, dtype: &str| {
        let source = src.clone().map(|bytes| (bytes, &field, &array));
        view(py, b.clone(), dtype, &dim, source)
    };
    match array.data_type() {
        DataType::Float64 => {
            let a = array.as_primitive::<Float64Type>();
            let v = a.values();
            match a.nulls() {
                Some(n)
                    if n.null_count() > 0
                        && !n.iter().zip(v.iter()).all(|(ok, x)| ok || x.is_nan()) =>
                {
                    let filled: Vec<f64> = n
                        .iter()
                        .zip(v.iter())
                        .map(|(ok, &x)| if ok { x } else { f64::NAN })
                        .collect();
                    return plain(&Buffer::from_vec(filled), "<f8");
                }
                _ => return own(v.inner(), "<f8"),
            }
        }
        DataType::Int32 if no_nulls => {
            return own(array.as_primitive::<Int32Type>().values().inner(), "<i4");
        }
        DataType::Int64 if no_nulls => {
            return own(array.as_primitive::<Int64Type>().values().inner(), "<i8");
        }
        DataType::UInt8 if no_nulls => {
            return own(array.as_primitive::<UInt8Type>().values().inner(), "u1");
        }
        DataType::Boolean if no_nulls => {
            let a = array.as_boolean();
            let bytes: Vec<u8> = a.values().iter().map(u8::from).collect();
            return plain(&Buffer::from_vec(bytes), "?");
        }
        // Dates and times with NA: numpy's own NaT in their place (a copy).
        DataType::Date32 => {
            let a = array.as_primitive::<Date32Type>();
            let days = with_nat(a.values().iter().map(|&d| i64::from(d)), a.nulls());
            return plain(&Buffer::from_vec(days), "<M8[D]");
        }
        // No zone, or UTC: what numpy's zoneless datetimes mean.
        DataType::Timestamp(TimeUnit::Microsecond, tz)
            if tz.as_deref().is_none_or(|z| z == "UTC") =>
        {
            let a = array.as_primitive::<TimestampMicrosecondType>();
            if no_nulls {
                return own(a.values().inner(), "<M8[us]");
            }
            let us = with_nat(a.values().iter().copied(), a.nulls());
            return plain(&Buffer::from_vec(us), "<M8[us]");
        }
        // With NA, in seconds (what numpy's timedeltas become in R): a copy holds no link to
        // the received array, so other units would be lost on the way back.
        DataType::Duration(TimeUnit::Microsecond)
            if no_nulls
                || field
                    .metadata()
                    .get(mizu_pool::wire::rmeta::UNITS)
                    .is_none_or(|u| u == "secs") =>
        {
            let a = array.as_primitive::<DurationMicrosecondType>();
            if no_nulls {
                return own(a.values().inner(), "<m8[us]");
            }
            let us = with_nat(a.values().iter().copied(), a.nulls());
            return plain(&Buffer::from_vec(us), "<m8[us]");
        }
        DataType::Utf8 | DataType::LargeUtf8 if no_nulls => {
            let l = PyList::empty(py);
            let mut push = |s: Option<&str>| match s {
                Some(s) => l.append(PyString::new(py, s)),
                None => l.append(py.None()),
            };
            if let Some(a) = array.as_string_opt::<i32>() {
                a.iter().try_for_each(&mut push)?;
            } else {
                array.as_string::<i64>().iter().try_for_each(&mut push)?;
            }
            return Ok(helper(py)?
                .getattr("strings")?
                .call1((l, dim.clone()))?
                .unbind());
        }
        _ => {}
    }
    match src {
        Some(bytes) => crate::wire::shared_to_py(py, bytes, Value::Array { field, array }),
        None => crate::wire::to_py(py, Value::Array { field, array }),
    }
}

/// `values` with numpy's NaT (`i64::MIN`) wherever `nulls` says a value is missing.
fn with_nat(
    values: impl Iterator<Item = i64>,
    nulls: Option<&arrow_buffer::NullBuffer>,
) -> Vec<i64> {
    match nulls {
        Some(n) => values
            .zip(n.iter())
            .map(|(v, ok)| if ok { v } else { i64::MIN })
            .collect(),
        None => values.collect(),
    }
}

/// A decoded value as the Python object users expect (see [`array_to_py`]); tables stay
/// `ArrowTable`s (pyarrow, polars and pandas take them without copying numeric columns).
pub(crate) fn to_py_natural(py: Python<'_>, v: Value) -> PyResult<Py<PyAny>> {
    match v {
        Value::List(items) => {
            let l = PyList::empty(py);
            for it in items {
                l.append(to_py_natural(py, it)?)?;
            }
            Ok(l.into_any().unbind())
        }
        Value::Dict(kv) => {
            let d = PyDict::new(py);
            for (k, it) in kv {
                d.set_item(k, to_py_natural(py, it)?)?;
            }
            Ok(d.into_any().unbind())
        }
        Value::Array { field, array } => array_to_py(py, field, array, None),
        Value::Shared { bytes, value } => match *value {
            Value::Array { field, array } => array_to_py(py, field, array, Some(bytes)),
            v => crate::wire::shared_to_py(py, bytes, v),
        },
        v => crate::wire::to_py(py, v),
    }
}

/// `v` with its arrays and tables in the R mapping's types where they are not (pandas'
/// int8-keyed categoricals, nanosecond timestamps, string views, ...; see
/// `mizu_pool::wire::rmeta::normalize`), so that an R receiver views them as they are and can send
/// them back by reference.
fn for_r(v: Value) -> Value {
    use mizu_pool::wire::rmeta;
    match v {
        Value::Table(b) => Value::Table(rmeta::normalize_batch(b)),
        Value::Array { field, array } => match rmeta::classify(&field) {
            Ok(_) => Value::Array { field, array },
            Err(_) => match rmeta::normalize(&field, &array) {
                Some((f, a)) => Value::Array {
                    field: Arc::new(f),
                    array: a,
                },
                None => Value::Array { field, array },
            },
        },
        Value::List(items) => Value::List(items.into_iter().map(for_r).collect()),
        Value::Dict(kv) => Value::Dict(kv.into_iter().map(|(k, v)| (k, for_r(v))).collect()),
        v => v,
    }
}

/// The payload of a task calling `call` (a `pymizu.wire.Call`).
pub(crate) fn task_envelope(call: &Bound<'_, PyAny>) -> PyResult<Envelope> {
    let value = call_value(call)?;
    Envelope::task(&value, Context::default()).map_err(|e| not_portable(e.to_string()))
}

/// The payloads of a map of `call` over `items` (each a tuple of arguments when `spread`),
/// `size` elements a chunk; element `i` runs on the stream `(seed, offset + i)`.
pub(crate) fn chunk_envelopes(
    call: &Bound<'_, PyAny>,
    items: &[Bound<'_, PyAny>],
    spread: bool,
    seed: Option<u64>,
    offset: u64,
    size: usize,
) -> PyResult<Vec<Envelope>> {
    let value = call_value(call)?;
    if matches!(
        value,
        Value::Call {
            target: CallTarget::Source(_),
            ..
        }
    ) {
        return Err(PyTypeError::new_err(
            "map() needs a call that names a function, not source text",
        ));
    }
    let mut out = Vec::with_capacity(items.len().div_ceil(size.max(1)));
    for (k, part) in items.chunks(size.max(1)).enumerate() {
        let first = k * size.max(1);
        let mut elements = Vec::with_capacity(part.len());
        for (j, x) in part.iter().enumerate() {
            let v = at(format!("element {}: ", first + j), || {
                crate::wire::from_py(x)
            })?;
            elements.push(for_r(v));
        }
        let chunk = envelope::Chunk { elements, spread };
        let ctx = Context {
            seed,
            index: offset + first as u64,
        };
        out.push(
            Envelope::chunk(value.clone(), chunk, ctx).map_err(|e| not_portable(e.to_string()))?,
        );
    }
    Ok(out)
}

/// `call` (a `pymizu.wire.Call`) as a call value.
fn call_value(call: &Bound<'_, PyAny>) -> PyResult<Value> {
    let py = call.py();
    static CALL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let class = CALL.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("pymizu.wire")?.getattr("Call")?.unbind())
    })?;
    if !call.is_instance(class.bind(py))? {
        return Err(PyTypeError::new_err(format!(
            "a pool of another language runs pymizu.call(...) tasks, not a {}",
            call.get_type().name()?
        )));
    }
    let target: String = call.getattr("target")?.extract()?;
    let source: bool = call.getattr("source")?.is_truthy()?;
    let mut args = Vec::new();
    for (i, a) in call.getattr("args")?.try_iter()?.enumerate() {
        let a = a?;
        args.push(for_r(at(format!("args[{i}]"), || {
            crate::wire::from_py(&a)
        })?));
    }
    let kw = call.getattr("kwargs")?;
    let kw = kw
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("Call.kwargs must be a dict"))?;
    let mut kwargs = Vec::with_capacity(kw.len());
    for (k, v) in kw.iter() {
        let k: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err("argument names must be str"))?;
        let v = for_r(at(format!("{k}="), || crate::wire::from_py(&v))?);
        kwargs.push((k, v));
    }
    let target = if source {
        CallTarget::Source(target)
    } else {
        CallTarget::Name(target)
    };
    Ok(Value::Call {
        target,
        args,
        kwargs,
    })
}

/// A value as a cross-language value payload (a channel message to a peer of another
/// language).
pub(crate) fn value_payload(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let v = for_r(crate::wire::from_py(obj)?);
    Envelope::value(&v)
        .map(|e| e.to_vec())
        .map_err(|e| not_portable(e.to_string()))
}

/// `pymizu.share(a)` of a numpy array that the cross-language mapping keeps as it is (same
/// dtype, shape and layout): the array written as a standalone value into shared memory, as
/// it is sent to R, and a read-only view of it like a received one, so that R workers too
/// view it by reference. None when the mapping would change it (`share` then copies the
/// bytes alone).
#[pyfunction]
pub fn share_ndarray(py: Python<'_>, a: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
    let Ok(v @ Value::Array { .. }) = crate::wire::from_py(a) else {
        return Ok(None);
    };
    let kept = for_r(v.clone());
    let same_type = match (&v, &kept) {
        (Value::Array { field: f, .. }, Value::Array { field: g, .. }) => {
            f.data_type() == g.data_type()
        }
        _ => false,
    };
    if !same_type {
        return Ok(None);
    }
    let env = Envelope::value(&kept).map_err(|e| not_portable(e.to_string()))?;
    let region = py.detach(|| mizu_pool::share::filled(env.len(), |b| env.write_to(b)));
    let region = Arc::new(region.map_err(crate::err)?);
    let payload = mizu_pool::wire::Region::buffer(&region).slice_with_length(0, env.len());
    let (ok, got) = outcome(py, &payload)?;
    let got = got.into_bound(py);
    let same = |attr: &str| -> PyResult<bool> { got.getattr(attr)?.eq(a.getattr(attr)?) };
    // And a view of the shared memory, not a conversion (booleans are bits in Arrow).
    let viewed = ok && crate::codec::shared_region(&got)?.is_some();
    Ok((viewed && same("dtype")? && same("shape")? && same("strides")?).then(|| got.unbind()))
}

/// `obj` as the cross-language payload R receives (a value message), as bytes: for the
/// cross-language golden corpus.
#[pyfunction]
pub fn xlang_dumps<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    Ok(pyo3::types::PyBytes::new(obj.py(), &value_payload(obj)?))
}

/// The Python value of a cross-language value payload (bytes as R sends them), as a task's
/// result would be: for the cross-language golden corpus. Malformed bytes are a `MizuError`.
#[pyfunction]
pub fn xlang_loads(py: Python<'_>, data: &[u8]) -> PyResult<Py<PyAny>> {
    // Arrow parts are read in place from a 64-byte aligned copy, as from a region.
    let mut m = arrow_buffer::MutableBuffer::with_capacity(data.len());
    m.extend_from_slice(data);
    match outcome(py, &m.into())? {
        (true, v) => Ok(v),
        (false, e) => Err(PyErr::from_value(e.into_bound(py))),
    }
}

/// `(ok, value or exception)` of a cross-language outcome payload.
pub(crate) fn outcome(py: Python<'_>, payload: &Buffer) -> PyResult<(bool, Py<PyAny>)> {
    match envelope::read_with(payload, Some(&crate::payload::MAPPER)).map_err(crate::err)? {
        Received::Value(v) => Ok((true, to_py_natural(py, v)?)),
        Received::Warned { value, warnings } => {
            let v = to_py_natural(py, value)?;
            helper(py)?.getattr("warn_r")?.call1((warnings,))?;
            Ok((true, v))
        }
        Received::Error(e) => {
            let x = helper(py)?.getattr("remote_error")?.call1((
                e.language,
                e.classes,
                e.message,
                e.call,
                e.traceback,
            ))?;
            if let Some(i) = e.element {
                x.setattr("_pymizu_element", i)?;
            }
            Ok((false, x.unbind()))
        }
        Received::Task { .. } => Err(crate::err("a task payload where a result was expected")),
    }
}

/// Runs a cross-language task in this (Python) worker: `(ok, payload)`.
pub(crate) fn run_task(py: Python<'_>, payload: &Buffer) -> (bool, Envelope) {
    let fail = |classes: Vec<String>, message: String, traceback: String, element| {
        let e = RemoteError {
            language: "python".into(),
            classes,
            message,
            call: String::new(),
            traceback,
            element,
        };
        (false, Envelope::failure_of(&e))
    };
    let envelope::Task {
        target,
        args,
        kwargs,
        ctx,
        chunk,
    } = match envelope::read_task(payload, Some(&crate::payload::MAPPER)) {
        Ok(t) => t,
        Err(e) => return fail(vec!["MizuError".into()], e.to_string(), String::new(), None),
    };
    let chunked = chunk.is_some();
    let result = (|| -> PyResult<Bound<'_, PyAny>> {
        let call = call_objects(
            py,
            envelope::Task {
                target,
                args,
                kwargs,
                ctx,
                chunk,
            },
        )?;
        let Call {
            target: t,
            source,
            args: a,
            kwargs: k,
            chunk,
            ctx,
        } = call;
        if let Some((xs, spread)) = chunk {
            let k = k.unwrap_or_else(|| PyDict::new(py));
            return helper(py)?.getattr("run_chunk")?.call1((
                t,
                PyList::new(py, a)?,
                k,
                PyList::new(py, xs)?,
                spread,
                ctx.seed,
                ctx.index,
            ));
        }
        if !source && ctx.seed.is_none() {
            // The common case without a Python frame in between: the function, found once.
            let f = function(py, &t)?;
            return f.call(pyo3::types::PyTuple::new(py, a)?, k.as_ref());
        }
        let k = k.unwrap_or_else(|| PyDict::new(py));
        helper(py)?
            .getattr("run")?
            .call1((t, source, PyList::new(py, a)?, k, ctx.seed, ctx.index))
    })();
    let sent = result.and_then(|v| {
        if !chunked {
            return at("result", || crate::wire::from_py(&v)).map(for_r);
        }
        // Each element's result on its own, so that one that cannot cross names its element.
        let list = v.cast::<PyList>()?;
        let mut out = Vec::with_capacity(list.len());
        for (j, x) in list.iter().enumerate() {
            let i = ctx.index + j as u64;
            match at(format!("the result of element {i}"), || {
                crate::wire::from_py(&x)
            }) {
                Ok(v) => out.push(for_r(v)),
                Err(e) => {
                    let _ = e.value(py).setattr("_pymizu_element", i);
                    return Err(e);
                }
            }
        }
        Ok(Value::List(out))
    });
    match sent.and_then(|v| Envelope::value(&v).map_err(|e| not_portable(e.to_string()))) {
        Ok(env) => (true, env),
        Err(e) => {
            let described = helper(py)
                .and_then(|h| h.getattr("describe"))
                .and_then(|d| d.call1((e.value(py), e.traceback(py))))
                .and_then(|r| r.extract::<(Vec<String>, String, String)>());
            // A map chunk's failing element says where it failed.
            let element = e
                .value(py)
                .getattr("_pymizu_element")
                .and_then(|i| i.extract::<u64>())
                .ok();
            match described {
                Ok((c, m, t)) => fail(c, m, t, element),
                Err(_) => fail(
                    vec!["Exception".into()],
                    e.to_string(),
                    String::new(),
                    element,
                ),
            }
        }
    }
}

/// A cross-language task's call as Python objects, read from its payload; nothing run yet.
struct Call<'py> {
    /// A function's name, or R/Python source to evaluate.
    target: String,
    /// Whether `target` is source.
    source: bool,
    args: Vec<Py<PyAny>>,
    kwargs: Option<Bound<'py, PyDict>>,
    /// A map chunk's elements and whether each is spread over the arguments.
    chunk: Option<(Vec<Py<PyAny>>, bool)>,
    ctx: Context,
}

/// The Python objects of a task another language sent.
fn call_objects<'py>(py: Python<'py>, task: envelope::Task) -> PyResult<Call<'py>> {
    let (target, source) = match task.target {
        CallTarget::Name(n) => (n, false),
        CallTarget::Source(s) => (s, true),
    };
    let args = task
        .args
        .into_iter()
        .map(|v| to_py_natural(py, v))
        .collect::<PyResult<Vec<_>>>()?;
    let kwargs = if task.kwargs.is_empty() {
        None
    } else {
        let k = PyDict::new(py);
        for (name, v) in task.kwargs {
            k.set_item(name, to_py_natural(py, v)?)?;
        }
        Some(k)
    };
    let chunk = match task.chunk {
        Some(c) => Some((
            c.elements
                .into_iter()
                .map(|v| to_py_natural(py, v))
                .collect::<PyResult<Vec<_>>>()?,
            c.spread,
        )),
        None => None,
    };
    Ok(Call {
        target,
        source,
        args,
        kwargs,
        chunk,
        ctx: task.ctx,
    })
}

/// The payload of a task calling `call` (a `pymizu.wire.Call`) as another language's worker
/// receives it — of a map chunk over `items` when given: the fuzz harness's seeds of the task
/// reader.
#[pyfunction]
#[pyo3(signature = (call, items=None))]
pub fn xlang_task_dumps<'py>(
    call: &Bound<'py, PyAny>,
    items: Option<Vec<Bound<'py, PyAny>>>,
) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let env = match items {
        None => task_envelope(call)?,
        Some(xs) => chunk_envelopes(call, &xs, false, Some(7), 0, xs.len().max(1))?
            .into_iter()
            .next()
            .ok_or_else(|| crate::err("a map of no elements has no task"))?,
    };
    Ok(pyo3::types::PyBytes::new(call.py(), &env.to_vec()))
}

/// What a Python worker reads of a cross-language task payload (bytes as R sends them),
/// without running it: `(target, is_source, args, kwargs, chunk elements or None, seed,
/// index)`. For the fuzz harness of the task reader; malformed bytes are a `MizuError`.
#[pyfunction]
pub fn xlang_task_loads<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let mut m = arrow_buffer::MutableBuffer::with_capacity(data.len());
    m.extend_from_slice(data);
    let task = envelope::read_task(&m.into(), Some(&crate::payload::MAPPER)).map_err(crate::err)?;
    let c = call_objects(py, task)?;
    let elements = match c.chunk {
        Some((xs, _)) => PyList::new(py, xs)?.into_any(),
        None => py.None().into_bound(py),
    };
    (
        c.target,
        c.source,
        PyList::new(py, c.args)?,
        c.kwargs,
        elements,
        c.ctx.seed,
        c.ctx.index,
    )
        .into_pyobject(py)
        .map(|t| t.into_any())
}

thread_local! {
    /// The last function a cross-language task named (a stream of calls of one function
    /// resolves it once).
    static LAST_FN: RefCell<Option<(String, Py<PyAny>)>> = const { RefCell::new(None) };
}

/// The object a task's target names (`pymizu._xlang.resolve`, cached for the last name).
fn function<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let hit = LAST_FN.with(|c| {
        c.borrow()
            .as_ref()
            .filter(|(n, _)| n == name)
            .map(|(_, f)| f.clone_ref(py))
    });
    if let Some(f) = hit {
        return Ok(f.into_bound(py));
    }
    let f = helper(py)?.getattr("resolve")?.call1((name,))?;
    LAST_FN.with(|c| *c.borrow_mut() = Some((name.to_owned(), f.clone().unbind())));
    Ok(f)
}
