//! The worker's side: runs Python's task callback for every task, with the task's context
//! reachable from Python (nested submission, `current_pool()`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use mizu_pool::{Executor, Fill, PoolError, TaskContext};

use crate::codec::{Outgoing, Pickled, decode};
use crate::err;
use crate::pool::{outgoing, pickled_calls, submit_all_draining, submit_draining};
use crate::registry::NESTED;
use crate::task::Task;
use crate::{small, small_read};

/// The context of the task this thread is running, if any (set by the runtime).
pub use mizu_pool::with_current_task as with_context;

/// Python's side of a worker (`pymizu.worker`): `run(pickle, buffers, head)` runs a pickled
/// call
/// and returns `(None, value, None)`, or `(False, pickle, buffers)` for an exception;
/// `fail(exc)` and `dumps_result(value)` pickle an outcome as `(ok, pickle, buffers)`.
struct PyExec {
    run: Py<PyAny>,
    fail: Py<PyAny>,
    dumps_result: Py<PyAny>,
    loads: Py<PyAny>,
    /// False when every task must go through `run` (the worker's start-up failed).
    fast: bool,
    /// Functions of small calls by their pickle.
    fns: Mutex<FnCache>,
    /// This thread's state while the worker waits without the interpreter lock, null while
    /// it holds it (see `execute` and `stream_end`).
    saved: AtomicPtr<pyo3::ffi::PyThreadState>,
    max_tasks: u64,
    tasks: AtomicU64,
}

/// The most functions a worker keeps unpickled.
const MAX_FNS: usize = 4096;

/// Unpickled functions of small calls, by their pickle; the last one is looked at first (a
/// stream of calls of one function then needs no hashing).
#[derive(Default)]
struct FnCache {
    last: Option<(Vec<u8>, Py<PyAny>)>,
    all: HashMap<Vec<u8>, Py<PyAny>>,
}

fn text(m: String) -> Vec<u8> {
    m.into_bytes()
}

/// Sends a pickled outcome `(ok, pickle, buffers)`.
fn send_pickled(
    py: Python<'_>,
    ctx: &TaskContext<'_>,
    r: PyResult<Bound<'_, PyAny>>,
) -> Result<Vec<u8>, Vec<u8>> {
    let r = r.and_then(|r| r.extract::<(bool, Py<PyBytes>, Py<PyAny>)>());
    let (ok, pickle, bufs) = match r {
        Ok(v) => v,
        // The callbacks catch what tasks raise; this is a bug in them: report it as text.
        Err(e) => return Err(text(format!("pymizu worker callback failed: {e}"))),
    };
    let out = Outgoing::new(py, pickle.as_bytes(py), bufs.bind(py))
        .map_err(|e| text(format!("pymizu: cannot send the result: {e}")))?;
    ctx.send(ok, &out)
}

impl PyExec {
    fn run(&self, py: Python<'_>, ctx: &TaskContext<'_>, input: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
        let buf = ctx
            .input()
            .unwrap_or_else(|| arrow_buffer::Buffer::from_slice_ref(input));
        if mizu_pool::wire::envelope::is_envelope(&buf) {
            let (ok, env) = crate::xlang::run_task(py, &buf);
            return ctx.send(ok, &env);
        }
        let is_small = small_read::is_call(&buf);
        if self.fast && is_small {
            return self.run_small(py, ctx, &buf);
        }
        let p = if is_small {
            // `run` fails such a worker's tasks before reading them.
            Pickled {
                head: None,
                data: PyBytes::new(py, b"").into_any().unbind(),
                bufs: PyList::empty(py).unbind(),
            }
        } else {
            decode(py, buf).map_err(|e| text(format!("mizu: {e}")))?
        };
        match self.run.bind(py).call1((p.data, p.bufs, p.head)) {
            // `(None, value, None)`: the call returned `value`.
            Ok(r) if r.get_item(0).is_ok_and(|x| x.is_none()) => match r.get_item(1) {
                Ok(v) => self.send_value(py, ctx, v),
                Err(e) => Err(text(format!("pymizu worker callback failed: {e}"))),
            },
            r => send_pickled(py, ctx, r),
        }
    }

