//! Ctrl-C while native code waits. `R_CheckUserInterrupt` would long-jump over Rust frames;
//! run inside `R_ToplevelExec` it returns instead, and the R wrapper signals the interrupt.

use std::ffi::c_void;

unsafe extern "C" {
    fn R_ToplevelExec(fun: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void) -> i32;
    fn R_CheckUserInterrupt();
}

unsafe extern "C" fn check(_: *mut c_void) {
    // SAFETY: called by R_ToplevelExec on R's main thread; a pending interrupt jumps back to
    // R_ToplevelExec's own context, never over Rust frames of ours.
    unsafe { R_CheckUserInterrupt() }
}

/// Whether the user pressed Ctrl-C (the interrupt is consumed; the caller reports it).
pub fn pending() -> bool {
    // SAFETY: R's main thread (every entry point here is called by R); `check` takes no data.
    unsafe { R_ToplevelExec(Some(check), std::ptr::null_mut()) == 0 }
}
