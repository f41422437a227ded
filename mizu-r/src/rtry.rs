//! Running R C-API calls that may raise an R error, without R's long jump crossing Rust frames
//! that own anything: the call runs inside `R_ToplevelExec`, which returns whether it
//! completed. (`R_tryCatchError` would also hand back the condition, but it evaluates R's
//! `tryCatch` on every call — microseconds each; callers that need the condition record it
//! from R, see `worker.rs`.) An error is reported by R's default handler, which prints it
//! unless the `show.error.messages` option is FALSE.

use std::cell::Cell;
use std::ffi::c_void;

use extendr_ffi::{R_NilValue, SEXP};

unsafe extern "C" {
    fn R_ToplevelExec(fun: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void) -> i32;
}

struct Call<F> {
    f: Option<F>,
    out: SEXP,
}

unsafe extern "C" fn body<F: FnOnce() -> SEXP>(data: *mut c_void) {
    // SAFETY: `data` is the `Call<F>` that `try_r` passes, alive for the whole call.
    let call = unsafe { &mut *data.cast::<Call<F>>() };
    if let Some(f) = call.f.take() {
        call.out = f();
    }
}

/// Runs `f` (which calls R's C API) on R's main thread: its value (unprotected, like any fresh
/// R value), or `Err` if it raised an R error (or was interrupted).
///
/// # Safety
/// R's main thread only. An R error long-jumps out of `f`, so `f` must not own values with
/// destructors while it calls into R (capture raw pointers and `Copy` data only).
pub unsafe fn try_r<F: FnOnce() -> SEXP>(f: F) -> Result<SEXP, ()> {
    let mut call = Call {
        f: Some(f),
        // SAFETY: reading R's nil constant.
        out: unsafe { R_NilValue },
    };
    let data = std::ptr::from_mut(&mut call).cast::<c_void>();
    // SAFETY: the trampoline matches `R_ToplevelExec`'s signature and gets `call` back.
    let ok = unsafe { R_ToplevelExec(Some(body::<F>), data) };
    if ok != 0 { Ok(call.out) } else { Err(()) }
}

thread_local! {
    /// The calls `.Internal(options(show.error.messages = FALSE))` and `= TRUE)`, built once
    /// and kept from the collector: parsing `options(...)` anew and calling its closure took
    /// ~8.5 µs of every quiet call, three fifths of decoding a small classed value.
    static SHOW_OFF: Cell<Option<SEXP>> = const { Cell::new(None) };
    /// See [`SHOW_OFF`].
    static SHOW_ON: Cell<Option<SEXP>> = const { Cell::new(None) };
}

/// The call that sets `show.error.messages` to `on` (see [`SHOW_OFF`]).
///
/// # Safety
/// R's main thread only.
unsafe fn set_show_call(on: bool) -> SEXP {
    let key = if on { &SHOW_ON } else { &SHOW_OFF };
    // SAFETY: R's main thread; the inner call is protected while the outer one is built,
    // and the outer one is returned fresh for `kept_with` to preserve.
    unsafe {
        crate::handle::kept_with(key, || {
            use extendr_ffi::{CDR, Rf_install, Rf_protect, Rf_unprotect};
            let inner = Rf_protect(crate::ffi::Rf_lang2(
                Rf_install(c"options".as_ptr()),
                crate::ffi::Rf_ScalarLogical(i32::from(on)),
            ));
            extendr_ffi::SET_TAG(CDR(inner), Rf_install(c"show.error.messages".as_ptr()));
            let call = crate::ffi::Rf_lang2(Rf_install(c".Internal".as_ptr()), inner);
            Rf_unprotect(1);
            call
        })
    }
}

/// Sets R's `show.error.messages` option; returns whether it was TRUE.
///
/// # Safety
/// R's main thread only.
unsafe fn show_error_messages(on: bool) -> bool {
    // SAFETY: R's main thread; the option lookup does not allocate; the assignment runs in
    // its own top-level context (an error there leaves the option as it was).
    unsafe {
        let tag = extendr_ffi::Rf_install(c"show.error.messages".as_ptr());
        let cur = crate::ffi::Rf_GetOption1(tag);
        let was = extendr_ffi::TYPEOF(cur) == extendr_ffi::SEXPTYPE::LGLSXP
            && extendr_ffi::XLENGTH(cur) == 1
            && *extendr_ffi::LOGICAL(cur) == 1;
        if was != on {
            let call = set_show_call(on);
            let _ = try_r(|| crate::ffi::Rf_eval(call, extendr_ffi::R_BaseEnv));
        }
        was
    }
}

/// [`try_r`] for calls whose errors the caller reports itself: R does not print them (R's
/// default handler would put its own message on stderr before the caller's error).
///
/// # Safety
/// As for [`try_r`].
pub unsafe fn try_r_quiet<F: FnOnce() -> SEXP>(f: F) -> Result<SEXP, ()> {
    // SAFETY: the caller's contract; the option is put back on every path, and the value is
    // protected meanwhile: putting it back evaluates R code, whose allocations may collect
    // garbage, and nothing else refers to a fresh value yet.
    unsafe {
        let was = show_error_messages(false);
        let r = try_r(f);
        if was {
            if let Ok(x) = r {
                extendr_ffi::Rf_protect(x);
            }
            show_error_messages(true);
            if r.is_ok() {
                extendr_ffi::Rf_unprotect(1);
            }
        }
        r
    }
}
