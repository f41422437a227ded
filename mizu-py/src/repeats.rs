//! Python's side of the copies the runtime keeps of large arguments sent again unchanged
//! (`mizu_pool::repeats`, which holds the policy): a numpy array's copy is looked up with the
//! interpreter lock held (no Python code changes the array while it is compared), made without
//! it, and forgotten once the array is garbage (a weak reference's callback), so that a copy
//! lives no longer than its array.

use std::sync::{Arc, Mutex};

use mizu_pool::repeats;
use mizu_pool::wire::Region;
use pyo3::prelude::*;
use pyo3::types::{PyWeakrefMethods, PyWeakrefReference};

pub(crate) use mizu_pool::repeats::REPEAT_MIN;

/// An array a copy was made of: its weak reference and where its bytes are.
struct Watched {
    source: Py<PyWeakrefReference>,
    addr: usize,
    len: usize,
}

/// Never held across a call into Python (a garbage collection there may run [`gone`]).
static WATCHED: Mutex<Vec<Watched>> = Mutex::new(Vec::new());

fn watched() -> std::sync::MutexGuard<'static, Vec<Watched>> {
    WATCHED.lock().unwrap_or_else(|p| p.into_inner())
}

/// The region holding a copy of the `len` bytes at `addr` (the contiguous memory of `array`,
/// held by the caller with the GIL), to send to `pool` by reference.
pub(crate) fn shared_copy(
    array: &Bound<'_, PyAny>,
    addr: *const u8,
    len: usize,
    pool: u64,
) -> PyResult<Arc<Region>> {
    let py = array.py();
    // SAFETY: `addr..+len` is the array's memory, which the caller holds (and the GIL, so no
    // Python code changes it while it is read).
    let bytes = unsafe { std::slice::from_raw_parts(addr, len) };
    if let Some(r) = repeats::find(pool, bytes) {
        return Ok(r);
    }
    let region = py
        .detach(|| repeats::keep(pool, bytes))
        .map_err(crate::err)?;
    let known = {
        let mut w = watched();
        // Weak references are read without running Python code.
        w.retain(|e| e.source.bind(py).upgrade().is_some());
        w.iter().any(|e| {
            e.addr == addr as usize
                && e.len == len
                && e.source.bind(py).upgrade().is_some_and(|s| s.is(array))
        })
    };
    if !known {
        let callback = wrap_pyfunction!(gone, py)?;
        let source = PyWeakrefReference::new_with(array, callback)?.unbind();
        watched().push(Watched {
            source,
            addr: addr as usize,
            len,
        });
    }
    Ok(region)
}

/// The weak reference's callback: its array is garbage, so its copies go.
#[pyfunction]
fn gone(weak: &Bound<'_, PyAny>) {
    let dropped: Vec<Watched> = {
        let mut w = watched();
        let (gone, live) = std::mem::take(&mut *w)
            .into_iter()
            .partition(|e| e.source.bind(weak.py()).is(weak));
        *w = live;
        gone
    };
    for e in &dropped {
        repeats::forget_copy_of(e.addr, e.len);
    }
}

/// At interpreter exit: every pool's copies go, with the names of their segments (processes
/// still reading them keep their mappings).
#[pyfunction]
pub(crate) fn release_all() {
    repeats::release_all();
}
