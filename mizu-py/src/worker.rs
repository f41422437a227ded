//! The worker's side: runs Python's task callback for every task, with the task's context
//! reachable from Python (nested submission, `current_pool()`).

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use mizu_pool::{Executor, Fill, TaskContext};

use crate::codec::{Outgoing, decode, encode_vec};
use crate::err;
use crate::pool::{Task, batch_result, outgoing};

/// The context of the task this thread is running, if any (set by the runtime).
pub use mizu_pool::with_current_task as with_context;

/// Runs Python's `callback(pickle, buffers) -> (ok, pickle, buffers)` for every task.
struct PyExec {
    callback: Py<PyAny>,
    max_tasks: u64,
    tasks: AtomicU64,
}

impl PyExec {
    fn run(&self, py: Python<'_>, ctx: &TaskContext<'_>, input: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
        let buf = ctx
            .input()
            .unwrap_or_else(|| arrow_buffer::Buffer::from_slice_ref(input));
        let text = |m: String| m.into_bytes();
        let (data, bufs) = decode(py, buf).map_err(|e| text(format!("mizu: {e}")))?;
        let r = self
            .callback
            .call1(py, (data, bufs))
            .and_then(|r| r.extract::<(bool, Py<PyBytes>, Py<PyAny>)>(py));
        let (ok, pickle, bufs) = match r {
            Ok(v) => v,
            // The callback catches what tasks raise; this is a bug in it: report it as text.
            Err(e) => return Err(text(format!("pymizu worker callback failed: {e}"))),
        };
        let out = Outgoing::new(py, pickle.as_bytes(py), bufs.bind(py))
            .map_err(|e| text(format!("pymizu: cannot send the result: {e}")))?;
        // Write straight into the result slot/region; fall back to bytes where that is not
        // possible (inside a native map element).
        if ctx.reply(ok, &out as &dyn Fill).is_ok() {
            return Ok(Vec::new());
        }
        let v = encode_vec(&out);
        if ok { Ok(v) } else { Err(v) }
    }
}

impl Executor for PyExec {
    fn execute(&self, ctx: &TaskContext<'_>, input: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
        let r = Python::attach(|py| self.run(py, ctx, input));
        let n = self.tasks.fetch_add(1, Ordering::Relaxed) + 1;
        if self.max_tasks > 0 && n >= self.max_tasks {
            ctx.recycle();
        }
        r
    }
}

/// Serves a pool as worker `slot` until it stops (the GIL is held only while a task runs);
/// with `max_tasks > 0` the worker leaves after that many tasks and the pool replaces it.
#[pyfunction]
#[pyo3(signature = (token, slot, callback, max_tasks=0))]
pub fn run_worker(
    py: Python<'_>,
    token: String,
    slot: usize,
    callback: Py<PyAny>,
    max_tasks: u64,
) -> PyResult<()> {
    let exec = PyExec {
        callback,
        max_tasks,
        tasks: AtomicU64::new(0),
    };
    py.detach(|| mizu_pool::run_worker(&token, slot, &exec))
        .map_err(err)
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

/// Submits a nested task from inside a task (to the pool running it).
#[pyfunction]
#[pyo3(signature = (pickle, buffers=None))]
pub fn nested_submit(
    py: Python<'_>,
    pickle: &[u8],
    buffers: Option<&Bound<'_, PyAny>>,
) -> PyResult<Task> {
    let none = py.None().into_bound(py);
    let out = Outgoing::new(py, pickle, buffers.unwrap_or(&none))?;
    with_context(|c| {
        let ctx = c.ok_or_else(|| {
            crate::MizuError::new_err("current_pool() is only available inside a pymizu task")
        })?;
        ctx.submit_with(&out)
            .map(Task::new)
            .map_err(crate::pool::submit_error)
    })
}

/// Nested batch submission (see `Pool.submit_batch`).
#[pyfunction]
pub fn nested_submit_batch(
    py: Python<'_>,
    calls: Vec<(Py<PyBytes>, Py<PyAny>)>,
) -> PyResult<(Vec<Task>, bool)> {
    let outs = outgoing(py, &calls)?;
    with_context(|c| {
        let ctx = c.ok_or_else(|| {
            crate::MizuError::new_err("current_pool() is only available inside a pymizu task")
        })?;
        let (ts, res) = ctx.submit_batch_with(outs.iter().map(|o| o as &dyn Fill));
        batch_result(ts, res)
    })
}

/// Decodes a payload (for tests and channels): `(pickle, buffers)`.
#[pyfunction]
pub fn decode_payload(py: Python<'_>, payload: &[u8]) -> PyResult<(Py<PyAny>, Py<PyList>)> {
    decode(py, arrow_buffer::Buffer::from_slice_ref(payload))
}
