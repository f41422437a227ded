//! The by-value pickles `pymizu._by_value` keeps, checked here at each call: a function a
//! worker cannot import (a lambda, a local function, a notebook's) keeps its pickle for as
//! long as what it holds is the same objects, and that check runs with every submit of it.
//! Asking Python for it cost about as much as the rest of the submit.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyTuple};

/// `_by_value`'s store: function -> (it and the by-value functions it reaches, the global
/// names they read, what they held, the pickle).
fn store(py: Python<'_>) -> PyResult<&Bound<'_, PyDict>> {
    static KEPT: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    KEPT.import(py, "pymizu._by_value", "_kept")
}

/// `_by_value`'s marker for a global not (yet) bound and an empty closure cell.
fn missing(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static MISSING: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    MISSING.import(py, "pymizu._by_value", "_MISSING")
}

/// The pickle `_by_value` keeps for `f` if what `f` holds is unchanged; None when it keeps
/// none or it is stale (`_codec.fn_ref` then decides).
pub(crate) fn head<'py>(f: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let Some(entry) = store(f.py())?.get_item(f)? else {
        return Ok(None);
    };
    let entry = entry.cast_into::<PyTuple>()?;
    let fns = entry.get_item(0)?.cast_into::<PyTuple>()?;
    let g = fns.get_item(0)?.getattr(intern!(f.py(), "__globals__"))?;
    let names = entry.get_item(1)?.cast_into::<PyTuple>()?;
    let held = entry.get_item(2)?.cast_into::<PyTuple>()?;
    if !still_held(&fns, &g.cast_into()?, &names, &held)? {
        return Ok(None);
    }
    Ok(Some(entry.get_item(3)?.cast_into::<PyBytes>()?))
}

/// Whether `fns` and the globals `names` of `g` hold what `_by_value._holds` found (`held`),
/// each the very same object: each function's code, defaults and closure cells' contents,
/// then each name's value.
#[pyfunction]
pub(crate) fn still_held(
    fns: &Bound<'_, PyTuple>,
    g: &Bound<'_, PyDict>,
    names: &Bound<'_, PyTuple>,
    held: &Bound<'_, PyTuple>,
) -> PyResult<bool> {
    let py = fns.py();
    let missing = missing(py)?;
    let mut held = held.iter();
    let mut same = |v: &Bound<'_, PyAny>| held.next().is_some_and(|h| h.is(v));
    for f in fns.iter() {
        if !same(&f.getattr(intern!(py, "__code__"))?)
            || !same(&f.getattr(intern!(py, "__defaults__"))?)
        {
            return Ok(false);
        }
        let closure = f.getattr(intern!(py, "__closure__"))?;
        if closure.is_none() {
            continue;
        }
        for c in closure.cast_into::<PyTuple>()?.iter() {
            let v = match c.getattr(intern!(py, "cell_contents")) {
                Ok(v) => v,
                Err(e) if e.is_instance_of::<PyValueError>(py) => missing.clone(),
                Err(e) => return Err(e),
            };
            if !same(&v) {
                return Ok(false);
            }
        }
    }
    for n in names.iter() {
        let v = g.get_item(n)?.unwrap_or_else(|| missing.clone());
        if !same(&v) {
            return Ok(false);
        }
    }
    Ok(true)
}
