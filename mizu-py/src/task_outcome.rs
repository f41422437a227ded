//! A task's outcome as Python objects: a value, an exception with its remote traceback, a
//! worker's death or timeout, cancellation.

use arrow_buffer::Buffer;
use mizu_pool::OutcomeBytes;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList};

use mizu_pool::{CollectError, TaskError};

use crate::MizuError;
use crate::codec::decode;

/// `pymizu._outcome.decode`, which makes Python objects of pickled outcomes and errors.
pub(crate) static DECODE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
/// `pymizu._pool._batch_element`: one call's outcome of a chunk some of whose calls failed.
pub(crate) static BATCH_ELEMENT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
/// `pymizu._pool._batch_payload`: the pickled call of a chunk, leaving some calls out.
pub(crate) static BATCH_PAYLOAD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `(ok, value or exception)` of an outcome with nothing to decode (`status` as `decode`'s).
pub(crate) fn decoded(py: Python<'_>, status: u8) -> PyResult<(bool, Py<PyAny>)> {
    DECODE
        .import(py, "pymizu._outcome", "decode")?
        .call1((status, PyBytes::new(py, b""), PyList::empty(py), 0, 0))?
        .extract()
}

/// `(ok, value or exception)` of an outcome: a small value natively, the rest by `pymizu`'s
/// Python side (unpickling; exceptions of the right classes).
pub(crate) fn to_python(
    py: Python<'_>,
    r: Result<OutcomeBytes, CollectError>,
) -> PyResult<(bool, Py<PyAny>)> {
    let empty = || {
        (
            PyBytes::new(py, b"").into_any().unbind(),
            PyList::empty(py).unbind(),
        )
    };
    let (status, (data, bufs), slot, pid) = match r {
        Ok(b) if crate::small_read::is_value(&b) => {
            return Ok((true, crate::small_read::decode_outcome(py, b)?.unbind()));
        }
        Ok(b) if mizu_pool::wire::envelope::is_envelope(&b) => {
            return crate::xlang::outcome(py, &b.into_buffer());
        }
        Ok(b) => (0, decode(py, b.into_buffer())?.pair(), 0, 0),
        Err(CollectError::Timeout) | Err(CollectError::AlreadyCollected) => {
            return Err(MizuError::new_err(
                "pymizu: the task's outcome was already taken",
            ));
        }
        Err(CollectError::Task(e)) => match e {
            // An error payload is either ours (a pickled exception) or the runtime's text.
            TaskError::Failed(b) if mizu_pool::wire::envelope::is_envelope(&b) => {
                return crate::xlang::outcome(py, &Buffer::from_slice_ref(b));
            }
            TaskError::Failed(b) => match decode(py, Buffer::from_vec(b.clone())) {
                Ok(d) => (1u8, d.pair(), 0, 0),
                Err(_) => (
                    1,
                    (
                        PyBytes::new(py, &b).into_any().unbind(),
                        PyList::empty(py).unbind(),
                    ),
                    usize::MAX,
                    0,
                ),
            },
            // The runtime's own failure: its text, as for an undecodable payload above.
            TaskError::Runtime(m) => (
                1,
                (
                    PyBytes::new(py, m.as_bytes()).into_any().unbind(),
                    PyList::empty(py).unbind(),
                ),
                usize::MAX,
                0,
            ),
            TaskError::WorkerDied { slot, pid } => (2, empty(), slot, pid),
            TaskError::ExecTimeout { slot, pid } => (3, empty(), slot, pid),
            TaskError::Cancelled => (4, empty(), 0, 0),
            _ => (5, empty(), 0, 0),
        },
    };
    DECODE
        .import(py, "pymizu._outcome", "decode")?
        .call1((status, data, bufs, slot, pid))?
        .extract()
}
