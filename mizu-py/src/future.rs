//! `PoolExecutor`'s futures, natively where their cost is per task: made without a Python
//! call, and `result()` as a method of the Python class written here. A caller that waits
//! with `result()` settles its own future; keeping that path out of the interpreter halves
//! what an executor future costs beside a `Task`.
//!
//! The future class (`pymizu._futures._MizuFuture`, a `concurrent.futures.Future`) stays the
//! one owner of its protocol: this module only takes the path where the task returned a
//! value and nothing else settled the future, and hands every other case to the class's
//! Python `_result_py(timeout)`.

use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::cell::SLICE;
use crate::future_slots::{LAYOUT, Slots, get, new_object, set, slots_of};
use crate::task::Task;

/// `result`'s method definition: CPython keeps a pointer to it in every descriptor made from
/// it, so it lives as long as the module.
static RESULT_DEF: crate::fastcall::Def = crate::fastcall::Def::fast(
    c"result",
    RESULT_ENTRY,
    c"result(timeout=None)\n--\n\nThe task's value: concurrent.futures.Future.result.",
);

/// Makes `cls.result` the native `result(timeout=None)`; the class keeps its Python version
/// as `_result_py` for every case but the common one. The first class given is the future
/// class whose layout the native paths know; a subclass of it given later gets a descriptor
/// of its own, so that the interpreter's specialised call of a method descriptor (which
/// wants the descriptor's class to be the instance's exact type) applies to its futures.
#[pyfunction]
pub fn install_future_result(cls: &Bound<'_, PyType>) -> PyResult<()> {
    if !cls.hasattr("_result_py")? {
        return Err(PyTypeError::new_err("the class has no `_result_py` method"));
    }
    match LAYOUT.get(cls.py()) {
        Some((base, _)) => {
            if !cls.is_subclass(base.bind(cls.py()))? {
                return Err(PyTypeError::new_err(
                    "another future class is already installed",
                ));
            }
        }
        None => {
            let slots = Slots::probe(cls)?;
            LAYOUT
                .set(cls.py(), (cls.clone().unbind(), slots))
                .map_err(|_| PyTypeError::new_err("the future class is already installed"))?;
        }
    }
    // SAFETY: `cls` is a live type object (held by the caller); the definition is static and
    // CPython never writes through the pointer.
    let descr = unsafe {
        ffi::PyDescr_NewMethod(
            cls.as_ptr().cast(),
            std::ptr::from_ref::<ffi::PyMethodDef>(&RESULT_DEF).cast_mut(),
        )
    };
    // SAFETY: a new reference or null with the error set, as the function documents.
    let descr = unsafe { Bound::from_owned_ptr_or_err(cls.py(), descr)? };
    cls.setattr("result", descr)
}

/// A new pending future of `cls` (the installed future class or a subclass) holding `task`:
/// made without `__init__`, its fields set in place. It is untracked by the garbage
/// collector until something that could refer back to it is stored in it (the class's
/// `__setattr__`, and `result()`, track it again).
#[pyfunction]
pub(crate) fn new_future<'py>(
    cls: &Bound<'py, PyType>,
    task: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if !is_future_class(cls)? {
        return Err(PyTypeError::new_err(
            "not a subclass of the installed future class",
        ));
    }
    make_future(cls, task)
}

/// Whether `cls` is the installed future class or a subclass of it.
pub(crate) fn is_future_class(cls: &Bound<'_, PyType>) -> PyResult<bool> {
    match LAYOUT.get(cls.py()) {
        Some((base, _)) => cls.is_subclass(base.bind(cls.py())),
        None => Ok(false),
    }
}

