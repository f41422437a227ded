//! The two submit calls of the hot path (`Pool.submit`, `PoolExecutor.submit`) as C functions
//! taking their arguments in CPython's vectorcall form, bound to their pool: `fn(*args,
//! **kwargs)` is read in place, where a method with `*args` would get a new tuple of
//! everything and then a second one of all but `fn`.

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::pool_class::Pool;
use crate::small::Args;

/// Which submit a bound function makes.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// `Pool.submit`: a `Task`.
    Task,
    /// `PoolExecutor.submit`: an executor future.
    Future,
}

/// `submit(fn, /, *args, **kwargs)` of `kind` bound to `pool`.
pub(crate) fn bound<'py>(pool: &Bound<'py, Pool>, kind: Kind) -> PyResult<Bound<'py, PyAny>> {
    let def: &'static ffi::PyMethodDef = match kind {
        Kind::Task => &TASK,
        Kind::Future => &FUTURE,
    };
    // SAFETY: `def` is static; `pool` is a live object the function holds a reference to;
    // a new reference or null with the error set.
    unsafe {
        let f = ffi::PyCFunction_NewEx(
            std::ptr::from_ref(def).cast_mut(),
            pool.as_ptr(),
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(pool.py(), f)
    }
}

/// A method definition CPython reads but never writes (its pointers are static strings), for
/// the native methods made here and in `future.rs`.
pub(crate) struct Def(ffi::PyMethodDef);

// SAFETY: immutable after construction; its pointers are to static data.
unsafe impl Sync for Def {}

impl Def {
    /// A `METH_FASTCALL | METH_KEYWORDS` method named `name`, calling `entry`.
    pub(crate) const fn fast(
        name: &'static std::ffi::CStr,
        entry: ffi::PyCFunctionFastWithKeywords,
        doc: &'static std::ffi::CStr,
    ) -> Def {
        Def(ffi::PyMethodDef {
            ml_name: name.as_ptr(),
            ml_meth: ffi::PyMethodDefPointer {
                PyCFunctionFastWithKeywords: entry,
            },
            ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
            ml_doc: doc.as_ptr(),
        })
    }
}

impl std::ops::Deref for Def {
    type Target = ffi::PyMethodDef;
    fn deref(&self) -> &ffi::PyMethodDef {
        &self.0
    }
}

static TASK: Def = Def::fast(
    c"submit",
    TASK_ENTRY,
    c"submit(fn, /, *args, **kwargs)\n--\n\nRuns fn(*args, **kwargs) in a worker: its Task.",
);

static FUTURE: Def = Def::fast(
    c"submit",
    FUTURE_ENTRY,
    c"submit(fn, /, *args, **kwargs)\n--\n\nSchedules fn(*args, **kwargs): a Future.",
);

/// The C entry of `Pool.submit`: pyo3's own entry for a fastcall function (the one its
/// generated methods use), which records the GIL CPython holds for the call as held — where
/// `Python::attach` cannot know it is and takes it again through `PyGILState_Ensure` — and
/// turns an error or a panic into a raised exception.
const TASK_ENTRY: ffi::PyCFunctionFastWithKeywords =
    pyo3::impl_::trampoline::get_trampoline_function!(fastcall_cfunction_with_keywords, task_call);

/// The C entry of `PoolExecutor.submit` (as `TASK_ENTRY`).
const FUTURE_ENTRY: ffi::PyCFunctionFastWithKeywords = pyo3::impl_::trampoline::get_trampoline_function!(
    fastcall_cfunction_with_keywords,
    future_call
);

/// `Pool.submit`.
///
/// # Safety
/// CPython's vectorcall contract: called with the GIL held, every pointer live for the call.
unsafe fn task_call(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: the contract, passed on.
    unsafe { call(py, slf, args, nargs, kwnames, Kind::Task) }.map(Py::into_ptr)
}

/// `PoolExecutor.submit`.
///
/// # Safety
/// As `task_call`.
unsafe fn future_call(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: the contract, passed on.
    unsafe { call(py, slf, args, nargs, kwnames, Kind::Future) }.map(Py::into_ptr)
}

/// Runs a submit: `slf` is the bound pool; `nargs` positional arguments at `args`, followed
/// by the values of the names in `kwnames` (a tuple, or null).
///
/// # Safety
/// CPython's vectorcall contract: called with the GIL held, every pointer live for the call.
unsafe fn call(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
    kind: Kind,
) -> PyResult<Py<PyAny>> {
    // SAFETY: the bound object, live while the function is (`bound` made it a pool).
    let pool = unsafe { Bound::from_borrowed_ptr(py, slf) };
    let pool = pool.cast::<Pool>()?;
    let nkw = if kwnames.is_null() {
        0
    } else {
        // SAFETY: a non-null `kwnames` is a tuple of the names (vectorcall convention).
        unsafe { Bound::from_borrowed_ptr(py, kwnames) }.len()?
    };
    let nargs = nargs as usize;
    if nargs == 0 {
        return Err(PyTypeError::new_err(
            "submit() missing 1 required positional argument: 'fn'",
        ));
    }
    // SAFETY: the convention gives `nargs` positional and `nkw` named values at `args`.
    let given = unsafe { std::slice::from_raw_parts(args, nargs + nkw) };
    // SAFETY: live for the call (the convention).
    let f = unsafe { Bound::from_borrowed_ptr(py, given[0]) };
    // SAFETY: as above.
    let positional = unsafe { Args::array(py, &given[1..nargs]) };
    let named = if nkw == 0 {
        None
    } else {
        let d = PyDict::new(py);
        // SAFETY: as above.
        let names = unsafe { Bound::from_borrowed_ptr(py, kwnames) };
        for (k, &v) in names.try_iter()?.zip(&given[nargs..]) {
            // SAFETY: as above.
            d.set_item(k?, unsafe { Bound::from_borrowed_ptr(py, v) })?;
        }
        Some(d)
    };
    match kind {
        Kind::Task => Ok(Pool::submit_call_of(pool, &f, positional, named.as_ref())?
            .into_any()
            .unbind()),
        Kind::Future => Pool::submit_future_of(pool, &f, positional, named.as_ref()),
    }
}
