//! `PendingSet`: an executor's futures not settled yet. Every submission adds one and every
//! settlement removes it, so the set is a slab: a future's place is kept in its task
//! ([`Task::pending_at`]), and adding or removing it hashes nothing (a dictionary keyed by
//! the future cost a tenth of what an executor future costs the caller).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};

use crate::task::{NOT_PENDING, Task};

/// A set looks for members nobody observes once it holds this many (see
/// [`PendingSet::shed_unobserved`]).
const SHED_FROM: usize = 4096;

/// The identity of the next set made (0 is never one: see [`NOT_PENDING`]).
static NEXT_SET: AtomicU32 = AtomicU32::new(1);

#[derive(Default)]
struct Members {
    /// Each member (held strongly while it is in the set) with its rank in the order of
    /// insertion; None where a member was removed.
    places: Vec<Option<(u64, Py<PyAny>)>>,
    /// The places that are None.
    free: Vec<u32>,
    /// The rank of the next insertion.
    next: u64,
    /// How many members to reach before the next look for members nobody observes.
    shed_at: usize,
}

impl Members {
    fn members(&self) -> impl Iterator<Item = &(u64, Py<PyAny>)> {
        self.places.iter().flatten()
    }

    fn len(&self) -> usize {
        self.places.len() - self.free.len()
    }
}

/// A set of executor futures compared by identity (`add`, `discard`, `in`, `len`, iteration
/// over a snapshot, `in_order`). Its members are futures of the installed future class
/// holding a task, whose [`Task::pending_at`] says which set holds the future and where: a
/// future is in one set at most.
#[pyclass(module = "pymizu._native", frozen)]
pub struct PendingSet {
    id: u32,
    items: Mutex<Members>,
}

impl Default for PendingSet {
    fn default() -> Self {
        PendingSet {
            id: NEXT_SET.fetch_add(1, Ordering::Relaxed),
            items: Mutex::default(),
        }
    }
}