/// [`new_future`] of a class already checked with [`is_future_class`] (an executor's, when
/// the pool was bound to it).
pub(crate) fn make_future<'py>(
    cls: &Bound<'py, PyType>,
    task: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let Some((_, slots)) = LAYOUT.get(py) else {
        return Err(PyTypeError::new_err("no future class is installed"));
    };
    let fut = new_object(cls)?;
    let none = py.None().into_bound(py);
    let pending = pyo3::intern!(py, "PENDING").as_any();
    // SAFETY: `fut` is a new instance of a subclass of the installed class, whose fields are
    // at `slots`.
    unsafe {
        set(&fut, slots.state, pending);
        for off in [
            slots.result,
            slots.exception,
            slots.cond,
            slots.waiters,
            slots.callbacks,
        ] {
            set(&fut, off, &none);
        }
        set(&fut, slots.task, task);
    }
    crate::gc::untrack_new(&fut);
    Ok(fut)
}

/// The C entry of `result`: CPython calls it with the GIL held, `slf` an instance of the
/// class (the method descriptor checks it) and `nargs` positional arguments at `args`,
/// followed by those named in `kwnames`. pyo3's own entry for a fastcall method records the
/// GIL as held (so that objects dropped here are released at once, not deferred) without
/// taking it again, and turns an error or a panic into a raised exception.
const RESULT_ENTRY: ffi::PyCFunctionFastWithKeywords = pyo3::impl_::trampoline::get_trampoline_function!(
    fastcall_cfunction_with_keywords,
    result_call
);

/// `result`.
///
/// # Safety
/// CPython's vectorcall contract, as `RESULT_ENTRY` says.
unsafe fn result_call(
    py: Python<'_>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
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
    if plain && let Some(v) = settled_value(&fut, SLICE)? {
        return Ok(v.into_ptr());
    }
    slow(&fut, given, nargs as usize, kwnames).map(Py::into_ptr)
}

/// Settles `fut`, an instance of the installed class, if its task has already returned a
/// value (what a waiter other than `result()` finds first: `wait`, `as_completed`, `done()`);
/// whether it did. Every other case is the Python methods'.
#[pyfunction]
pub(crate) fn settle_done(fut: &Bound<'_, PyAny>) -> PyResult<bool> {
    let Some((cls, _)) = LAYOUT.get(fut.py()) else {
        return Ok(false);
    };
    if !fut.is_instance(cls.bind(fut.py()))? {
        return Err(PyTypeError::new_err("not a future of a PoolExecutor"));
    }
    Ok(settled_value(fut, Duration::ZERO)?.is_some())
}

/// The value of a future that is, or becomes within `wait`, finished with a value; None for
/// every other case (an exception, cancellation, a timeout, a future settled meanwhile by
/// another thread), which the Python methods handle. `fut` is an instance of the installed
/// class (what `result` is called on).
fn settled_value(fut: &Bound<'_, PyAny>, wait: Duration) -> PyResult<Option<Py<PyAny>>> {
    let py = fut.py();
    // (`fut` is an instance of the installed class: `result` is a method descriptor of that
    // class, which checks the type of what it is called on.)
    let Some((_, slots)) = LAYOUT.get(py) else {
        return Ok(None);
    };
    let (pending, finished) = (pyo3::intern!(py, "PENDING"), pyo3::intern!(py, "FINISHED"));
    // SAFETY: `fut` is an instance of the installed class (see above), `off` one of its
    // slots.
    let field = |off| unsafe { get(fut, off) };
    // The states are interned strings: identity first.
    let is =
        |v: Option<Bound<'_, PyAny>>, name: &Bound<'_, pyo3::types::PyString>| -> PyResult<bool> {
            match v {
                Some(v) => Ok(v.is(name) || v.eq(name)?),
                None => Ok(false),
            }
        };
    if !is(field(slots.state), pending)? {
        if is(field(slots.state), finished)? && field(slots.exception).is_some_and(|e| e.is_none())
        {
            return Ok(field(slots.result).map(Bound::unbind));
        }
        return Ok(None);
    }
    let Some(task) = field(slots.task) else {
        return Ok(None);
    };
    let Ok(task) = task.cast_into::<Task>() else {
        return Ok(None);
    };
    let Some((true, value)) = Task::outcome_of(&task, Some(wait))? else {
        return Ok(None);
    };
    // Every store of Python code tracks the future (`__setattr__`): while it is untracked, no
    // other thread has settled it or made it a condition. Once tracked, the wait (which
    // released the GIL) may have let another thread settle it, or make it a condition: then
    // the Python method settles it under that condition (`_finish`), so that a waiter
    // installed under it is notified exactly when it found the future pending. From here to
    // the stores nothing runs Python code, so no condition can be made in between.
    let watched = crate::gc::is_tracked(fut);
    if watched
        && (!is(field(slots.state), pending)? || field(slots.cond).is_none_or(|c| !c.is_none()))
    {
        return Ok(None);
    }
    if crate::pending::with_executor_pending(py, task.get(), |p| p.remove_of(fut, task.get()))
        .is_none()
    {
        return Ok(None);
    }
    let value = value.into_bound(py);
    // SAFETY: `fut` is an instance of the installed class (see above).
    unsafe {
        set(fut, slots.result, &value);
        set(fut, slots.state, finished.as_any());
    }
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

/// How to know asyncio's `wrap_future` in a future's done-callbacks: the code of the callback
/// it adds (`_chain_future`'s `_call_set_state`), where that callback's closure holds the
/// asyncio future and its loop, and the asyncio future type.
#[derive(FromPyObject)]
pub(crate) struct Chain<'py>(
    /// The callback's code.
    Bound<'py, PyAny>,
    /// Its closure's cell of the asyncio future.
    usize,
    /// Its closure's cell of that future's loop.
    usize,
    /// `asyncio.Future`.
    Bound<'py, PyType>,
);

