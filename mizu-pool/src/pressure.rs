//! What is done when `/dev/shm` is full, once for every path that needs room: creating a
//! pool, a worker writing a result, a share, a submission (through [`crate::retry`]).
//!
//! Two things hold memory nobody needs any more: what this process keeps only for reuse
//! (idle data segments and mappings, given back at once), and what the binding's language
//! still holds as garbage (views of earlier results whose last reference is unreachable but
//! not collected yet). The binding says how to free the second once, with
//! [`set_pressure_hook`]; the runtime decides when.

use std::sync::{Mutex, OnceLock};

static HOOK: OnceLock<fn()> = OnceLock::new();
/// What the runtime itself keeps that can go under pressure (copies kept for repeated sends,
/// `repeats`), registered by whoever keeps it, so that this module names none of them.
static KEPT: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Adds `f` to what [`relieve`] lets go first (once per function).
pub(crate) fn let_go_too(f: fn()) {
    let mut k = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    if !k.iter().any(|&g| std::ptr::fn_addr_eq(g, f)) {
        k.push(f);
    }
}

/// Sets what this process's binding does when `/dev/shm` is full: collect its language's
/// garbage, so that views nobody reaches give their regions back. Called on the thread that
/// needs the room, where no payload is being read or written; it must not panic. The first
/// call wins; returns whether this one did.
pub fn set_pressure_hook(f: fn()) -> bool {
    HOOK.set(f).is_ok()
}

/// Frees what can be freed now: what the runtime keeps for reuse, the binding's garbage, then
/// what this process keeps idle.
pub fn relieve() {
    let kept = KEPT.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for f in kept {
        f();
    }
    if let Some(f) = HOOK.get() {
        f();
    }
    mizu_wire::store::give_back_idle_now();
}

/// Runs `make` (which needs room in `/dev/shm`); while it fails for lack of room
/// (`no_room`), what this process keeps idle is given back and it is tried again for a
/// moment (the other processes give back theirs meanwhile); when that was not enough, the
/// binding's garbage is collected ([`relieve`]) and it is tried once more. The error after
/// that is `make`'s last.
pub fn with_room<T, E>(
    mut make: impl FnMut() -> std::result::Result<T, E>,
    no_room: impl Fn(&E) -> bool,
) -> std::result::Result<T, E> {
    match mizu_wire::store::with_room(&mut make, &no_room) {
        Err(e) if no_room(&e) => {
            relieve();
            make()
        }
        r => r,
    }
}
