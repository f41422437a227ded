//! Waiting for several tasks at once (`wait_any`, `collect_all`, the loops `signal.rs` and
//! `_pool.py` build on), and an event loop's own watch over a task (`Watch`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::cell::{BUSY_NAP, SLICE, State};
use crate::registry::Chunk;
use crate::task::{Task, timeout_error};

/// Waits until one of `tasks` has an outcome (GIL released, signals checked); returns its
/// position, or None after `timeout` seconds.
#[pyfunction]
#[pyo3(signature = (tasks, timeout=None))]
pub fn wait_any(
    py: Python<'_>,
    tasks: Vec<Py<Task>>,
    timeout: Option<f64>,
) -> PyResult<Option<usize>> {
    wait_loop(
        py,
        timeout,
        || ready(&tasks),
        |slice| park_any(&tasks, slice, &|| false, &mut |_| {}),
    )
}

/// Before a map collects `tasks` in order: waits as `mizu_pool::Ahead` does — ahead to the
/// task halfway along, or a failure, and `stream`ing (an iterator, a progress bar) only for a
/// short while — so that the caller is woken a few times rather than once per chunk (GIL
/// released, signals checked); `any_order`: for a map that yields chunks as they finish
/// (`Ahead::any_order`). Tasks another thread is collecting are left out. False after
/// `timeout` seconds.
#[pyfunction]
#[pyo3(signature = (tasks, timeout=None, stream=false, any_order=false))]
pub fn wait_ahead(
    py: Python<'_>,
    tasks: Vec<Py<Task>>,
    timeout: Option<f64>,
    stream: bool,
    any_order: bool,
) -> PyResult<bool> {
    let start = Instant::now();
    let mut ahead = if any_order {
        mizu_pool::Ahead::any_order()
    } else {
        mizu_pool::Ahead::new(stream)
    };
    let timeout = crate::wait_secs(timeout, "timeout")?;
    loop {
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            return Ok(false);
        }
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        let done = py.detach(|| {
            let guards: Vec<_> = tasks
                .iter()
                .filter_map(|t| t.get().cell.try_lock())
                .collect();
            let pending: Vec<&mizu_pool::Task> = guards
                .iter()
                .filter_map(|g| match &**g {
                    State::Pending(p) => Some(p),
                    _ => None,
                })
                .collect();
            ahead.wait(&pending, Some(slice))
        });
        if done {
            return Ok(true);
        }
        py.check_signals()?;
    }
}

/// A bounded wait's loop: `found()` until it answers, else `park(slice)` with the GIL released,
/// in slices of at most [`SLICE`] for the rest of `timeout` seconds, checking for signals
/// (Ctrl-C) after each slice in which nothing happened (`park` gave None). None after
/// `timeout`.
pub(crate) fn wait_loop<T>(
    py: Python<'_>,
    timeout: Option<f64>,
    mut found: impl FnMut() -> Option<T>,
    park: impl Fn(Duration) -> Option<()> + Sync,
) -> PyResult<Option<T>> {
    let start = Instant::now();
    let timeout = crate::wait_secs(timeout, "timeout")?;
    loop {
        if let Some(v) = found() {
            return Ok(Some(v));
        }
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            return Ok(None);
        }
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        if py.detach(|| park(slice)).is_none() {
            py.check_signals()?;
        }
    }
}

/// The position of a task of `tasks` that is done.
pub(crate) fn ready(tasks: &[Py<Task>]) -> Option<usize> {
    tasks.iter().position(|t| t.get().is_done())
}

/// One bounded wait (the GIL released by the caller): parks on the submitter of a pending task
/// of `tasks` that nobody else is collecting, for at most `slice`, until one of them is done or
/// `also()` holds. `parked` is told the wake handle of where it parks (`Some`) and when it
/// stops (`None`). `None` when nothing happened: the slice ended, or every pending task is
/// being collected by another thread (then it naps briefly).
pub(crate) fn park_any(
    tasks: &[Py<Task>],
    slice: Duration,
    also: &dyn Fn() -> bool,
    parked: &mut dyn FnMut(Option<mizu_pool::Wakeup>),
) -> Option<()> {
    let probe = tasks.iter().find_map(|t| {
        let g = t.get().cell.try_lock()?;
        matches!(*g, State::Pending(_)).then_some(g)
    });
    match probe {
        Some(g) => {
            let State::Pending(p) = &*g else {
                unreachable!("checked")
            };
            parked(Some(p.wakeup()));
            let r = mizu_pool::wait_until(p, Some(slice), || {
                // The probe's lock is held here: test it directly, the rest by lock.
                (p.is_done() || also())
                    .then_some(())
                    .or_else(|| ready(tasks).map(|_| ()))
            });
            parked(None);
            r
        }
        None => {
            std::thread::sleep(BUSY_NAP.min(slice));
            None
        }
    }
}

/// `Pool.collect_all`: the results of `tasks` in order, waiting at most `timeout` seconds in
/// all; the first failure by position is raised. Objects that are not `Task`s are asked for
/// `result(timeout)`.
#[pyfunction]
#[pyo3(signature = (tasks, timeout=None))]
pub fn collect_all<'py>(
    tasks: &Bound<'py, PyAny>,
    timeout: Option<f64>,
) -> PyResult<Vec<Py<PyAny>>> {
    let py = tasks.py();
    let start = Instant::now();
    let limit = crate::wait_secs(timeout, "timeout")?;
    let left = || limit.map(|t| t.saturating_sub(start.elapsed()));
    let mut out = Vec::with_capacity(tasks.len().unwrap_or(0));
    // The values of the last chunk read: its other members need no lock.
    let mut last: Option<(Arc<Chunk>, Bound<'py, PyList>)> = None;
    for t in tasks.try_iter()? {
        let t = t?;
        match t.cast::<Task>() {
            Ok(task) => {
                if let (Some((chunk, i)), Some((c, values))) = (&task.get().member, &last)
                    && Arc::ptr_eq(chunk, c)
                    && !chunk.is_cancelled(*i)
                {
                    let v = values.get_item(*i)?;
                    // (A value the collector tracks: `outcome_of` tracks the task.)
                    if !crate::gc::is_tracked(&v) {
                        out.push(v.unbind());
                        continue;
                    }
                }
                let r = Task::outcome_of(task, left())?;
                if let Some((chunk, _)) = &task.get().member
                    && let Some(g) = task.get().cell.try_lock()
                    && let State::Settled {
                        ok: true, value, ..
                    } = &*g
                    && let Ok(l) = value.bind(py).cast_exact::<PyList>()
                {
                    last = Some((chunk.clone(), l.clone()));
                }
                match r {
                    Some((true, v)) => out.push(v),
                    Some((false, e)) => return Err(PyErr::from_value(e.into_bound(py))),
                    None => return Err(timeout_error(timeout)),
                }
            }
            Err(_) => out.push(
                t.call_method1(
                    pyo3::intern!(py, "result"),
                    (left().map(|l| l.as_secs_f64()),),
                )?
                .unbind(),
            ),
        }
    }
    Ok(out)
}