/// Settles `fut`, whose task the event loop running in this thread saw finish: what
/// `fut._settle(task._outcome(0.0))` does, natively when nobody waits on the future's
/// condition but done-callbacks and the outcome is a value or an exception of the task's own.
/// Its done-callbacks then run in order, as `_invoke_callbacks` runs them, except that a
/// `wrap_future` callback whose asyncio future belongs to the running loop hands the outcome
/// to that future at once (see [`wrap_future_dest`]).
#[pyfunction]
pub(crate) fn settle_watched(fut: &Bound<'_, PyAny>, chain: Option<Chain<'_>>) -> PyResult<()> {
    let py = fut.py();
    let Some(slots) = slots_of(fut)? else {
        return Err(PyTypeError::new_err("not a future of a PoolExecutor"));
    };
    // SAFETY: `fut` is an instance of the installed class (`slots_of`), the offsets its slots.
    let field = |off| unsafe { get(fut, off) };
    let pending = pyo3::intern!(py, "PENDING");
    let is_pending = || field(slots.state).is_some_and(|s| s.is(pending));
    let Some(task) = field(slots.task).and_then(|t| t.cast_into::<Task>().ok()) else {
        return Ok(());
    };
    if !is_pending() {
        return Ok(());
    }
    let Some((ok, value)) = Task::outcome_of(&task, Some(Duration::ZERO))? else {
        return Ok(());
    };
    let value = value.into_bound(py);
    static APART: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let apart =
        !ok && value.is_instance(APART.import(py, "pymizu._futures", "_SETTLED_APART")?)?;
    let cond = field(slots.cond).filter(|c| !c.is_none());
    let waited = field(slots.waiters).is_some_and(|w| w.is_truthy().unwrap_or(true));
    let (Some(cond), false, false) = (cond, waited, apart) else {
        fut.call_method1(pyo3::intern!(py, "_settle"), ((ok, &value),))?;
        return Ok(());
    };
    cond.call_method0(pyo3::intern!(py, "acquire"))?;
    let stored = (|| {
        // (Another thread may have settled it before the condition was had.)
        if !is_pending() {
            return Ok(false);
        }
        crate::pending::with_executor_pending(py, task.get(), |p| p.remove_of(fut, task.get()));
        crate::gc::track(fut);
        // SAFETY: as for `field`.
        unsafe {
            set(fut, if ok { slots.result } else { slots.exception }, &value);
            set(fut, slots.state, pyo3::intern!(py, "FINISHED").as_any());
        }
        if cond.getattr(pyo3::intern!(py, "_waiters"))?.is_truthy()? {
            cond.call_method0(pyo3::intern!(py, "notify_all"))?;
        }
        PyResult::Ok(true)
    })();
    cond.call_method0(pyo3::intern!(py, "release"))?;
    if !stored? {
        return Ok(());
    }
    let Some(callbacks) = field(slots.callbacks).filter(|c| !c.is_none()) else {
        return Ok(());
    };
    static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let mut running = None;
    for cb in callbacks.try_iter()? {
        let cb = cb?;
        let ran = match wrap_future_dest(&cb, chain.as_ref(), &mut running)? {
            Some(dest) if ok => dest.call_method1(pyo3::intern!(py, "set_result"), (&value,)),
            Some(dest) => converted(&value)
                .and_then(|e| dest.call_method1(pyo3::intern!(py, "set_exception"), (e,))),
            None => cb.call1((fut,)),
        };
        // (What `_invoke_callbacks` does with a callback that raises.)
        if let Err(e) = ran {
            if !e.is_instance_of::<pyo3::exceptions::PyException>(py) {
                return Err(e);
            }
            let kw = PyDict::new(py);
            kw.set_item("exc_info", e.value(py))?;
            LOGGER
                .import(py, "concurrent.futures._base", "LOGGER")?
                .call_method(
                    "error",
                    ("exception calling callback for %r", fut),
                    Some(&kw),
                )?;
        }
    }
    Ok(())
}

