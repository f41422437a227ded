//! Cross-language values: `mizu-wire`'s tagged encoding (what R and Python workers exchange)
//! to and from Python objects. Arrow arrays and tables become `ArrowArray` / `ArrowTable`,
//! exported to any Arrow consumer through the Arrow PyCapsule interface (zero-copy: the
//! consumer's buffers are the received ones); anything exporting that interface (pyarrow,
//! polars, ...) is accepted when encoding.

use std::ffi::CStr;
use std::sync::Arc;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema, from_ffi};
use arrow_array::ffi_stream::{ArrayStreamReader, FFI_ArrowArrayStream};
use arrow_array::{
    Array, ArrayReader, ArrayRef, RecordBatch, RecordBatchIterator, StructArray, make_array,
};
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field, FieldRef};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyCapsule, PyComplex, PyDict, PyFloat, PyInt, PyList,
    PyMemoryView, PyString, PyTuple,
};

use mizu_pool::wire::frame::{self, Body};
use mizu_pool::wire::{CallTarget, Value};

use crate::shmbuf::ShmBuffer;

fn value_err(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("pymizu.wire: {e}"))
}

fn capsule<'py, T: 'static + Send>(
    py: Python<'py>,
    v: T,
    name: &'static CStr,
) -> PyResult<Bound<'py, PyCapsule>> {
    PyCapsule::new_with_value(py, v, name)
}

/// `(schema, array)` capsules of the Arrow C data interface.
type CapsulePair<'py> = (Bound<'py, PyCapsule>, Bound<'py, PyCapsule>);

/// Exports `array` with `field` (name, type, metadata) through the C data interface; the
/// consumer shares the buffers (they stay alive until it releases them).
fn export_array<'py>(
    py: Python<'py>,
    field: &Field,
    array: &dyn Array,
) -> PyResult<CapsulePair<'py>> {
    let s = FFI_ArrowSchema::try_from(field).map_err(value_err)?;
    let a = FFI_ArrowArray::new(&array.to_data());
    Ok((
        capsule(py, s, c"arrow_schema")?,
        capsule(py, a, c"arrow_array")?,
    ))
}

/// An Arrow array received from another process (or language), with its field (name,
/// nullability, R metadata). Consumers take it zero-copy via `__arrow_c_array__`, e.g.
/// `pyarrow.array(a)`.
#[pyclass(module = "pymizu._native", frozen)]
pub struct ArrowArray {
    field: FieldRef,
    array: ArrayRef,
    /// Its standalone encoding in shared memory, when it was received so: sent on, it
    /// travels as a reference.
    src: Option<Buffer>,
}

#[pymethods]
impl ArrowArray {
    /// The Arrow C schema of the field, as a PyCapsule.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let s = FFI_ArrowSchema::try_from(self.field.as_ref()).map_err(value_err)?;
        capsule(py, s, c"arrow_schema")
    }

    /// `(schema, array)` PyCapsules of the Arrow C data interface.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<CapsulePair<'py>> {
        let _ = requested_schema; // only the array's own type is offered
        export_array(py, &self.field, self.array.as_ref())
    }

    /// The field name.
    #[getter]
    fn name(&self) -> String {
        self.field.name().clone()
    }

    fn __len__(&self) -> usize {
        self.array.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<pymizu.ArrowArray {:?}: {} of {}>",
            self.field.name(),
            self.array.len(),
            self.array.data_type()
        )
    }
}

/// An Arrow record batch (a data frame) received from another process (or language).
/// Consumers take it zero-copy via `__arrow_c_stream__` (e.g. `pyarrow.table(t)`,
/// `polars.DataFrame(t)`) or `__arrow_c_array__`.
#[pyclass(module = "pymizu._native", frozen)]
pub struct ArrowTable {
    batch: RecordBatch,
    /// As for [`ArrowArray`].
    src: Option<Buffer>,
}

#[pymethods]
impl ArrowTable {
    /// The Arrow C schema of the table, as a PyCapsule.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let s = FFI_ArrowSchema::try_from(self.batch.schema().as_ref()).map_err(value_err)?;
        capsule(py, s, c"arrow_schema")
    }

    /// The table as one struct array: `(schema, array)` PyCapsules.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<CapsulePair<'py>> {
        let _ = requested_schema;
        let schema = self.batch.schema();
        let field = Field::new("", DataType::Struct(schema.fields().clone()), false)
            .with_metadata(schema.metadata().clone());
        export_array(py, &field, &StructArray::from(self.batch.clone()))
    }

    /// The table as an Arrow C stream of one batch, as a PyCapsule.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let reader = RecordBatchIterator::new([Ok(self.batch.clone())], self.batch.schema());
        capsule(
            py,
            FFI_ArrowArrayStream::new(Box::new(reader)),
            c"arrow_array_stream",
        )
    }

    /// Rows.
    #[getter]
    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// Column names.
    #[getter]
    fn column_names(&self) -> Vec<String> {
        self.batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    fn __len__(&self) -> usize {
        self.batch.num_rows()
    }

    fn __repr__(&self) -> String {
        format!(
            "<pymizu.ArrowTable {} rows x {} columns>",
            self.batch.num_rows(),
            self.batch.num_columns()
        )
    }
}

