//! `PoolExecutor`'s futures, natively where their cost is per task: made without a Python
//! call, and `result()` as a method of the Python class written here. A caller that waits
//! with `result()` settles its own future; keeping that path out of the interpreter halves
//! what an executor future costs beside a `Task`.
//!
//! The future class (`pymizu._executor._MizuFuture`, a `concurrent.futures.Future`) stays the
//! one owner of its protocol: this module only takes the path where the task returned a
//! value and nothing else settled the future, and hands every other case to the class's
//! Python `_result_py(timeout)`.

use std::panic::AssertUnwindSafe;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::task::{SLICE, Task};

/// Makes `cls.result` the native `result(timeout=None)`; the class keeps its Python version
/// as `_result_py` for every case but the common one.
#[pyfunction]
pub fn install_future_result(cls: &Bound<'_, PyType>) -> PyResult<()> {
    if !cls.hasattr("_result_py")? {
        return Err(PyTypeError::new_err("the class has no `_result_py` method"));
    }
    // A method definition lives as long as the descriptors made from it: leaked once per
    // class this is called for (one per process).
    let def: &'static mut ffi::PyMethodDef = Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: c"result".as_ptr(),
        ml_meth: ffi::PyMethodDefPointer {
            PyCFunctionFastWithKeywords: result_entry,
        },
        ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
        ml_doc: c"result(timeout=None)\n--\n\nThe task's value: concurrent.futures.Future.result."
            .as_ptr(),
    }));
    // SAFETY: `cls` is a live type object (held by the caller) and `def` is never freed.
    let descr = unsafe { ffi::PyDescr_NewMethod(cls.as_ptr().cast(), def) };
    // SAFETY: a new reference or null with the error set, as the function documents.
    let descr = unsafe { Bound::from_owned_ptr_or_err(cls.py(), descr)? };
    cls.setattr("result", descr)
}

/// A new instance of the future class `cls`, made as `object.__new__(cls)` makes one (no
/// `__init__`: the class's fields are class defaults) but without a Python call. (`object`'s
/// own constructor, not the bare allocator: on CPython 3.11 it also sets up the instance's
/// attribute values inline, without which every future would get a dictionary.)
pub(crate) fn new_future<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let object = py.get_type::<PyAny>();
    // SAFETY: `object` is a live type object; its `tp_new` slot is always set.
    let new = unsafe { ffi::PyType_GetSlot(object.as_ptr().cast(), ffi::Py_tp_new) };
    if new.is_null() {
        return Err(PyTypeError::new_err("object has no constructor"));
    }
    // SAFETY: the slot holds a `newfunc` (the type of `tp_new`).
    let new: ffi::newfunc = unsafe { std::mem::transmute(new) };
    let none = PyTuple::empty(py);
    // SAFETY: `object.__new__(cls)`: `cls` is a live subtype of `object` whose instances it
    // makes (a Python subclass of `Future`, checked when the executor binds it), with an
    // empty argument tuple and no keywords; a new reference or null with an error set.
    let fut = unsafe {
        let obj = new(cls.as_ptr().cast(), none.as_ptr(), std::ptr::null_mut());
        Bound::from_owned_ptr_or_err(py, obj)?
    };
    // Untracked until something that could refer back to it is stored in it (the class's
    // `__setattr__`, `__dict__` users and `result()` track it again).
    crate::gc::untrack_new(&fut);
    Ok(fut)
}

