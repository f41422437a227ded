//! Large numpy arrays sent again unchanged: the first send copies the array into shared memory
//! (one copy, as any send); sending the same array again with the same bytes passes a reference
//! to that copy instead of copying it again.
//!
//! "The same bytes" is checked in full each time: the array's memory is compared with the
//! copy, byte for byte, before the copy is served, so an array modified in between (in place,
//! by any means) is copied anew and never served stale. A comparison reads memory at memory
//! speed, without the page faults and writes of a copy into fresh shared memory. The copies of
//! the last few arrays are kept, each only while its array lives (a weak reference drops it
//! when the array is garbage) and until `/dev/shm` runs short (the submit policy's collection
//! empties the cache). Only tasks' arguments are copied this way, per pool, into segments of
//! that pool's own, whose names go when the pool stops: values still held keep their memory.

use std::sync::{Arc, Mutex};

use mizu_pool::wire::{DataPool, Region};
use pyo3::prelude::*;
use pyo3::types::{PyWeakrefMethods, PyWeakrefReference};

/// Arrays at least this large are remembered.
pub(crate) const REPEAT_MIN: usize = 1 << 20;
/// How many copies are kept.
const KEPT: usize = 4;

struct Repeat {
    /// The pool it was sent to.
    pool: u64,
    addr: usize,
    len: usize,
    /// The array it is a copy of.
    source: Py<PyWeakrefReference>,
    region: Arc<Region>,
}

/// Never held across a call into Python (a garbage collection there may run [`gone`]).
static REPEATS: Mutex<Vec<Repeat>> = Mutex::new(Vec::new());

fn repeats() -> std::sync::MutexGuard<'static, Vec<Repeat>> {
    REPEATS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The region holding a copy of the `len` bytes at `addr` (the contiguous memory of `array`,
/// held by the caller with the GIL), to send by reference: the copy made when `array` was
/// last sent if its bytes are still all the same, else a new copy.
pub(crate) fn shared_copy(
    array: &Bound<'_, PyAny>,
    addr: *const u8,
    len: usize,
    pool: u64,
) -> PyResult<Arc<Region>> {
    let py = array.py();
    let hit = {
        let mut kept = repeats();
        // Weak references are read without running Python code.
        kept.retain(|e| e.source.bind(py).upgrade().is_some());
        kept.iter()
            .find(|e| {
                e.pool == pool
                    && e.addr == addr as usize
                    && e.len == len
                    && e.source.bind(py).upgrade().is_some_and(|s| s.is(array))
            })
            .map(|e| e.region.clone())
    };
    // SAFETY: `addr..+len` is the array's memory, which the caller holds (and the GIL, so
    // no Python code changes it while it is read).
    let bytes = unsafe { std::slice::from_raw_parts(addr, len) };
    if let Some(region) = hit
        && region.still_named()
        && Region::buffer(&region).as_slice()[..len] == *bytes
    {
        return Ok(region);
    }
    let store = store(pool);
    let region = py.detach(|| {
        mizu_pool::share::filled_in(&store, bytes.len(), |b| {
            mizu_pool::wire::copy_large(b, bytes)
        })
    });
    let region = Arc::new(region.map_err(crate::err)?);
    let callback = wrap_pyfunction!(gone, py)?;
    let source = PyWeakrefReference::new_with(array, callback)?.unbind();
    let mut kept = repeats();
    kept.retain(|e| !(e.pool == pool && e.addr == addr as usize && e.len == len));
    kept.insert(
        0,
        Repeat {
            pool,
            addr: addr as usize,
            len,
            source,
            region: region.clone(),
        },
    );
    let keep = kept.len().min(KEPT);
    let dropped = kept.split_off(keep);
    drop(kept);
    drop(dropped);
    Ok(region)
}

/// The weak reference's callback: its array is garbage, so its copy goes.
#[pyfunction]
fn gone(weak: &Bound<'_, PyAny>) {
    let dropped: Vec<Repeat> = {
        let mut kept = repeats();
        let (gone, live) = std::mem::take(&mut *kept)
            .into_iter()
            .partition(|e| e.source.bind(weak.py()).is(weak));
        *kept = live;
        gone
    };
    drop(dropped);
}

/// Forgets every copy (`/dev/shm` is short of room).
pub(crate) fn forget() {
    let dropped = std::mem::take(&mut *repeats());
    drop(dropped);
}

/// Forgets the copies made for `pool` and removes the names of the segments that held them
/// (the pool stopped: none of its tasks can still be reading them).
pub(crate) fn release(pool: u64) {
    let dropped: Vec<Repeat> = {
        let mut kept = repeats();
        let (gone, live) = std::mem::take(&mut *kept)
            .into_iter()
            .partition(|e| e.pool == pool);
        *kept = live;
        gone
    };
    drop(dropped);
    let store = STORES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&pool);
    if let Some(s) = store {
        s.unlink_all();
    }
}

/// At interpreter exit: every pool's copies go, with the names of their segments (processes
/// still reading them keep their mappings).
#[pyfunction]
pub(crate) fn release_all() {
    forget();
    let stores = std::mem::take(&mut *STORES.lock().unwrap_or_else(|p| p.into_inner()));
    for s in stores.values() {
        s.unlink_all();
    }
}

/// Each pool's store of copies.
static STORES: Mutex<std::collections::BTreeMap<u64, Arc<DataPool>>> =
    Mutex::new(std::collections::BTreeMap::new());

fn store(pool: u64) -> Arc<DataPool> {
    STORES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(pool)
        .or_insert_with(|| Arc::new(DataPool::new(16 << 20)))
        .clone()
}
