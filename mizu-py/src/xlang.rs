//! Cross-language tasks from Python's side: a pool of R workers (`Pool(language="r")`) and a
//! Python worker serving an R pool. Payloads are `mizu_pool::wire::envelope`s; this module only
//! turns Python objects into `mizu_pool::wire::Value`s and back (`docs/interop.md`): numpy arrays
//! become Arrow arrays (their buffers referenced, not copied, until the payload is written)
//! and received numeric Arrow arrays become read-only numpy views of the shared memory.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, DurationMicrosecondType, Float64Type, Int32Type, Int64Type,
    TimestampMicrosecondType, UInt8Type,
};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, DurationMicrosecondArray, Float64Array, Int32Array,
    Int64Array, StringArray, TimestampMicrosecondArray, UInt8Array,
};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, TimeUnit};
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString};

use mizu_pool::wire::envelope::{self, Context, Envelope, Received, RemoteError};
use mizu_pool::wire::rmeta::{CLASS, UNITS};
use mizu_pool::wire::{CallTarget, Value};

use crate::codec::ShmBuffer;

static HELPER: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// `pymizu._xlang`, the Python half of this module.
fn helper(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    HELPER
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("pymizu._xlang")?.unbind()))
        .map(|m| m.bind(py))
}

thread_local! {
    /// Where the value being converted sits, for errors (`args[0]['a'][3]`).
    static PATH: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `seg` appended to the path errors name.
pub(crate) fn at<T>(seg: impl Into<String>, f: impl FnOnce() -> T) -> T {
    PATH.with(|p| p.borrow_mut().push(seg.into()));
    let r = f();
    PATH.with(|p| p.borrow_mut().pop());
    r
}

/// `why`, prefixed with where the value sits (`args[1]['a']: …`).
fn located(why: impl std::fmt::Display) -> String {
    let path = PATH.with(|p| p.borrow().concat());
    if path.is_empty() {
        why.to_string()
    } else {
        format!("{path}: {why}")
    }
}

/// A `TypeError` naming where the value sits: `args[1]['a']: a set cannot cross languages`.
pub(crate) fn not_portable(why: impl std::fmt::Display) -> PyErr {
    PyTypeError::new_err(located(why))
}

/// A `ValueError` naming where the value sits (a value of the right type out of range).
pub(crate) fn out_of_range(why: impl std::fmt::Display) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(located(why))
}

