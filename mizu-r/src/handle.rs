//! Native handles as R external pointers, made and read without extendr's object tracking
//! (which costs a hash-table update per R value touched: the round trip of a task touches
//! dozens).
//!
//! Pool and channel handles have extendr's `ExternalPtr<T>` layout (the address is a
//! `Box<Box<dyn Any>>`, the tag a character vector naming `T`); [`ext_ref`] checks the tag
//! before the address is touched, so an external pointer of another origin is refused instead
//! of dereferenced. Task handles are batched (see `batch.rs`).

use std::any::{Any, type_name};
use std::cell::Cell;
use std::ffi::CStr;

use extendr_ffi::{
    R_ExternalPtrAddr, R_ExternalPtrTag, R_PreserveObject, Rf_mkCharLenCE, Rf_protect,
    Rf_unprotect, SEXP, SEXPTYPE, STRING_ELT, TYPEOF, XLENGTH, cetype_t,
};

/// A character vector of one UTF-8 string (R's main thread; allocates).
///
/// # Safety
/// R's main thread. The result is unprotected.
pub(crate) unsafe fn mk_string(s: &str) -> SEXP {
    // SAFETY: R's main thread (the caller's contract); the CHARSXP is protected while the
    // vector that holds it is allocated.
    unsafe {
        let c = Rf_protect(Rf_mkCharLenCE(
            s.as_ptr().cast(),
            s.len() as i32,
            cetype_t::CE_UTF8,
        ));
        let v = extendr_ffi::Rf_allocVector(SEXPTYPE::STRSXP, 1);
        extendr_ffi::SET_STRING_ELT(v, 0, c);
        Rf_unprotect(1);
        v
    }
}

thread_local! {
    /// `"e"`: the kind of an expression task's message.
    static EXPR_KIND: Cell<Option<SEXP>> = const { Cell::new(None) };
}

/// `"e"`, the first element of an expression task's message (made once, kept).
///
/// # Safety
/// R's main thread.
pub(crate) unsafe fn kept_expr_kind() -> SEXP {
    // SAFETY: the caller's contract.
    unsafe { kept(&EXPR_KIND, "e") }
}

/// A string vector made once per session and kept (preserved).
///
/// # Safety
/// R's main thread.
pub(crate) unsafe fn kept(
    key: &'static std::thread::LocalKey<Cell<Option<SEXP>>>,
    text: &str,
) -> SEXP {
    // SAFETY: the caller's contract; `mk_string` returns a fresh vector.
    unsafe { kept_with(key, || mk_string(text)) }
}

/// An R object made once per session by `make` and kept (preserved) in `key` for the rest
/// of it, so that a hot path neither rebuilds it nor protects it.
///
/// # Safety
/// R's main thread; `make` returns a fresh object (unprotected is fine: nothing allocates
/// between its return and the preservation).
pub(crate) unsafe fn kept_with(
    key: &'static std::thread::LocalKey<Cell<Option<SEXP>>>,
    make: impl FnOnce() -> SEXP,
) -> SEXP {
    if let Some(x) = key.get() {
        return x;
    }
    let x = make();
    // SAFETY: R's main thread; preserved before anything else allocates.
    unsafe { R_PreserveObject(x) };
    key.set(Some(x));
    x
}

/// The `T` behind handle `x`, if `x` is a live handle of a `T`.
///
/// # Safety
/// R's main thread; `x` is a live SEXP that stays protected while the reference is used.
pub(crate) unsafe fn ext_ref<'a, T: Any>(x: SEXP) -> Option<&'a T> {
    // SAFETY: type and tag are checked before the address is read; the address of a handle
    // with this tag is a `Box<Box<dyn Any>>` (see the module docs), alive while `x` is.
    unsafe {
        if TYPEOF(x) != SEXPTYPE::EXTPTRSXP {
            return None;
        }
        let tag = R_ExternalPtrTag(x);
        if TYPEOF(tag) != SEXPTYPE::STRSXP || XLENGTH(tag) != 1 {
            return None;
        }
        let name = CStr::from_ptr(extendr_ffi::R_CHAR(STRING_ELT(tag, 0)));
        if name.to_bytes() != type_name::<T>().as_bytes() {
            return None;
        }
        R_ExternalPtrAddr(x)
            .cast::<Box<dyn Any>>()
            .as_ref()?
            .downcast_ref::<T>()
    }
}
