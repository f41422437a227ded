//! Whether a task's expression may use variables of the caller's that the task does not bind
//! (its globals), or a function given with it may use its own: the cheap test `mizu_submit`
//! makes before paying for `codetools`. It walks the expression's symbols once and looks each
//! up in at most two hashed frames.

use extendr_api::prelude::*;
use extendr_ffi::{
    CAR, CDR, R_BaseEnv, R_GlobalEnv, R_MissingArg, R_UnboundValue, SEXP, SEXPTYPE, STRING_ELT,
    TYPEOF, XLENGTH,
};

/// Expressions deeper than this are left to `codetools` (the walk is recursive).
const MAX_DEPTH: usize = 64;

pub(crate) fn may_use_globals(expr: Robj, vars: Robj) -> bool {
    // SAFETY: both are live for the call (held by their Robj); R's main thread (`.Call`).
    unsafe { may_use(expr.get(), vars.get()) }
}

/// [`may_use_globals`] of raw objects.
///
/// # Safety
/// R's main thread; `expr` and `vars` are live (protected by the caller). The walk only
/// reads, and allocates nothing that could be collected under it.
pub(crate) unsafe fn may_use(expr: SEXP, vars: SEXP) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        // A function among the bindings finds its own globals where it was defined.
        if TYPEOF(vars) == SEXPTYPE::VECSXP
            && (0..XLENGTH(vars))
                .any(|i| TYPEOF(extendr_ffi::VECTOR_ELT(vars, i)) == SEXPTYPE::CLOSXP)
        {
            return true;
        }
        let names = crate::sendable::list_names(vars);
        let bound = |sym: SEXP| -> bool {
            if TYPEOF(names) != SEXPTYPE::STRSXP {
                return false;
            }
            let printed = extendr_ffi::PRINTNAME(sym);
            (0..XLENGTH(names)).any(|i| STRING_ELT(names, i) == printed)
        };
        walk(expr, false, 0, &bound)
    }
}

/// `may_use_globals` of one node; `called` when it is the function of a call.
///
/// # Safety
/// R's main thread; `x` is a live object (held by the expression being walked).
unsafe fn walk(x: SEXP, called: bool, depth: usize, bound: &dyn Fn(SEXP) -> bool) -> bool {
    if depth > MAX_DEPTH {
        return true;
    }
    // SAFETY: the caller's contract; CAR/CDR are read only of pairlists and calls.
    unsafe {
        match TYPEOF(x) {
            SEXPTYPE::SYMSXP => {
                if x == R_MissingArg || bound(x) {
                    return false;
                }
                // Strings compare by address: R caches every CHARSXP (a PRINTNAME is one).
                let in_base = crate::ffi::Rf_findVarInFrame(R_BaseEnv, x) != R_UnboundValue;
                let redefined = crate::ffi::Rf_findVarInFrame(R_GlobalEnv, x) != R_UnboundValue;
                !(called && in_base && !redefined)
            }
            SEXPTYPE::LANGSXP => {
                let f = CAR(x);
                if walk(f, true, depth + 1, bound) {
                    return true;
                }
                let mut a = CDR(x);
                if TYPEOF(f) == SEXPTYPE::SYMSXP {
                    let name =
                        std::ffi::CStr::from_ptr(extendr_ffi::R_CHAR(extendr_ffi::PRINTNAME(f)));
                    // `pkg::name` names no variable; in `x$name` and `x@name` only `x` is one.
                    if name == c"::" || name == c":::" {
                        return false;
                    }
                    if (name == c"$" || name == c"@") && TYPEOF(a) == SEXPTYPE::LISTSXP {
                        return walk(CAR(a), false, depth + 1, bound);
                    }
                }
                while TYPEOF(a) == SEXPTYPE::LISTSXP {
                    if walk(CAR(a), false, depth + 1, bound) {
                        return true;
                    }
                    a = CDR(a);
                }
                false
            }
            SEXPTYPE::LISTSXP => {
                let mut a = x;
                while TYPEOF(a) == SEXPTYPE::LISTSXP {
                    if walk(CAR(a), false, depth + 1, bound) {
                        return true;
                    }
                    a = CDR(a);
                }
                false
            }
            // A constant, or a value spliced into the expression (`bquote`): nothing to find.
            SEXPTYPE::NILSXP
            | SEXPTYPE::LGLSXP
            | SEXPTYPE::INTSXP
            | SEXPTYPE::REALSXP
            | SEXPTYPE::CPLXSXP
            | SEXPTYPE::STRSXP
            | SEXPTYPE::RAWSXP => false,
            // Anything else (a closure spliced in, an expression vector, ...): let codetools
            // and the closure checks look.
            _ => true,
        }
    }
}