/// A call value (a function reference and its arguments) seen from Python: what an R or
/// Python worker runs.
fn call_class(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("pymizu.wire")?.getattr("Call")
}

fn task_error_class(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("pymizu._errors")?.getattr("TaskError")
}

/// A decoded value as a Python object.
pub(crate) fn to_py(py: Python<'_>, v: Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::None => py.None(),
        Value::Bool(b) => PyBool::new(py, b).to_owned().into_any().unbind(),
        Value::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
        Value::Float(f) => PyFloat::new(py, f).into_any().unbind(),
        Value::Complex(re, im) => PyComplex::from_doubles(py, re, im).into_any().unbind(),
        Value::Str(s) => PyString::new(py, &s).into_any().unbind(),
        Value::Bytes(b) => PyBytes::new(py, b.as_slice()).into_any().unbind(),
        Value::List(items) => {
            let l = PyList::empty(py);
            for it in items {
                l.append(to_py(py, it)?)?;
            }
            l.into_any().unbind()
        }
        Value::Dict(kv) => {
            let d = PyDict::new(py);
            for (k, it) in kv {
                d.set_item(k, to_py(py, it)?)?;
            }
            d.into_any().unbind()
        }
        Value::Error {
            type_name,
            message,
            traceback,
        } => task_error_class(py)?
            .call1((type_name, message, traceback))?
            .unbind(),
        Value::Call {
            target,
            args,
            kwargs,
        } => {
            let (t, source) = match target {
                CallTarget::Name(n) => (n, false),
                CallTarget::Source(s) => (s, true),
            };
            let a = PyList::empty(py);
            for it in args {
                a.append(to_py(py, it)?)?;
            }
            let k = PyDict::new(py);
            for (key, it) in kwargs {
                k.set_item(key, to_py(py, it)?)?;
            }
            call_class(py)?.call1((t, source, a, k))?.unbind()
        }
        Value::Array { field, array } => Py::new(
            py,
            ArrowArray {
                field,
                array,
                src: None,
            },
        )?
        .into_any(),
        Value::Table(batch) => Py::new(py, ArrowTable { batch, src: None })?.into_any(),
        Value::Shared { bytes, value } => shared_to_py(py, bytes, *value)?,
    })
}

/// An array or table received in shared memory, remembering where (see [`ArrowArray`]).
pub(crate) fn shared_to_py(py: Python<'_>, bytes: Buffer, v: Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Array { field, array } => Py::new(
            py,
            ArrowArray {
                field,
                array,
                src: Some(bytes),
            },
        )?
        .into_any(),
        Value::Table(batch) => Py::new(
            py,
            ArrowTable {
                batch,
                src: Some(bytes),
            },
        )?
        .into_any(),
        v => to_py(py, v)?,
    })
}

/// A value that was received as `src` (see [`ArrowArray`]).
fn maybe_shared(src: &Option<Buffer>, v: Value) -> Value {
    match src {
        Some(bytes) => Value::Shared {
            bytes: bytes.clone(),
            value: Box::new(v),
        },
        None => v,
    }
}