    /// A small call: read natively, the function looked up by its pickle, the result sent
    /// natively when it is small (else pickled by Python).
    fn run_small(
        &self,
        py: Python<'_>,
        ctx: &TaskContext<'_>,
        buf: &arrow_buffer::Buffer,
    ) -> Result<Vec<u8>, Vec<u8>> {
        let call = small_read::decode_call(py, buf).map_err(|e| text(format!("mizu: {e}")))?;
        let result = self
            .function(py, call.head)
            .and_then(|f| f.call(call.args, call.kwargs.as_ref()));
        let result = match result {
            Ok(v) => v,
            Err(e) => return send_pickled(py, ctx, self.fail.bind(py).call1((e.into_value(py),))),
        };
        self.send_value(py, ctx, result)
    }

    /// Sends a task's return value: natively when it is small, else pickled by Python.
    fn send_value(
        &self,
        py: Python<'_>,
        ctx: &TaskContext<'_>,
        result: Bound<'_, PyAny>,
    ) -> Result<Vec<u8>, Vec<u8>> {
        if let Some(v) = small::encode_value(&result, true) {
            return ctx.send(true, &v);
        }
        let pickled = match self.dumps_result.bind(py).call1((&result,)) {
            Ok(p) => Ok(p),
            Err(e) => self.fail.bind(py).call1((e.into_value(py),)),
        };
        drop(result);
        send_pickled(py, ctx, pickled)
    }

    fn function<'py>(&self, py: Python<'py>, head: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        {
            let mut c = self.fns.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((h, f)) = &c.last
                && h == head
            {
                return Ok(f.bind(py).clone());
            }
            if let Some(f) = c.all.get(head) {
                let f = f.clone_ref(py);
                c.last = Some((head.to_vec(), f.clone_ref(py)));
                return Ok(f.into_bound(py));
            }
        }
        // Unpickling runs Python code: not under the lock.
        let f = self.loads.bind(py).call1((PyBytes::new(py, head),))?;
        let mut c = self.fns.lock().unwrap_or_else(|p| p.into_inner());
        if c.all.len() >= MAX_FNS {
            c.all.clear();
        }
        c.all.insert(head.to_vec(), f.clone().unbind());
        c.last = Some((head.to_vec(), f.clone().unbind()));
        Ok(f)
    }

    /// Takes the interpreter lock back if `let_go` gave it up.
    fn take_back(&self) {
        let ts = self.saved.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if !ts.is_null() {
            // SAFETY: `ts` is this thread's state, saved by `let_go` on this thread: the
            // runtime calls its executor only from the worker's thread (a task's context,
            // which nested work needs, lives there).
            unsafe { pyo3::ffi::PyEval_RestoreThread(ts) };
        }
    }

    /// Gives the interpreter lock up while the worker waits for work, keeping this thread
    /// attached in PyO3's count: nothing runs Python here until `take_back`.
    fn let_go(&self) {
        if self.saved.load(Ordering::Relaxed).is_null() {
            // SAFETY: this thread holds the lock: `run_worker` is called from Python and
            // keeps it until its first `let_go`, and every `let_go` after that follows a
            // `take_back` (in `execute`) on this thread.
            let ts = unsafe { pyo3::ffi::PyEval_SaveThread() };
            self.saved.store(ts, Ordering::Relaxed);
        }
    }
}

