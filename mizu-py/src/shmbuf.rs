//! Bytes in shared memory as Python sees them: [`ShmBuffer`], the buffer every received array,
//! memoryview and shared object views; and, for an array received from another language, the
//! array as it came ([`Source`]), so that it can be sent on by reference.

use std::ffi::c_int;
use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_buffer::Buffer;
use arrow_schema::Field;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

/// A received array as it came — its standalone encoding and the decoded array — and the
/// numpy view made of its values (dtype, shape): that view, sent on as it is, goes by reference
/// (see [`received_view`]).
pub(crate) struct Source {
    pub(crate) bytes: Buffer,
    pub(crate) field: Arc<Field>,
    pub(crate) array: ArrayRef,
    pub(crate) dtype: String,
    pub(crate) shape: Vec<usize>,
}

/// A view of bytes in shared memory (or of a small private copy). It keeps the memory alive
/// for as long as any view of it — a `memoryview`, a numpy array — exists. Read-only, except
/// for the memory of `pymizu.empty`/`zeros` (and views of it received from another process),
/// which every holder may write.
#[pyclass(module = "pymizu._native", frozen)]
pub struct ShmBuffer {
    buf: Buffer,
    /// For the values of an array received from another language: that array as it came
    /// (see `xlang::received_view`).
    source: Option<Source>,
    /// Whether holders may write it (see [`ShmBuffer::writable`]).
    writable: bool,
}

#[pymethods]
impl ShmBuffer {
    /// # Safety
    /// Called by Python's buffer protocol with a valid `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("Py_buffer must not be null"));
        }
        let (b, writable) = (&slf.get().buf, slf.get().writable);
        // SAFETY: `view` is non-null and valid (buffer protocol contract); the pointer and
        // length describe memory that `slf` (stored in view.obj with a new reference by
        // PyBuffer_FillInfo) keeps alive; readonly=1 refuses writable requests. Writable
        // memory is only ever written and read through such views (numpy), never through
        // Rust references: Rust code touches only its region's header and descriptor.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                b.as_ptr() as *mut std::ffi::c_void,
                b.len() as pyo3::ffi::Py_ssize_t,
                c_int::from(!writable),
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// # Safety
    /// Called by Python's buffer protocol; nothing was allocated for the view.
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.buf.len()
    }

    fn __repr__(&self) -> String {
        format!("<pymizu shared buffer of {} bytes>", self.buf.len())
    }
}

impl ShmBuffer {
    /// A view of `buf`.
    pub fn new(buf: Buffer) -> ShmBuffer {
        ShmBuffer {
            buf,
            source: None,
            writable: false,
        }
    }

    /// A writable view of `buf`: memory of `pymizu.empty`/`zeros`, which tasks write into.
    /// Every holder, in any process, may write it; Rust code never reads or writes these
    /// bytes (they travel by reference), so concurrent writers are numpy's business alone.
    pub(crate) fn writable(buf: Buffer) -> ShmBuffer {
        ShmBuffer {
            buf,
            source: None,
            writable: true,
        }
    }

    /// A view of the values of a received array, which remembers the array.
    pub(crate) fn sourced(buf: Buffer, source: Source) -> ShmBuffer {
        ShmBuffer {
            buf,
            source: Some(source),
            writable: false,
        }
    }

    /// The received array these are the values of, if any.
    pub(crate) fn source(&self) -> Option<&Source> {
        self.source.as_ref()
    }

    /// The bytes, sharing the same memory.
    pub fn buffer(&self) -> Buffer {
        self.buf.clone()
    }
}