/// A Python object as a value; a clear `TypeError` for what cannot cross languages.
pub(crate) fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let py = obj.py();
    if obj.is_none() {
        return Ok(Value::None);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        return obj.extract::<i64>().map(Value::Int).map_err(|_| {
            crate::xarray::out_of_range("an int outside the 64-bit range cannot cross languages")
        });
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    if let Ok(c) = obj.cast::<PyComplex>() {
        return Ok(Value::Complex(c.real(), c.imag()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(s.to_str()?.to_owned()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Bytes(Buffer::from_slice_ref(b.as_bytes())));
    }
    if obj.is_instance_of::<PyByteArray>() || obj.is_instance_of::<PyMemoryView>() {
        let v: Vec<u8> = py
            .import("builtins")?
            .getattr("bytes")?
            .call1((obj,))?
            .extract()?;
        return Ok(Value::Bytes(Buffer::from_vec(v)));
    }
    if let Ok(a) = obj.cast::<ArrowArray>() {
        let a = a.get();
        let v = Value::Array {
            field: a.field.clone(),
            array: a.array.clone(),
        };
        return Ok(maybe_shared(&a.src, v));
    }
    if let Ok(t) = obj.cast::<ArrowTable>() {
        let t = t.get();
        return Ok(maybe_shared(&t.src, Value::Table(t.batch.clone())));
    }
    // Before tuples: `Call` is a named tuple.
    if obj.is_instance(&call_class(py)?)? {
        let t: String = obj.getattr("target")?.extract()?;
        let target = if obj.getattr("source")?.is_truthy()? {
            CallTarget::Source(t)
        } else {
            CallTarget::Name(t)
        };
        let args = from_py(&obj.getattr("args")?)?;
        let Value::List(args) = args else {
            return Err(PyTypeError::new_err(
                "pymizu.wire: Call.args must be a list",
            ));
        };
        let Value::Dict(kwargs) = from_py(&obj.getattr("kwargs")?)? else {
            return Err(PyTypeError::new_err(
                "pymizu.wire: Call.kwargs must be a dict",
            ));
        };
        return Ok(Value::Call {
            target,
            args,
            kwargs,
        });
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return obj
            .try_iter()?
            .enumerate()
            .map(|(i, x)| {
                let x = x?;
                crate::xarray::at(format!("[{i}]"), || from_py(&x))
            })
            .collect::<PyResult<_>>()
            .map(Value::List);
    }
    if crate::ndarray::ndarray_type(py).is_some_and(|t| obj.is_instance(t).unwrap_or(false)) {
        return crate::xarray::ndarray_value(obj);
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut kv = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let k = k.extract::<String>().map_err(|_| {
                crate::xarray::not_portable("dict keys must be str to cross languages")
            })?;
            let v = crate::xarray::at(format!("['{k}']"), || from_py(&v))?;
            kv.push((k, v));
        }
        return Ok(Value::Dict(kv));
    }
    if obj.is_instance(&task_error_class(py)?)? {
        return Ok(Value::Error {
            type_name: obj.getattr("type_name")?.extract()?,
            message: obj.getattr("message")?.extract()?,
            traceback: obj.getattr("traceback")?.extract()?,
        });
    }
    if obj.hasattr("__arrow_c_stream__")? {
        return import_stream(obj);
    }
    if obj.hasattr("__arrow_c_array__")? {
        return import_array(obj);
    }
    if let Some(series) = pandas_series(obj)? {
        return import_stream(&series);
    }
    // numpy scalars (`np.int32(3)`, `np.bool_(True)`): their Python value.
    if obj.hasattr("dtype")? && obj.hasattr("item")? && !obj.hasattr("__len__")? {
        return from_py(&obj.call_method0("item")?);
    }
    Err(crate::xarray::not_portable(format!(
        "a {} cannot cross languages (None, bool, int, float, complex, str, bytes, list, \
         tuple, dict with str keys, numpy arrays, pandas Series, Index and Categorical, and Arrow \
         arrays/tables/data frames can)",
        obj.get_type().name()?
    )))
}

/// A pandas `Categorical` or `Index` (of any kind) as the `Series` of its values, which has an
/// Arrow stream (they have none of their own): a categorical crosses as a factor, levels and
/// order kept, as a categorical column does. `None` for anything else.
fn pandas_series<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !obj.get_type().module()?.to_str()?.starts_with("pandas") {
        return Ok(None);
    }
    let pd = obj.py().import("pandas")?;
    if !(obj.is_instance(&pd.getattr("Categorical")?)? || obj.is_instance(&pd.getattr("Index")?)?) {
        return Ok(None);
    }
    let kwargs = pyo3::types::PyDict::new(obj.py());
    kwargs.set_item("copy", false)?;
    pd.getattr("Series")?.call((obj,), Some(&kwargs)).map(Some)
}

fn checked_pointer(cap: &Bound<'_, PyAny>, name: &'static CStr) -> PyResult<*mut std::ffi::c_void> {
    let cap = cap
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("pymizu.wire: expected an Arrow PyCapsule"))?;
    // Checks the capsule's name (a TypeError-like ValueError from Python when it differs).
    Ok(cap.pointer_checked(Some(name))?.as_ptr())
}

/// An object exporting `__arrow_c_stream__`: a table when its type is a struct (record
/// batches), else one array; chunks are concatenated.
fn import_stream(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let cap = obj.call_method0("__arrow_c_stream__")?;
    let p = checked_pointer(&cap, c"arrow_array_stream")?;
    // SAFETY: the capsule holds a valid ArrowArrayStream (checked by name); from_raw moves
    // it out and marks the capsule's copy released, so its destructor does nothing.
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(p.cast()) };
    let reader = ArrayStreamReader::try_new(stream).map_err(value_err)?;
    let field = reader.field().clone();
    let chunks = reader.collect::<Result<Vec<_>, _>>().map_err(value_err)?;
    if chunks.is_empty()
        && has_dictionary(field.data_type())
        && let Some(v) = empty_pandas_frame(obj)?
    {
        return Ok(v);
    }
    let refs: Vec<&dyn Array> = chunks.iter().map(|a| a.as_ref()).collect();
    let array = match refs.len() {
        0 => arrow_array::new_empty_array(field.data_type()),
        1 => chunks[0].clone(),
        _ => arrow_select::concat::concat(&refs).map_err(value_err)?,
    };
    Ok(array_value(field, array))
}