impl Executor for PyExec {
    /// Runs a task with the interpreter lock, which the worker then keeps between the tasks
    /// of a stream (until `stream_end`): taking and releasing it around every task costs a
    /// few percent of a small task's time in the worker. Other Python threads of the worker
    /// still get it: at the interpreter's switch interval while a task runs Python code, and
    /// at the latest when the worker parks (within its spin budget, 50 µs by default, of the
    /// last task). PyO3 counts this thread attached throughout, so its entry below costs
    /// next to nothing.
    fn execute(&self, ctx: &TaskContext<'_>, input: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
        self.take_back();
        let r = Python::attach(|py| self.run(py, ctx, input));
        let n = self.tasks.fetch_add(1, Ordering::Relaxed) + 1;
        if self.max_tasks > 0 && n >= self.max_tasks {
            ctx.recycle();
        }
        r
    }

    fn stream_end(&self) {
        self.let_go();
    }
}

/// Serves a pool as worker `slot` until it stops (the GIL is held only while a task runs);
/// with `max_tasks > 0` the worker leaves after that many tasks and the pool replaces it.
/// `run(pickle, buffers)` runs a pickled call; small calls are run here, with
/// `dumps_result(value)` for a result that is not small and `fail(exc)` for an exception
/// (each returning `(ok, pickle, buffers)`); `fast=False` sends every call through `run`.
#[pyfunction]
#[pyo3(signature = (token, slot, run, fail, dumps_result, max_tasks=0, fast=true))]
#[allow(clippy::too_many_arguments)]
pub fn run_worker(
    py: Python<'_>,
    token: String,
    slot: usize,
    run: Py<PyAny>,
    fail: Py<PyAny>,
    dumps_result: Py<PyAny>,
    max_tasks: u64,
    fast: bool,
) -> PyResult<()> {
    let exec = PyExec {
        run,
        fail,
        dumps_result,
        loads: py.import("pickle")?.getattr("loads")?.unbind(),
        fast,
        fns: Mutex::new(FnCache::default()),
        saved: AtomicPtr::new(std::ptr::null_mut()),
        max_tasks,
        tasks: AtomicU64::new(0),
    };
    // The lock is given up until the first task, and taken back before Python sees this
    // thread again, also when unwinding.
    struct TakeBack<'a>(&'a PyExec);
    impl Drop for TakeBack<'_> {
        fn drop(&mut self) {
            self.0.take_back();
        }
    }
    exec.let_go();
    let served = {
        let _back = TakeBack(&exec);
        mizu_pool::run_worker(&token, slot, &exec)
    };
    served.map_err(err)
}

/// Called first by a starting worker: if the pool's owner dies before this worker joins
/// (while it imports the caller's script, say), the worker exits instead of living on.
#[pyfunction]
pub fn exit_if_orphaned_while_starting() {
    mizu_pool::exit_if_orphaned_while_starting();
}

/// `[fn_(x) for x in items]` (`fn_(*x)` when `star`): a map chunk's calls, run from here
/// rather than by a bytecode loop around them. `items` may also be columns — a tuple of lists
/// of one length, the arguments of call `i` being `col[i]` of each — which a map of several
/// iterables sends instead of a tuple per call (cheaper to make and to pickle). A call's
/// exception is raised with `_pymizu_index` set to `start` plus its position.
#[pyfunction]
pub fn run_calls<'py>(
    fn_: &Bound<'py, PyAny>,
    items: &Bound<'py, PyAny>,
    star: bool,
    start: usize,
) -> PyResult<Bound<'py, PyList>> {
    let py = fn_.py();
    let out = PyList::empty(py);
    let failed = |e: PyErr, i: usize| {
        // (An exception that takes no attributes goes without its index.)
        let _ = e.value(py).setattr("_pymizu_index", start + i);
        e
    };
    if let Ok(cols) = items.cast::<PyTuple>() {
        let cols = cols
            .iter()
            .map(|c| c.cast_into::<PyList>().map_err(PyErr::from))
            .collect::<PyResult<Vec<_>>>()?;
        let n = cols.iter().map(|c| c.len()).min().unwrap_or(0);
        for i in 0..n {
            let r = match cols.as_slice() {
                [a] => call_one(fn_, &a.get_item(i)?),
                [a, b] => call_two(fn_, &a.get_item(i)?, &b.get_item(i)?),
                _ => fn_.call1(PyTuple::new(
                    py,
                    cols.iter()
                        .map(|c| c.get_item(i))
                        .collect::<PyResult<Vec<_>>>()?,
                )?),
            };
            out.append(r.map_err(|e| failed(e, i))?)?;
        }
        return Ok(out);
    }
    for (i, x) in items.cast::<PyList>()?.iter().enumerate() {
        out.append(call_item(fn_, x, star).map_err(|e| failed(e, i))?)?;
    }
    Ok(out)
}

