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

/// Whether a process with id `pid` runs (a zombie — killed, not yet waited for — does not).
/// For a process known by its pid alone: a reused pid makes an unrelated process look like it,
/// so callers may only conclude "not running" from `false`.
pub fn pid_runs(pid: u32) -> bool {
    let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    match rustix::process::test_kill_process(p) {
        Err(rustix::io::Errno::SRCH) => false,
        // Exists (EPERM: another user's) or cannot tell: never declared gone on an error.
        _ => !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            // The state follows the command name's closing parenthesis.
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|c| matches!(c, 'Z' | 'X'))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{current_pid, pid_runs};

    #[test]
    fn a_zombie_does_not_run() {
        assert!(pid_runs(current_pid()));
        assert!(!pid_runs(0));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not waited for yet: a zombie once it exits.
        while pid_runs(pid) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(!pid_runs(pid));
    }

    #[test]
    fn is_the_process_id() {
        assert_eq!(current_pid(), std::process::id());
        assert_eq!(current_pid(), std::process::id());
    }
}
