//! Large inputs sent again unchanged: the first send to a pool copies the bytes into shared
//! memory (one copy, as any send); sending the same bytes from the same place again passes a
//! reference to that copy instead of copying them again. Both bindings use it for task
//! arguments: a numpy array, an R vector.
//!
//! "The same bytes" is checked in full each time: the source's memory is compared with the
//! copy before the copy is served, so a source modified in between (in place, by any means) is
//! copied anew and never served stale, and a source freed and another made at the same place
//! with the same bytes is served correctly. A comparison reads memory at memory speed, without
//! the page faults and writes of a copy into fresh shared memory. The copies of the last few
//! sources are kept, per pool, in segments of that pool's own: until the binding says the
//! source is gone ([`forget_copy_of`]), until `/dev/shm` runs short ([`forget`], which the
//! pressure policy calls), or until the pool stops ([`release`], which [`crate::Pool::stop`]
//! calls and which also removes the segments' names: values still held keep their memory).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use mizu_wire::{DataPool, Region};

use crate::error::Result;

/// Sources at least this large are remembered.
pub const REPEAT_MIN: usize = 1 << 20;
/// How many copies are kept.
const KEPT: usize = 4;

struct Repeat {
    pool: u64,
    addr: usize,
    len: usize,
    region: Arc<Region>,
}

static REPEATS: Mutex<Vec<Repeat>> = Mutex::new(Vec::new());
/// Each pool's store of copies.
static STORES: Mutex<BTreeMap<u64, Arc<DataPool>>> = Mutex::new(BTreeMap::new());

fn repeats() -> MutexGuard<'static, Vec<Repeat>> {
    REPEATS.lock().unwrap_or_else(|p| p.into_inner())
}

fn store(pool: u64) -> Arc<DataPool> {
    STORES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(pool)
        .or_insert_with(|| Arc::new(DataPool::new(16 << 20)))
        .clone()
}

/// The copy kept of `bytes` for `pool`, if their place and length match one and its bytes are
/// still all the same. The caller keeps `bytes` unchanged for the call.
pub fn find(pool: u64, bytes: &[u8]) -> Option<Arc<Region>> {
    let (addr, len) = (bytes.as_ptr() as usize, bytes.len());
    let hit = repeats()
        .iter()
        .find(|e| e.pool == pool && e.addr == addr && e.len == len)
        .map(|e| e.region.clone())?;
    (hit.still_named() && Region::buffer(&hit).as_slice()[..len] == *bytes).then_some(hit)
}

/// A new copy of `bytes` in `pool`'s store, kept for their next send (in place of an older
/// copy of the same place and length).
pub fn keep(pool: u64, bytes: &[u8]) -> Result<Arc<Region>> {
    crate::pressure::let_go_too(forget);
    let store = store(pool);
    let region = Arc::new(crate::share::filled_in(&store, bytes.len(), |b| {
        mizu_wire::copy::copy_large(b, bytes)
    })?);
    let (addr, len) = (bytes.as_ptr() as usize, bytes.len());
    let dropped = {
        let mut kept = repeats();
        kept.retain(|e| !(e.pool == pool && e.addr == addr && e.len == len));
        kept.insert(
            0,
            Repeat {
                pool,
                addr,
                len,
                region: region.clone(),
            },
        );
        let keep = kept.len().min(KEPT);
        kept.split_off(keep)
    };
    drop(dropped);
    Ok(region)
}

/// [`find`], else [`keep`].
pub fn shared_copy(pool: u64, bytes: &[u8]) -> Result<Arc<Region>> {
    match find(pool, bytes) {
        Some(r) => Ok(r),
        None => keep(pool, bytes),
    }
}

/// Forgets the copies of the `len` bytes at `addr` (the binding's source there is gone).
pub fn forget_copy_of(addr: usize, len: usize) {
    let dropped: Vec<Repeat> = {
        let mut kept = repeats();
        let (gone, live) = std::mem::take(&mut *kept)
            .into_iter()
            .partition(|e| e.addr == addr && e.len == len);
        *kept = live;
        gone
    };
    drop(dropped);
}

/// Forgets every copy (`/dev/shm` is short of room).
pub fn forget() {
    let dropped = std::mem::take(&mut *repeats());
    drop(dropped);
}

/// Forgets the copies made for `pool` and removes the names of the segments that held them
/// (the pool stopped: none of its tasks can still be reading them).
pub fn release(pool: u64) {
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

/// At exit: every pool's copies go, with the names of their segments (processes still reading
/// them keep their mappings).
pub fn release_all() {
    forget();
    let stores = std::mem::take(&mut *STORES.lock().unwrap_or_else(|p| p.into_inner()));
    for s in stores.values() {
        s.unlink_all();
    }
}
