//! What a task message may hold: checked before anything is sent, so that a value that
//! cannot cross (an external pointer, a connection, a value another language cannot read) is a
//! classed error at submission, not a failure in the worker.

use extendr_api::prelude::*;
use extendr_ffi::{SEXP, SEXPTYPE};

use crate::pool::failure;

/// Checks a task message `list(kind, expr, vars)`: as [`check_vars_sexp`].
pub(crate) fn check_msg(msg: &Robj) -> std::result::Result<(), Unsendable> {
    // SAFETY: `msg` is protected by its handle for the call.
    unsafe { check_msg_sexp(msg.get()) }
}

/// [`check_msg`] on a raw value (no R handles: it runs on every submit).
///
/// # Safety
/// `msg` is a live SEXP; this only reads it.
pub(crate) unsafe fn check_msg_sexp(msg: SEXP) -> std::result::Result<(), Unsendable> {
    use extendr_ffi::{TYPEOF, VECTOR_ELT, XLENGTH};
    // SAFETY: reads of live objects (the caller's contract).
    unsafe {
        // (A fourth element, an expression task's globals, is checked by the R code that
        // found them.)
        if TYPEOF(msg) != SEXPTYPE::VECSXP || !matches!(XLENGTH(msg), 3 | 4) {
            return Ok(());
        }
        check_vars_sexp(VECTOR_ELT(msg, 2))
    }
}

/// Why a task cannot be submitted: the class of the R condition and its message.
#[derive(Debug)]
pub(crate) struct Unsendable {
    /// The condition's class (it inherits `mizu_error`).
    pub class: &'static str,
    /// The condition's message.
    pub message: String,
}

/// A failure of class `mizu_error`.
impl From<String> for Unsendable {
    fn from(message: String) -> Unsendable {
        Unsendable {
            class: "mizu_error",
            message,
        }
    }
}

impl Unsendable {
    /// The failure `c(class, message)` the R wrappers raise.
    pub(crate) fn failure(&self) -> Robj {
        failure(self.class, &self.message)
    }
}

/// [`check_msg_sexp`] of a message's bindings `vars`: every value of a non-empty list is
/// named, and none is (or holds in a list) an environment or an external pointer, unless the
/// list is marked `mizu_copy` (the future backend's globals, sent as copies as `future`'s
/// other backends send them).
///
/// # Safety
/// `vars` is a live SEXP; this only reads it (and allocates only to describe a failure).
pub(crate) unsafe fn check_vars_sexp(vars: SEXP) -> std::result::Result<(), Unsendable> {
    // SAFETY: reads of a live object (the caller's contract).
    unsafe {
        check_var_names(vars)?;
        match portability(vars, "argument ") {
            Some(u) if !copies_allowed(vars) => Err(u),
            _ => Ok(()),
        }
    }
}

/// The names part of [`check_vars_sexp`]: every value of a non-empty list `vars` is named.
/// Enough before the compact encoding, which takes no environment or external pointer (a
/// binding it does not take goes through the whole check).
///
/// # Safety
/// `vars` is a live SEXP; this only reads it.
pub(crate) unsafe fn check_var_names(vars: SEXP) -> std::result::Result<(), Unsendable> {
    use extendr_ffi::{R_NaString, STRING_ELT, TYPEOF, XLENGTH};
    const BAD: &str = "the values in `...` must be named: they are the bindings the expression \
                       sees";
    // SAFETY: reads of a live object (the caller's contract).
    unsafe {
        if TYPEOF(vars) != SEXPTYPE::VECSXP || XLENGTH(vars) == 0 {
            return Ok(());
        }
        let names = list_names(vars);
        if TYPEOF(names) != SEXPTYPE::STRSXP || XLENGTH(names) != XLENGTH(vars) {
            return Err(Unsendable::from(BAD.to_owned()));
        }
        for i in 0..XLENGTH(names) {
            let n = STRING_ELT(names, i);
            if n == R_NaString || extendr_ffi::LENGTH(n) == 0 {
                return Err(Unsendable::from(BAD.to_owned()));
            }
        }
        Ok(())
    }
}

/// The names of the list `vars` (`R_NilValue` when it has none): its `names` attribute as
/// stored, found without `Rf_getAttrib`'s checks for other kinds of object; a list without one
/// asks it (a one-dimensional array's names are its dimnames). Neither allocates.
///
/// # Safety
/// R's main thread; `vars` is a live SEXP.
pub(crate) unsafe fn list_names(vars: SEXP) -> SEXP {
    use extendr_ffi::{R_NamesSymbol, TYPEOF};
    // SAFETY: reads of a live object's attribute list (the caller's contract).
    unsafe {
        let mut a = crate::ffi::ATTRIB(vars);
        while TYPEOF(a) == SEXPTYPE::LISTSXP {
            if extendr_ffi::TAG(a) == R_NamesSymbol {
                return extendr_ffi::CAR(a);
            }
            a = extendr_ffi::CDR(a);
        }
        extendr_ffi::Rf_getAttrib(vars, R_NamesSymbol)
    }
}