/// Keeps a numpy array alive while an Arrow buffer lends its memory. (Only dropped, never
/// used: unwinding cannot observe it half-changed.)
struct Lent(#[allow(dead_code)] std::panic::AssertUnwindSafe<Py<PyAny>>);

/// The bytes of a 1-D contiguous, aligned numpy array, without a copy.
fn lend(a: &Bound<'_, PyAny>) -> PyResult<Buffer> {
    let u = a
        .cast::<PyUntypedArray>()
        .map_err(|_| not_portable("expected a numpy array"))?;
    let len = u.len() * u.dtype().itemsize();
    let ptr = crate::ndarray::data_ptr(u).cast_mut();
    let Some(ptr) = NonNull::new(ptr) else {
        return Ok(Buffer::from_vec(Vec::<u8>::new()));
    };
    // SAFETY: `ptr` addresses `len` bytes of the array's data (contiguous: `ndarray_parts`
    // made it so), which stay valid while the array lives — the buffer owns a reference to it.
    // The array is not written while the payload is encoded (the caller's thread holds the
    // GIL until the bytes are copied into shared memory).
    Ok(unsafe {
        Buffer::from_custom_allocation(
            ptr,
            len,
            Arc::new(Lent(std::panic::AssertUnwindSafe(a.clone().unbind()))),
        )
    })
}

fn bits(b: &Bound<'_, PyAny>, n: usize) -> PyResult<BooleanBuffer> {
    Ok(BooleanBuffer::new(lend(b)?, 0, n))
}

/// The array a numpy array was received as, when it is the very view made of that array's
/// values (same start, dtype, shape and layout; views are read-only, so unchanged): sent on,
/// it goes by reference to where it came, not by value.
fn received_view(obj: &Bound<'_, PyAny>) -> PyResult<Option<Value>> {
    // numpy keeps the exporter behind the view's base arrays and their memoryview.
    let mut base = obj.getattr("base")?;
    for _ in 0..4 {
        if base.is_none() {
            return Ok(None);
        }
        if let Ok(b) = base.cast::<ShmBuffer>() {
            let b = b.get();
            let Some(src) = b.source() else {
                return Ok(None);
            };
            let data: usize = obj
                .getattr("__array_interface__")?
                .get_item("data")?
                .get_item(0)?
                .extract()?;
            let dtype: String = obj.getattr("dtype")?.getattr("str")?.extract()?;
            let shape: Vec<usize> = obj.getattr("shape")?.extract()?;
            let flags = obj.getattr("flags")?;
            let layout = if shape.len() <= 1 {
                "c_contiguous"
            } else {
                "f_contiguous"
            };
            let same = data == b.buffer().as_ptr() as usize
                && dtype == src.dtype
                && shape == src.shape
                && flags.getattr(layout)?.is_truthy()?;
            return Ok(same.then(|| Value::Shared {
                bytes: src.bytes.clone(),
                value: Box::new(Value::Array {
                    field: src.field.clone(),
                    array: src.array.clone(),
                }),
            }));
        }
        base = if base.cast::<pyo3::types::PyMemoryView>().is_ok() {
            base.getattr("obj")?
        } else if base.hasattr("base")? {
            base.getattr("base")?
        } else {
            return Ok(None);
        };
    }
    Ok(None)
}

/// A numpy array as an Arrow array value (see `pymizu._xlang.ndarray_parts`); a received view
/// sent on unchanged, by reference.
pub(crate) fn ndarray_value(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    if let Some(v) = received_view(obj)? {
        return Ok(v);
    }
    let py = obj.py();
    let parts = helper(py)?
        .getattr("ndarray_parts")?
        .call1((obj,))
        .map_err(|e| {
            if e.is_instance_of::<PyTypeError>(py) {
                not_portable(e.value(py))
            } else {
                e
            }
        })?;
    type Parts<'py> = (
        String,
        Bound<'py, PyAny>,
        usize,
        Option<Vec<i64>>,
        Option<Bound<'py, PyAny>>,
        Vec<(String, String)>,
    );
    let (code, flat, n, dim, valid, meta): Parts<'_> = parts.extract()?;
    let nulls = valid
        .map(|v| bits(&v, n).map(NullBuffer::new))
        .transpose()?;
    let scalar = |f: &Bound<'_, PyAny>| lend(f);
    let mut meta: Vec<(String, String)> = meta;
    let array: ArrayRef = match code.as_str() {
        "f64" => Arc::new(Float64Array::new(
            ScalarBuffer::new(scalar(&flat)?, 0, n),
            nulls,
        )),
        "i32" => Arc::new(Int32Array::new(
            ScalarBuffer::new(scalar(&flat)?, 0, n),
            nulls,
        )),
        "i64" => {
            meta.push((CLASS.into(), "integer64".into()));
            Arc::new(Int64Array::new(
                ScalarBuffer::new(scalar(&flat)?, 0, n),
                nulls,
            ))
        }
        "u8" => Arc::new(UInt8Array::new(
            ScalarBuffer::new(scalar(&flat)?, 0, n),
            nulls,
        )),
        "bool" => Arc::new(BooleanArray::new(bits(&flat, n)?, nulls)),
        "date32" => Arc::new(Date32Array::new(
            ScalarBuffer::new(scalar(&flat)?, 0, n),
            nulls,
        )),
        // numpy's datetimes have no zone and count from the UTC epoch: R's POSIXct in UTC.
        "timestamp" => Arc::new(
            TimestampMicrosecondArray::new(ScalarBuffer::new(scalar(&flat)?, 0, n), nulls)
                .with_timezone("UTC"),
        ),
        "duration" => {
            meta.push((UNITS.into(), "secs".into()));
            Arc::new(DurationMicrosecondArray::new(
                ScalarBuffer::new(scalar(&flat)?, 0, n),
                nulls,
            ))
        }
        "utf8" => {
            let items: Vec<Option<String>> = flat.extract()?;
            Arc::new(StringArray::from(items))
        }
        c => return Err(not_portable(format!("unknown array code {c}"))),
    };
    let mut field = Field::new("", array.data_type().clone(), true).with_metadata(
        meta.into_iter()
            .collect::<std::collections::HashMap<_, _>>(),
    );
    if let Some(d) = dim {
        let d: Vec<i32> = d
            .iter()
            .map(|&x| i32::try_from(x))
            .collect::<Result<_, _>>()
            .map_err(|_| not_portable("an array extent of 2^31 or more"))?;
        field = mizu_pool::wire::rmeta::with_dim(field, &d);
    }
    Ok(Value::Array {
        field: Arc::new(field),
        array,
    })
}

