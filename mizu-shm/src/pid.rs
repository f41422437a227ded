//! This process's id, cached. `getpid` is a system call (0.1–0.2 µs in a VM) and the language
//! bindings' fork guards ask for it on nearly every call; the cache is cleared in a forked
//! child by an at-fork handler, so a child never sees its parent's id.

use std::ffi::c_int;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

static PID: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" {
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> c_int;
}

/// Runs in the child of every `fork()`, on its only thread.
unsafe extern "C" fn forget() {
    PID.store(0, Ordering::Relaxed);
}

/// The id of the calling process (what `std::process::id()` returns, without a system call
/// after the first).
pub fn current_pid() -> u32 {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic (async-signal-safe, as
        // a child handler must be); the C library keeps the function pointer for the life of
        // the process, and the function is static.
        unsafe { pthread_atfork(None, None, Some(forget)) };
    });
    let p = std::process::id();
    PID.store(p, Ordering::Relaxed);
    p
}

#[cfg(test)]
mod tests {
    use super::current_pid;

    #[test]
    fn is_the_process_id() {
        assert_eq!(current_pid(), std::process::id());
        assert_eq!(current_pid(), std::process::id());
    }
}
