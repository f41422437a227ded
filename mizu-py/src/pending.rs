//! `PendingSet`: an executor's futures not settled yet. Every submission adds one and every
//! settlement removes it, so a dictionary keyed by the future (hashing through its type, and
//! a resize now and then) cost a tenth of what an executor future costs the caller; this set
//! keys by the object's address.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};
use rustc_hash::FxHasher;

/// Futures by address (each held strongly while it is in the set).
type ByAddress = HashMap<usize, Py<PyAny>, BuildHasherDefault<FxHasher>>;

/// A set of objects compared by identity (`add`, `discard`, `in`, `len`, iteration over a
/// snapshot), as an executor keeps its pending futures.
#[pyclass(module = "pymizu._native", frozen)]
#[derive(Default)]
pub struct PendingSet {
    items: Mutex<ByAddress>,
}

impl PendingSet {
    fn lock(&self) -> MutexGuard<'_, ByAddress> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `obj`.
    pub(crate) fn insert(&self, obj: &Bound<'_, PyAny>) {
        let old = self
            .lock()
            .insert(obj.as_ptr() as usize, obj.clone().unbind());
        // (Released after the lock: releasing may run Python code.)
        drop(old);
    }

    /// Removes `obj` if present.
    pub(crate) fn remove(&self, obj: &Bound<'_, PyAny>) {
        let old = self.lock().remove(&(obj.as_ptr() as usize));
        drop(old);
    }
}

#[pymethods]
impl PendingSet {
    #[new]
    fn py_new() -> Self {
        Self::default()
    }

    /// Adds `obj`.
    fn add(&self, obj: &Bound<'_, PyAny>) {
        self.insert(obj);
    }

    /// Removes `obj` if present.
    fn discard(&self, obj: &Bound<'_, PyAny>) {
        self.remove(obj);
    }

    fn __contains__(&self, obj: &Bound<'_, PyAny>) -> bool {
        self.lock().contains_key(&(obj.as_ptr() as usize))
    }

    fn __len__(&self) -> usize {
        self.lock().len()
    }

    /// An iterator over the members now (later changes do not affect it).
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let now: Vec<Py<PyAny>> = self.lock().values().map(|v| v.clone_ref(py)).collect();
        PyList::new(py, now)?.try_iter().map(Bound::into_any)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // (Never blocks: a member not visited only counts as referenced from outside.)
        if let Ok(items) = self.items.try_lock() {
            for v in items.values() {
                visit.call(v)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let all = std::mem::take(&mut *self.lock());
        drop(all);
    }
}