/// Stores `value` as the attribute `name` of the future `fut` the way `object.__setattr__`
/// does, past the class's `__setattr__` (which tracks the future for the garbage collector:
/// the caller tracks it itself when `value` needs it).
pub(crate) fn store(
    fut: &Bound<'_, PyAny>,
    name: &Bound<'_, pyo3::types::PyString>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    // SAFETY: three live objects held by the caller; a generic store returns 0, or -1 with an
    // error set.
    let r = unsafe { ffi::PyObject_GenericSetAttr(fut.as_ptr(), name.as_ptr(), value.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(PyErr::fetch(fut.py()))
    }
}

/// The C entry of `result`: CPython calls it with the GIL held, `slf` an instance of the
/// class (the method descriptor checks it) and `nargs` positional arguments at `args`,
/// followed by those named in `kwnames`.
unsafe extern "C" fn result_entry(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // CPython calls a method with the GIL held: `attach` only records that (so that objects
    // dropped here are released at once, not deferred).
    Python::attach(|py| result_call(py, slf, args, nargs, kwnames))
}

/// `result_entry` with the GIL recorded as held.
fn result_call(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    let run = AssertUnwindSafe(|| -> PyResult<Py<PyAny>> {
        // SAFETY: `slf` is a live object for the call's duration (CPython holds it).
        let fut = unsafe { Bound::from_borrowed_ptr(py, slf) };
        let nkw = if kwnames.is_null() {
            0
        } else {
            // SAFETY: a non-null `kwnames` is a tuple of the names (vectorcall convention).
            unsafe { Bound::from_borrowed_ptr(py, kwnames) }.len()?
        };
        // SAFETY: the convention gives `nargs` positional and `nkw` named values at `args`.
        let given = unsafe { std::slice::from_raw_parts(args, nargs as usize + nkw) };
        let plain = match given {
            [] => true,
            // `result(None)`.
            [t] if nkw == 0 => *t == py.None().as_ptr(),
            _ => false,
        };
        if plain && let Some(v) = settled_value(&fut)? {
            return Ok(v);
        }
        slow(&fut, given, nargs as usize, kwnames)
    });
    let r = std::panic::catch_unwind(run).unwrap_or_else(|p| {
        Err(pyo3::panic::PanicException::new_err(
            p.downcast_ref::<&str>().map_or_else(
                || p.downcast_ref::<String>().cloned().unwrap_or_default(),
                |s| s.to_string(),
            ),
        ))
    });
    match r {
        Ok(v) => v.into_ptr(),
        Err(e) => {
            e.restore(py);
            std::ptr::null_mut()
        }
    }
}

/// The value of a future that is, or becomes within a slice of waiting, finished with a
/// value; None for every other case (an exception, cancellation, a timeout, a future settled
/// meanwhile by another thread), which the Python method handles.
fn settled_value(fut: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
    let py = fut.py();
    let (pending, finished) = (pyo3::intern!(py, "PENDING"), pyo3::intern!(py, "FINISHED"));
    let state = || fut.getattr(pyo3::intern!(py, "_state"));
    // The states are interned strings: identity first.
    let same = |s: Bound<'_, PyAny>, name| -> PyResult<bool> { Ok(s.is(name) || s.eq(name)?) };
    let now = state()?;
    if !same(now.clone(), pending)? {
        if same(now, finished)? && fut.getattr(pyo3::intern!(py, "_exception"))?.is_none() {
            return Ok(Some(fut.getattr(pyo3::intern!(py, "_result"))?.unbind()));
        }
        return Ok(None);
    }
    let task = fut.getattr(pyo3::intern!(py, "_task"))?;
    let Ok(task) = task.cast::<Task>() else {
        return Ok(None);
    };
    let Some((true, value)) = Task::outcome_of(task, Some(SLICE))? else {
        return Ok(None);
    };
    // Every store of Python code tracks the future (`__setattr__`, `__dict__`): while it is
    // untracked, no other thread has settled it or made it a condition. Once tracked, the
    // wait (which released the GIL) may have let another thread settle it, or make it a
    // condition: then the Python method settles it under that condition (`_finish`), so that
    // a waiter installed under it is notified exactly when it found the future pending. From
    // here to the stores nothing runs Python code, so no condition can be made in between.
    let watched = crate::gc::is_tracked(fut);
    if watched && (!same(state()?, pending)? || !fut.getattr(pyo3::intern!(py, "_cond"))?.is_none())
    {
        return Ok(None);
    }
    let Some(pending) = crate::pool::executor_pending(py, task.get()) else {
        return Ok(None);
    };
    pending.bind(py).del_item(fut).or_else(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyKeyError>(py) {
            Ok(())
        } else {
            Err(e)
        }
    })?;
    let value = value.into_bound(py);
    store(fut, pyo3::intern!(py, "_result"), &value)?;
    store(fut, pyo3::intern!(py, "_state"), finished)?;
    crate::gc::track_holder(fut, &value);
    Ok(Some(value.unbind()))
}

/// `fut._result_py(*args, **kwargs)` with the arguments `result` was called with.
fn slow(
    fut: &Bound<'_, PyAny>,
    given: &[*mut ffi::PyObject],
    nargs: usize,
    kwnames: *mut ffi::PyObject,
) -> PyResult<Py<PyAny>> {
    let py = fut.py();
    // SAFETY: every pointer of `given` is a live argument for the call's duration.
    let value = |p: &*mut ffi::PyObject| unsafe { Bound::from_borrowed_ptr(py, *p) };
    let positional = PyTuple::new(py, given[..nargs].iter().map(value))?;
    let named = if kwnames.is_null() {
        None
    } else {
        let d = PyDict::new(py);
        // SAFETY: a non-null `kwnames` is the tuple of the named arguments' names.
        let names = unsafe { Bound::from_borrowed_ptr(py, kwnames) };
        for (k, v) in names.try_iter()?.zip(given[nargs..].iter()) {
            d.set_item(k?, value(v))?;
        }
        Some(d)
    };
    Ok(fut
        .call_method(pyo3::intern!(py, "_result_py"), positional, named.as_ref())?
        .unbind())
}
