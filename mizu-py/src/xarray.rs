//! Python objects (numpy arrays above all) as cross-language values: where the value being
//! converted sits, for errors; numpy arrays as Arrow arrays whose buffers are lent, not
//! copied, until the payload is written; a received array sent on as it came.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, DurationMicrosecondArray, Float64Array, Int32Array,
    Int64Array, StringArray, TimestampMicrosecondArray, UInt8Array,
};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, ScalarBuffer};
use arrow_schema::Field;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use mizu_pool::wire::Value;
use mizu_pool::wire::rmeta::{CLASS, UNITS};

use crate::shmbuf::ShmBuffer;

static HELPER: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// `pymizu._xlang`, the Python half of this module.
pub(crate) fn helper(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
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
