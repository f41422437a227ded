//! Whether a task's expression may use variables of the caller's that the task does not bind
//! (its globals): the cheap test `mizu_submit` makes before paying for `codetools`. It walks
//! the expression's symbols once and looks each up in at most two hashed frames.

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

pub(crate) fn global_frames(names: Robj, bound: Robj, env: Robj) -> Robj {
    let (Some(names), Ok(env)) = (names.as_string_vector(), Environment::try_from(env)) else {
        return Robj::from(());
    };
    let bound = bound.as_string_vector().unwrap_or_default();
    let mut found = Vec::new();
    let mut envs = Vec::new();
    for n in names {
        if bound.contains(&n) {
            continue;
        }
        // SAFETY: R's main thread (`.Call`); `env` is held for the call, and each frame on
        // its chain is held by the one below it.
        if let Some(frame) = unsafe { frame_of(&n, env.get()) } {
            found.push(n);
            // SAFETY: a live environment (see above), protected by the list from here.
            envs.push(unsafe { Robj::from_sexp(frame) });
        }
    }
    if found.is_empty() {
        return Robj::from(());
    }
    list!(names = found, envs = List::from_values(envs)).into()
}

/// The frame `name` is found in from `env`, if that is the global environment or a
/// function's frame — not a package's namespace, its imports or base, which a function of a
/// package (or code run in a namespace, as tests are) reaches before the global environment,
/// nor a package on the search path, after it.
///
/// # Safety
/// R's main thread; `env` is a live environment.
unsafe fn frame_of(name: &str, mut env: SEXP) -> Option<SEXP> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: the caller's contract; symbols are never collected; each parent is held by
    // its child.
    unsafe {
        let sym = extendr_ffi::Rf_install(name.as_ptr());
        // Past a namespace, until the global environment: package code's frames.
        let mut in_package = false;
        loop {
            if env == extendr_ffi::R_EmptyEnv || env == R_BaseEnv || TYPEOF(env) != SEXPTYPE::ENVSXP
            {
                return None;
            }
            if env == extendr_ffi::R_BaseNamespace
                || extendr_ffi::R_IsNamespaceEnv(env) != extendr_ffi::Rboolean::FALSE
            {
                in_package = true;
            }
            if crate::ffi::Rf_findVarInFrame(env, sym) != R_UnboundValue {
                return (env == R_GlobalEnv || !in_package).then_some(env);
            }
            if env == R_GlobalEnv {
                return None;
            }
            env = extendr_ffi::get_parent_env(env);
        }
    }
}
