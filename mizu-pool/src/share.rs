//! The store of shared objects: values a binding copies once into shared memory of this
//! process (`pymizu.share`, `pymizu.empty`, R's `mizu_share()`) and then reads and sends
//! through views, so that every task receives a reference instead of the bytes.
//!
//! The store is one [`DataPool`] per process (an object larger than a segment gets one of its
//! own). Its regions live as long as some view holds them; at exit the binding calls
//! [`release`], which removes the segments' names so that nothing of this process's is left
//! in `/dev/shm` by objects never freed (readers keep their mappings).

use std::sync::OnceLock;

use mizu_wire::{DataPool, Region};

use crate::error::Result;

static STORE: OnceLock<DataPool> = OnceLock::new();

fn store() -> &'static DataPool {
    STORE.get_or_init(|| DataPool::new(16 << 20))
}

/// A committed region of `n` bytes of the store that `fill` wrote (`/dev/shm` short of room
/// is made room in as [`crate::pressure::with_room`] does).
pub fn filled(n: usize, fill: impl FnOnce(&mut [u8])) -> Result<Region> {
    filled_in(store(), n, fill)
}

/// A copy of `src` in a region of the store.
pub fn copy(src: &[u8]) -> Result<Region> {
    filled(src.len(), |b| mizu_wire::copy::copy_large(b, src))
}

/// [`filled`] in another data pool (a pool's own, say).
pub fn filled_in(pool: &DataPool, n: usize, fill: impl FnOnce(&mut [u8])) -> Result<Region> {
    let mut r = crate::pressure::with_room(|| pool.alloc(n.max(1)), |e| e.is_no_space())?;
    fill(&mut r.bytes_mut()[..n]);
    Ok(r.commit())
}

/// Removes the names of the store's segments (at exit; see the module's documentation).
pub fn release() {
    if let Some(s) = STORE.get() {
        s.unlink_all();
    }
}