/// `fn_(*args)` for every `args` of `calls` (a batch chunk's calls, none skipped), run from
/// here rather than by a bytecode loop around them: the values in order (None for a call
/// that raised) and, if any raised, each one's failure by position
/// (`_pool._batch_failure`).
#[pyfunction]
pub fn run_batch_calls<'py>(
    fn_: &Bound<'py, PyAny>,
    calls: &Bound<'py, PyList>,
) -> PyResult<(Bound<'py, PyList>, Option<Bound<'py, PyDict>>)> {
    static FAILURE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = fn_.py();
    let out = PyList::empty(py);
    let mut errors: Option<Bound<'py, PyDict>> = None;
    for (i, args) in calls.iter().enumerate() {
        match call_item(fn_, args, true) {
            Ok(v) => out.append(v)?,
            Err(e) => {
                let failure = FAILURE
                    .import(py, "pymizu._batches", "_batch_failure")?
                    .call1((e.into_value(py),))?;
                errors
                    .get_or_insert_with(|| PyDict::new(py))
                    .set_item(i, failure)?;
                out.append(py.None())?;
            }
        }
    }
    Ok((out, errors))
}

/// `fn_(*x)` when `star`, else `fn_(x)`.
fn call_item<'py>(
    fn_: &Bound<'py, PyAny>,
    x: Bound<'py, PyAny>,
    star: bool,
) -> PyResult<Bound<'py, PyAny>> {
    match (star, x.cast_into::<PyTuple>()) {
        (false, Ok(x)) => call_one(fn_, x.as_any()),
        (false, Err(x)) => call_one(fn_, &x.into_inner()),
        (true, Ok(args)) => fn_.call1(args),
        (true, Err(x)) => {
            let args = x.into_inner().try_iter()?.collect::<PyResult<Vec<_>>>()?;
            fn_.call1(PyTuple::new(fn_.py(), args)?)
        }
    }
}

/// `f(x)`, the argument passed on the stack: a function taking vectorcalls (a Python
/// function does) gets it without a tuple made and freed for it, which the stable ABI's
/// calls of 3.11 would do (about a tenth of a trivial map element's cost in the worker).
fn call_one<'py>(f: &Bound<'py, PyAny>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: both objects are alive for the call (borrowed) and the GIL is held (`Bound`);
    // the argument list ends with the NULL the C function expects; it returns a new
    // reference, or NULL with an exception set.
    unsafe {
        let r = pyo3::ffi::PyObject_CallFunctionObjArgs(
            f.as_ptr(),
            x.as_ptr(),
            std::ptr::null_mut::<pyo3::ffi::PyObject>(),
        );
        Bound::from_owned_ptr_or_err(f.py(), r)
    }
}

/// `f(a, b)`, as [`call_one`] passes its argument.
fn call_two<'py>(
    f: &Bound<'py, PyAny>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: as in `call_one`, with two arguments before the NULL.
    unsafe {
        let r = pyo3::ffi::PyObject_CallFunctionObjArgs(
            f.as_ptr(),
            a.as_ptr(),
            b.as_ptr(),
            std::ptr::null_mut::<pyo3::ffi::PyObject>(),
        );
        Bound::from_owned_ptr_or_err(f.py(), r)
    }
}

/// Whether this thread is running a pool task (inside a worker).
#[pyfunction]
pub fn in_task() -> bool {
    with_context(|c| c.is_some())
}