/// A received array as it came — its standalone encoding and the decoded array — and the
/// numpy view made of its values (dtype, shape): that view, sent on as it is, goes by reference
/// (see [`received_view`]).
pub(crate) struct Source {
    bytes: Buffer,
    field: Arc<Field>,
    array: ArrayRef,
    dtype: String,
    shape: Vec<usize>,
}

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
/// booleans, doubles with other nulls and strings, else the `ArrowArray` itself (factors,
/// integers, booleans and strings with NA, zoned timestamps: any Arrow consumer takes it).
fn array_to_py(
    py: Python<'_>,
    field: Arc<Field>,
    array: ArrayRef,
    src: Option<Buffer>,
) -> PyResult<Py<PyAny>> {
    let dim = mizu_pool::wire::rmeta::dim(&field, array.len())
        .map_err(|e| not_portable(e.to_string()))?;
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
        DataType::Date32 if no_nulls => {
            let days: Vec<i64> = array
                .as_primitive::<Date32Type>()
                .values()
                .iter()
                .map(|&d| i64::from(d))
                .collect();
            return plain(&Buffer::from_vec(days), "<M8[D]");
        }
        // No zone, or UTC: what numpy's zoneless datetimes mean.
        DataType::Timestamp(TimeUnit::Microsecond, tz)
            if no_nulls && tz.as_deref().is_none_or(|z| z == "UTC") =>
        {
            return own(
                array
                    .as_primitive::<TimestampMicrosecondType>()
                    .values()
                    .inner(),
                "<M8[us]",
            );
        }
        DataType::Duration(TimeUnit::Microsecond) if no_nulls => {
            return own(
                array
                    .as_primitive::<DurationMicrosecondType>()
                    .values()
                    .inner(),
                "<m8[us]",
            );
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
    match envelope::read_with(payload, Some(&crate::ndarray::MAPPER)).map_err(crate::err)? {
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
    } = match envelope::read_task(payload, Some(&crate::ndarray::MAPPER)) {
        Ok(t) => t,
        Err(e) => return fail(vec!["MizuError".into()], e.to_string(), String::new(), None),
    };
    let chunked = chunk.is_some();
    let result = (|| -> PyResult<Bound<'_, PyAny>> {
        let (t, source) = match target {
            CallTarget::Name(n) => (n, false),
            CallTarget::Source(s) => (s, true),
        };
        let mut a = Vec::with_capacity(args.len());
        for v in args {
            a.push(to_py_natural(py, v)?);
        }
        let k = if kwargs.is_empty() {
            None
        } else {
            let k = PyDict::new(py);
            for (name, v) in kwargs {
                k.set_item(name, to_py_natural(py, v)?)?;
            }
            Some(k)
        };
        if let Some(chunk) = chunk {
            let mut xs = Vec::with_capacity(chunk.elements.len());
            for v in chunk.elements {
                xs.push(to_py_natural(py, v)?);
            }
            let k = k.unwrap_or_else(|| PyDict::new(py));
            return helper(py)?.getattr("run_chunk")?.call1((
                t,
                PyList::new(py, a)?,
                k,
                PyList::new(py, xs)?,
                chunk.spread,
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