impl PendingSet {
    fn lock(&self) -> MutexGuard<'_, Members> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `obj`'s place in this set according to `pending_at` (its task's), if it is there.
    fn place_of(&self, m: &Members, obj: &Bound<'_, PyAny>, pending_at: u64) -> Option<usize> {
        let at = (pending_at as u32) as usize;
        ((pending_at >> 32) as u32 == self.id
            && m.places
                .get(at)
                .is_some_and(|p| p.as_ref().is_some_and(|(_, o)| o.is(obj))))
        .then_some(at)
    }

    /// Adds `obj`, the future holding `task`; an error if another set holds it.
    pub(crate) fn insert_of(&self, obj: &Bound<'_, PyAny>, task: &Task) -> PyResult<()> {
        let mut m = self.lock();
        let now = task.pending_at.load(Ordering::Relaxed);
        if now != NOT_PENDING {
            if self.place_of(&m, obj, now).is_some() {
                return Ok(());
            }
            return Err(PyValueError::new_err(
                "the future is pending in another executor",
            ));
        }
        let rank = m.next;
        m.next += 1;
        let entry = Some((rank, obj.clone().unbind()));
        let at = match m.free.pop() {
            Some(at) => {
                m.places[at as usize] = entry;
                at
            }
            None => {
                m.places.push(entry);
                (m.places.len() - 1) as u32
            }
        };
        task.pending_at
            .store(u64::from(self.id) << 32 | u64::from(at), Ordering::Relaxed);
        let shed = m.len() >= m.shed_at.max(SHED_FROM);
        drop(m);
        if shed {
            self.shed_unobserved(obj.py());
        }
        Ok(())
    }

    /// Lets go of the members nobody can observe any more: futures only this set refers to,
    /// with no waiter or callback (no condition), whose task finished — what a caller that
    /// submits without keeping the futures leaves behind (`ProcessPoolExecutor` drops its
    /// work items as they finish). One whose task returned a value is dropped; one whose
    /// task failed is settled first (`_settle_unobserved`), since a failure may break the
    /// executor (a worker died, an initializer failed), and settling removes it. A task not
    /// finished stays: shutdown waits for it. Looks again once the set has doubled since, so
    /// each submission pays O(1) on average.
    ///
    /// Called with no lock of the executor held: settling runs the executor's Python code.
    fn shed_unobserved(&self, py: Python<'_>) {
        let mut gone = Vec::new();
        let mut failed = Vec::new();
        let mut m = self.lock();
        let n = m.places.len();
        for at in 0..n {
            let Some((_, f)) = &m.places[at] else {
                continue;
            };
            let f = f.bind(py);
            // SAFETY: a live object (held by the set); with the GIL held, no other thread
            // takes or drops a reference meanwhile.
            if unsafe { pyo3::ffi::Py_REFCNT(f.as_ptr()) } != 1 {
                continue;
            }
            let Ok(Some(task)) = crate::future_slots::task_of(f) else {
                continue;
            };
            if !crate::future_slots::has_no_condition(f).unwrap_or(false) {
                continue;
            }
            match task.get().unread_finish() {
                Some(true) => {
                    task.get().pending_at.store(NOT_PENDING, Ordering::Relaxed);
                    gone.extend(m.places[at].take());
                    m.free.push(at as u32);
                }
                Some(false) => failed.push(f.clone()),
                None => {}
            }
        }
        m.shed_at = 2 * (m.len() - failed.len());
        drop(m);
        // (Released after the lock: a future's release frees its task's slot.)
        drop(gone);
        for f in failed {
            if let Err(e) = f.call_method0(pyo3::intern!(py, "_settle_unobserved")) {
                e.write_unraisable(py, Some(&f));
            }
        }
    }

    /// Removes `obj`, the future holding `task`, if this set holds it.
    pub(crate) fn remove_of(&self, obj: &Bound<'_, PyAny>, task: &Task) {
        let old = {
            let mut m = self.lock();
            let Some(at) = self.place_of(&m, obj, task.pending_at.load(Ordering::Relaxed)) else {
                return;
            };
            task.pending_at.store(NOT_PENDING, Ordering::Relaxed);
            m.free.push(at as u32);
            m.places[at].take()
        };
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

    /// Adds `obj` (a future of a `PoolExecutor`, in no other set).
    fn add(&self, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        let task = crate::future_slots::task_of(obj)?
            .ok_or_else(|| PyTypeError::new_err("a PendingSet holds futures of a PoolExecutor"))?;
        self.insert_of(obj, task.get())
    }

    /// Removes `obj` if present.
    fn discard(&self, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Some(t) = crate::future_slots::task_of(obj)? {
            self.remove_of(obj, t.get());
        }
        Ok(())
    }

    fn __contains__(&self, obj: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(match crate::future_slots::task_of(obj)? {
            Some(t) => {
                let at = t.get().pending_at.load(Ordering::Relaxed);
                self.place_of(&self.lock(), obj, at).is_some()
            }
            None => false,
        })
    }

    fn __len__(&self) -> usize {
        self.lock().len()
    }

    /// An iterator over the members now (later changes do not affect it), in no particular
    /// order.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let now: Vec<Py<PyAny>> = self
            .lock()
            .members()
            .map(|(_, v)| v.clone_ref(py))
            .collect();
        PyList::new(py, now)?.try_iter().map(Bound::into_any)
    }

    /// The members now, oldest first (in the order they were added).
    fn in_order<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut now: Vec<(u64, Py<PyAny>)> = self
            .lock()
            .members()
            .map(|(k, v)| (*k, v.clone_ref(py)))
            .collect();
        now.sort_unstable_by_key(|(k, _)| *k);
        PyList::new(py, now.into_iter().map(|(_, v)| v))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // (Never blocks: a member not visited only counts as referenced from outside.)
        if let Ok(items) = self.items.try_lock() {
            for (_, v) in items.members() {
                visit.call(v)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self, py: Python<'_>) {
        let all = std::mem::take(&mut *self.lock());
        for (_, f) in all.members() {
            // (Each may go into another set later.)
            if let Ok(Some(t)) = crate::future_slots::task_of(f.bind(py)) {
                t.get().pending_at.store(NOT_PENDING, Ordering::Relaxed);
            }
        }
        drop(all);
    }
}

/// `f` of the pending futures of the executor `task`'s pool serves; None if it serves none.
pub(crate) fn with_executor_pending<T>(
    py: Python<'_>,
    task: &Task,
    f: impl FnOnce(&PendingSet) -> T,
) -> Option<T> {
    let pool = task
        .pool()?
        .bind(py)
        .cast::<crate::pool_class::Pool>()
        .ok()?;
    let hooks = pool.get().executor.get()?;
    // SAFETY: `Pool.bind_executor` stores a `PendingSet` there and nothing else.
    let set = unsafe { hooks.pending.bind(py).cast_unchecked::<PendingSet>() };
    Some(f(set.get()))
}
