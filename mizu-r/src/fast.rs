//! Plain `.Call` entry points for the two calls every task makes — submit and collect —
//! without extendr's wrappers, whose argument and result tracking costs more than the rest of
//! the call (a hash-table update per R value). R reaches them through `NativeSymbol` external
//! pointers (`.native` in the package namespace, filled when the package loads).
//!
//! Each entry point returns a value the R wrapper understands even when something is wrong:
//! no R error is raised from here (so none long-jumps over Rust frames) and a panic is caught.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use extendr_api::prelude::*;
use extendr_ffi::{R_ExternalPtrAddr, R_NilValue, Rf_protect, Rf_unprotect, SEXP};

use crate::codec::Outgoing;
use crate::forked;
use crate::handle::{ext_ref, mk_string};
use crate::pool::{RPool, check_msg_sexp, collect_protected, submit_encoded, timeout_sexp};

/// The message of an error for R, without the `mizu: ` prefix the R side adds.
fn message(e: impl std::fmt::Display) -> String {
    let m = e.to_string();
    m.strip_prefix("mizu: ").map(str::to_owned).unwrap_or(m)
}

/// # Safety
/// R's main thread; `x` is live.
unsafe fn live<'a, T: std::any::Any>(x: SEXP, what: &str) -> Result<&'a T, String> {
    // SAFETY: the caller's contract; a handle restored from a saved session is an external
    // pointer with a null address.
    unsafe {
        if extendr_ffi::TYPEOF(x) == extendr_ffi::SEXPTYPE::EXTPTRSXP
            && R_ExternalPtrAddr(x).is_null()
        {
            return Err(format!(
                "not a live mizu {what} (one restored from a saved session?)"
            ));
        }
        ext_ref::<T>(x).ok_or_else(|| format!("`{what}` must be a mizu_{what}"))
    }
}

/// Submits `msg` (`list(kind, expr, vars)`) to `pool`: the task handle, or `c(class,
/// message)` for the R wrapper to raise.
unsafe extern "C" fn submit(pool: SEXP, msg: SEXP) -> SEXP {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<SEXP, String> {
        // SAFETY: R's main thread (`.Call`); `pool` and `msg` are protected by R for the call.
        unsafe {
            let p = live::<RPool>(pool, "pool")?;
            forked(p.pid).map_err(message)?;
            check_msg_sexp(msg).map_err(message)?;
            let out = Outgoing::encode_sexp(msg).map_err(message)?;
            Ok(match submit_encoded(p, &out).map_err(message)? {
                Ok(t) => crate::handle::task_handle(pool, &p.batch, t),
                // The failure's Robj is released here; nothing allocates before R has it.
                Err(f) => f.get(),
            })
        }
    }));
    let why = match r {
        Ok(Ok(x)) => return x,
        Ok(Err(m)) => m,
        Err(_) => "internal error (see the panic message above)".to_string(),
    };
    // SAFETY: R's main thread; the vector is protected while its second element is made.
    unsafe {
        let v = Rf_protect(extendr_ffi::Rf_allocVector(
            extendr_ffi::SEXPTYPE::STRSXP,
            2,
        ));
        extendr_ffi::SET_STRING_ELT(v, 0, extendr_ffi::STRING_ELT(mk_string("mizu_error"), 0));
        extendr_ffi::SET_STRING_ELT(v, 1, extendr_ffi::STRING_ELT(mk_string(&why), 0));
        Rf_unprotect(1);
        v
    }
}

/// Collects `task` within `timeout` seconds: its outcome (see `pool::outcome`); a bad
/// argument is an outcome of status 9 with the message.
unsafe extern "C" fn collect(task: SEXP, timeout: SEXP) -> SEXP {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<SEXP, String> {
        // SAFETY: R's main thread (`.Call`); `task` and `timeout` are protected by R for the
        // call; the outcome comes back protected once.
        unsafe {
            if extendr_ffi::TYPEOF(task) == extendr_ffi::SEXPTYPE::EXTPTRSXP
                && R_ExternalPtrAddr(task).is_null()
            {
                return Err("not a live mizu task (one restored from a saved session?)".into());
            }
            let t = crate::handle::task_ref(task).ok_or("`task` must be a mizu_task")?;
            forked(t.pid).map_err(message)?;
            let timeout = timeout_sexp(timeout).map_err(message)?;
            let o = collect_protected(t, task, timeout).map_err(message)?;
            Rf_unprotect(1);
            Ok(o)
        }
    }));
    let why = match r {
        Ok(Ok(x)) => return x,
        Ok(Err(m)) => m,
        Err(_) => "internal error (see the panic message above)".to_string(),
    };
    // SAFETY: R's main thread; the list is protected while its elements are made.
    unsafe {
        let o = Rf_protect(extendr_ffi::Rf_allocVector(
            extendr_ffi::SEXPTYPE::VECSXP,
            5,
        ));
        extendr_ffi::SET_VECTOR_ELT(o, 0, extendr_ffi::Rf_ScalarInteger(9));
        extendr_ffi::SET_VECTOR_ELT(o, 4, mk_string(&why));
        Rf_unprotect(1);
        o
    }
}

/// An R `NativeSymbol`: an external pointer to a routine, tagged `native symbol`, which
/// `.Call` accepts in place of a registered name.
///
/// # Safety
/// R's main thread. `f` takes as many SEXP arguments as the R code passes it.
unsafe fn native_symbol(f: *const c_void) -> SEXP {
    // SAFETY: R's main thread; a symbol is never collected.
    unsafe {
        let tag = extendr_ffi::Rf_install(c"native symbol".as_ptr());
        extendr_ffi::R_MakeExternalPtr(f.cast_mut(), tag, R_NilValue)
    }
}

/// The routines R calls through `.native$…`: `list(submit = , collect = )`.
#[extendr]
fn native_routines() -> List {
    type Two = unsafe extern "C" fn(SEXP, SEXP) -> SEXP;
    // SAFETY: R's main thread; each pointer is protected by the list's Robj as soon as it
    // exists. `.Call` calls each with the two arguments its R wrapper passes.
    unsafe {
        let s = Robj::from_sexp(native_symbol(submit as Two as *const c_void));
        let c = Robj::from_sexp(native_symbol(collect as Two as *const c_void));
        List::from_names_and_values(["submit", "collect"], [s, c]).unwrap_or_default()
    }
}

extendr_module! {
    mod fast;
    fn native_routines;
}