/// Inside a map element: its input position (else None).
#[pyfunction]
pub fn current_element() -> Option<u64> {
    with_context(|c| c.and_then(|c| c.element()))
}

fn context_error() -> PyErr {
    crate::MizuError::new_err("current_pool() is only available inside a pymizu task")
}

/// Submits a nested task from inside a task (to the pool running it).
#[pyfunction]
#[pyo3(signature = (pickle, buffers=None, head=None))]
pub fn nested_submit(
    py: Python<'_>,
    pickle: &[u8],
    buffers: Option<&Bound<'_, PyAny>>,
    head: Option<&[u8]>,
) -> PyResult<Task> {
    let none = py.None().into_bound(py);
    let bufs = buffers.unwrap_or(&none);
    let out = match head {
        Some(h) => Outgoing::call(py, h, pickle, bufs)?,
        None => Outgoing::new(py, pickle, bufs)?,
    };
    if !in_task() {
        return Err(context_error());
    }
    submit_draining(py, &NESTED, true, out.size(), |_| {
        with_context(|c| c.ok_or(PoolError::Stopped)?.submit_with(&out))
    })
}

/// Nested small-call submission (see `Pool.submit_small`).
#[pyfunction]
#[pyo3(signature = (head, args, kwargs=None))]
pub fn nested_submit_small(
    py: Python<'_>,
    head: &[u8],
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<Task>> {
    if !in_task() {
        return Err(context_error());
    }
    let Some(payload) = small::encode_call(head, args, kwargs, None) else {
        return Ok(None);
    };
    submit_draining(py, &NESTED, true, payload.len(), |_| {
        with_context(|c| c.ok_or(PoolError::Stopped)?.submit_with(&payload))
    })
    .map(Some)
}

/// Nested batch submission (see `Pool.submit_batch`).
#[pyfunction]
pub fn nested_submit_batch<'py>(
    py: Python<'py>,
    calls: Vec<Bound<'py, PyAny>>,
) -> PyResult<Vec<Task>> {
    let calls = pickled_calls(&calls)?;
    let outs = outgoing(&calls)?;
    if !in_task() {
        return Err(context_error());
    }
    submit_all_draining(py, &NESTED, true, &outs, |rest, _| {
        with_context(|c| match c {
            Some(c) => c.submit_batch_with(rest.iter().map(|o| o as &dyn Fill)),
            None => (Vec::new(), Err(PoolError::Stopped)),
        })
    })
}

/// The small-value payload of `value`, or None when it is not small (for tests).
#[pyfunction]
pub fn small_dumps(py: Python<'_>, value: &Bound<'_, PyAny>) -> Option<Py<PyBytes>> {
    small::encode_value(value, false).map(|b| PyBytes::new(py, &b.to_vec()).unbind())
}

/// Reads a small payload (for tests): a value, or a call's `(function pickle, args,
/// kwargs)`. Malformed input raises `ValueError`.
#[pyfunction]
pub fn small_loads<'py>(py: Python<'py>, payload: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let buf = arrow_buffer::Buffer::from_slice_ref(payload);
    if small_read::is_call(payload) {
        let c = small_read::decode_call(py, &buf)?;
        return (PyBytes::new(py, c.head), c.args, c.kwargs)
            .into_pyobject(py)
            .map(|t| t.into_any());
    }
    if small_read::is_value(payload) {
        return small_read::decode_value(py, &buf);
    }
    Err(pyo3::exceptions::PyValueError::new_err(
        "pymizu: not a small payload",
    ))
}

/// Decodes a payload (for tests and channels): `(pickle, buffers)`.
#[pyfunction]
pub fn decode_payload(py: Python<'_>, payload: &[u8]) -> PyResult<(Py<PyAny>, Py<PyList>)> {
    let p = decode(py, arrow_buffer::Buffer::from_slice_ref(payload))?;
    Ok((p.data, p.bufs))
}