/// Whether a column of type `t` (or a field of it) is a dictionary.
fn has_dictionary(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(..) => true,
        DataType::Struct(fields) => fields.iter().any(|f| has_dictionary(f.data_type())),
        _ => false,
    }
}

/// A 0-row pandas data frame as one empty record batch (as pandas' own stream would convert
/// it): its stream yields no batch at all, and without one its categoricals' categories would
/// be lost. `None` for anything else.
fn empty_pandas_frame(obj: &Bound<'_, PyAny>) -> PyResult<Option<Value>> {
    let py = obj.py();
    let Ok(pd) = py.import("pandas") else {
        return Ok(None);
    };
    if !obj.is_instance(&pd.getattr("DataFrame")?)? {
        return Ok(None);
    }
    let batch = py
        .import("pyarrow")?
        .getattr("RecordBatch")?
        .call_method1("from_pandas", (obj,))?;
    import_array(&batch).map(Some)
}

fn import_array(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let pair = obj.call_method0("__arrow_c_array__")?;
    let (sc, ac): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair.extract()?;
    let sp = checked_pointer(&sc, c"arrow_schema")?;
    let ap = checked_pointer(&ac, c"arrow_array")?;
    // SAFETY: both capsules are checked by name; the schema is only borrowed (its capsule
    // releases it), the array is moved out (its capsule's copy is marked released).
    let (schema, array) = unsafe {
        (
            &*(sp as *const FFI_ArrowSchema),
            FFI_ArrowArray::from_raw(ap.cast()),
        )
    };
    let field = Field::try_from(schema).map_err(value_err)?;
    // SAFETY: the array and schema come from the same producer call (C data interface).
    let data = unsafe { from_ffi(array, schema) }.map_err(value_err)?;
    Ok(array_value(Arc::new(field), make_array(data)))
}

fn array_value(field: FieldRef, array: ArrayRef) -> Value {
    match field.data_type() {
        DataType::Struct(_) => {
            let s = array
                .as_any()
                .downcast_ref::<StructArray>()
                .expect("struct type")
                .clone();
            let batch = RecordBatch::from(s);
            let schema = batch
                .schema()
                .as_ref()
                .clone()
                .with_metadata(field.metadata().clone());
            Value::Table(
                batch
                    .with_schema(Arc::new(schema))
                    .unwrap_or_else(|_| unreachable!("same fields, metadata only")),
            )
        }
        _ => Value::Array { field, array },
    }
}

/// Encodes `obj` as one inline frame of the cross-language format (`docs/wire-format.md`).
#[pyfunction]
#[pyo3(signature = (obj, aux=0))]
pub fn wire_dumps<'py>(obj: &Bound<'py, PyAny>, aux: u64) -> PyResult<Bound<'py, PyBytes>> {
    let v = from_py(obj)?;
    let enc = mizu_pool::wire::encode(&v).map_err(value_err)?;
    let mut out = vec![0u8; frame::HEADER_LEN + enc.len()];
    let n = frame::write_inline(&enc, aux, &mut out)
        .ok_or_else(|| value_err("value too large for one frame"))?;
    Ok(PyBytes::new(obj.py(), &out[..n]))
}

/// Decodes one inline frame into `(value, aux)`. A `ShmBuffer` is decoded in place (Arrow
/// data stays in shared memory); other bytes-like objects are copied once.
#[pyfunction]
pub fn wire_loads(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<(Py<PyAny>, u64)> {
    let buf = match data.cast::<ShmBuffer>() {
        Ok(b) => b.get().buffer(),
        Err(_) => {
            let v: Vec<u8> = py
                .import("builtins")?
                .getattr("bytes")?
                .call1((data,))?
                .extract()?;
            Buffer::from_vec(v)
        }
    };
    let f = frame::read(buf.as_slice()).map_err(value_err)?;
    let Body::Inline(body) = f.body else {
        return Err(value_err(
            "a region frame refers to a data segment: receive it through a pool or channel",
        ));
    };
    // Arrow bodies are read in place when 64-byte aligned in memory; else from an aligned copy.
    let body = if (body.as_ptr() as usize).is_multiple_of(64) {
        let start = body.as_ptr() as usize - buf.as_ptr() as usize;
        buf.slice_with_length(start, body.len())
    } else {
        let mut m = arrow_buffer::MutableBuffer::new(body.len());
        m.extend_from_slice(body);
        m.into()
    };
    let v = mizu_pool::wire::decode(&body).map_err(value_err)?;
    Ok((to_py(py, v)?, f.aux))
}