/// Whether `vars` carries the `mizu_copy` mark (looked up only when a check failed).
///
/// # Safety
/// `vars` is a live SEXP.
unsafe fn copies_allowed(vars: SEXP) -> bool {
    // SAFETY: reads of a live object; `Rf_install` of an ASCII name.
    unsafe {
        let mark = extendr_ffi::Rf_install(c"mizu_copy".as_ptr());
        extendr_ffi::TYPEOF(extendr_ffi::Rf_getAttrib(vars, mark)) != SEXPTYPE::NILSXP
    }
}

/// One step into a list: by name (`$a`) or position (`[[2]]`).
enum Step {
    Name(String),
    Index(isize),
}

/// An environment or external pointer in `x`, the elements of a list `x` (recursively) — the
/// values R's serialization would send as a copy or as a null pointer — as an error naming
/// where it sits: `{prefix}`, then the first step as `` `name` `` or its position, then the
/// further steps as R would index them. Environments that travel by name (the global, base
/// and empty environments, namespaces, attached packages) pass. A function's environment is
/// not looked into: a closure travels with its environment, as R sends it.
///
/// # Safety
/// `x` is a live SEXP; this only reads it until it has found something to report.
pub(crate) unsafe fn portability(x: SEXP, prefix: &str) -> Option<Unsendable> {
    /// What was found, and the steps to it (innermost first).
    unsafe fn find(x: SEXP, depth: usize) -> Option<(bool, Vec<Step>)> {
        use extendr_ffi::{
            R_BaseEnv, R_EmptyEnv, R_GlobalEnv, R_IsNamespaceEnv, R_IsPackageEnv, R_NamesSymbol,
            Rf_getAttrib, STRING_ELT, TYPEOF, VECTOR_ELT, XLENGTH,
        };
        // SAFETY: reads of live objects (the caller's contract; list elements are kept alive
        // by their list).
        unsafe {
            match TYPEOF(x) {
                SEXPTYPE::ENVSXP => {
                    let by_name = x == R_GlobalEnv
                        || x == R_BaseEnv
                        || x == R_EmptyEnv
                        || R_IsNamespaceEnv(x) != extendr_ffi::Rboolean::FALSE
                        || R_IsPackageEnv(x) != extendr_ffi::Rboolean::FALSE;
                    (!by_name).then(|| (true, Vec::new()))
                }
                SEXPTYPE::EXTPTRSXP => Some((false, Vec::new())),
                // Deeper lists than this are left to the serializer (no stack overflow here).
                SEXPTYPE::VECSXP if depth < 64 => {
                    for i in 0..XLENGTH(x) {
                        if let Some((env, mut steps)) = find(VECTOR_ELT(x, i), depth + 1) {
                            let names = Rf_getAttrib(x, R_NamesSymbol);
                            let name = (TYPEOF(names) == SEXPTYPE::STRSXP).then(|| {
                                let c = STRING_ELT(names, i);
                                std::ffi::CStr::from_ptr(extendr_ffi::R_CHAR(c))
                                    .to_string_lossy()
                                    .into_owned()
                            });
                            steps.push(match name {
                                Some(n) if !n.is_empty() => Step::Name(n),
                                _ => Step::Index(i + 1),
                            });
                            return Some((env, steps));
                        }
                    }
                    None
                }
                _ => None,
            }
        }
    }
    // SAFETY: the caller's contract.
    let (env, steps) = unsafe { find(x, 0) }?;
    let mut at = prefix.to_owned();
    for (k, step) in steps.iter().rev().enumerate() {
        match (k, step) {
            (0, Step::Name(n)) => at.push_str(&format!("`{n}`")),
            (0, Step::Index(i)) => at.push_str(&i.to_string()),
            (_, Step::Name(n)) => at.push_str(&format!("${n}")),
            (_, Step::Index(i)) => at.push_str(&format!("[[{i}]]")),
        }
    }
    let message = if env {
        format!(
            "{at}: an environment cannot be sent to a worker (it would arrive as a copy, and \
             changes made there would not come back); send the values it holds instead, \
             e.g. as.list()"
        )
    } else {
        format!(
            "{at}: an external pointer cannot be sent to another process (it would arrive as \
             a null pointer)"
        )
    };
    Some(Unsendable {
        class: "mizu_error_not_portable",
        message,
    })
}

pub(crate) fn check_portable(x: Robj, what: &str) -> Robj {
    // SAFETY: `x` is protected by its handle for the call.
    match unsafe { portability(x.get(), what) } {
        Some(u) => u.failure(),
        None => ().into(),
    }
}
