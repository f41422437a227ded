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

/// Futures by address (each held strongly while it is in the set), each with its rank in
/// the order of insertion.
type ByAddress = HashMap<usize, (u64, Py<PyAny>), BuildHasherDefault<FxHasher>>;

#[derive(Default)]
struct Members {
    by_address: ByAddress,
    /// The rank of the next insertion.
    next: u64,
}

/// A set of objects compared by identity (`add`, `discard`, `in`, `len`, iteration over a
/// snapshot), as an executor keeps its pending futures.
#[pyclass(module = "pymizu._native", frozen)]
#[derive(Default)]
pub struct PendingSet {
    items: Mutex<Members>,
}

impl PendingSet {
    fn lock(&self) -> MutexGuard<'_, Members> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `obj`.
    pub(crate) fn insert(&self, obj: &Bound<'_, PyAny>) {
        let old = {
            let mut m = self.lock();
            let rank = m.next;
            m.next += 1;
            m.by_address
                .insert(obj.as_ptr() as usize, (rank, obj.clone().unbind()))
        };
        // (Released after the lock: releasing may run Python code.)
        drop(old);
    }

    /// Removes `obj` if present.
    pub(crate) fn remove(&self, obj: &Bound<'_, PyAny>) {
        let old = self.lock().by_address.remove(&(obj.as_ptr() as usize));
        // (Released after the lock, as a bound reference: the GIL is known to be held.)
        drop(old.map(|(_, o)| o.into_bound(obj.py())));
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
        self.lock()
            .by_address
            .contains_key(&(obj.as_ptr() as usize))
    }

    fn __len__(&self) -> usize {
        self.lock().by_address.len()
    }

    /// An iterator over the members now (later changes do not affect it), in no particular
    /// order.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let now: Vec<Py<PyAny>> = self
            .lock()
            .by_address
            .values()
            .map(|(_, v)| v.clone_ref(py))
            .collect();
        PyList::new(py, now)?.try_iter().map(Bound::into_any)
    }

    /// The members now, oldest first (in the order they were added).
    fn in_order<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut now: Vec<(u64, Py<PyAny>)> = self
            .lock()
            .by_address
            .values()
            .map(|(k, v)| (*k, v.clone_ref(py)))
            .collect();
        now.sort_unstable_by_key(|(k, _)| *k);
        PyList::new(py, now.into_iter().map(|(_, v)| v))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // (Never blocks: a member not visited only counts as referenced from outside.)
        if let Ok(items) = self.items.try_lock() {
            for (_, v) in items.by_address.values() {
                visit.call(v)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let all = std::mem::take(&mut self.lock().by_address);
        drop(all);
    }
}