/// The exception an asyncio future gets for a concurrent future's `e` (what
/// `_copy_future_state` sets).
fn converted<'py>(e: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    static CONVERT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    CONVERT
        .import(e.py(), "asyncio.futures", "_convert_future_exc")?
        .call1((e,))
}

/// The asyncio future to hand the outcome to at once, if `cb` is a `wrap_future` callback
/// whose asyncio future belongs to the loop running in this thread (`running`, looked up on
/// first need) and still waits. That callback hands the outcome to the loop with
/// `call_soon_threadsafe`, and the handle, run in this thread a round later, would copy it
/// into the asyncio future (a cancelled one keeps nothing): here it is copied now, and the
/// coroutine awaiting it resumes in the next round.
fn wrap_future_dest<'py>(
    cb: &Bound<'py, PyAny>,
    chain: Option<&Chain<'py>>,
    running: &mut Option<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = cb.py();
    let Some(chain) = chain else {
        return Ok(None);
    };
    if !code_of(cb)?.is_some_and(|c| c.is(&chain.0)) {
        return Ok(None);
    }
    let running = match running {
        Some(r) => r,
        None => {
            static RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
            running.insert(
                RUNNING_LOOP
                    .import(py, "asyncio", "_get_running_loop")?
                    .call0()?,
            )
        }
    };
    let contents = pyo3::intern!(py, "cell_contents");
    let cells = cb.getattr(pyo3::intern!(py, "__closure__"))?;
    let dest_loop = cells.get_item(chain.2)?.getattr(contents)?;
    let dest = cells.get_item(chain.1)?.getattr(contents)?;
    let waits = !running.is_none()
        && dest_loop.is(&*running)
        && dest.is_instance(&chain.3)?
        && !dest.call_method0(pyo3::intern!(py, "done"))?.is_truthy()?;
    Ok(waits.then_some(dest))
}

/// The code of `f` if it is a Python function (looked at without raising, as a lookup on
/// any other callable would: a bound method, a builtin, a partial).
fn code_of<'py>(f: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    static FUNCTION: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = f.py();
    let function = FUNCTION.import(py, "types", "FunctionType")?;
    if !f.get_type().is(function) {
        return Ok(None);
    }
    f.getattr(pyo3::intern!(py, "__code__")).map(Some)
}
