//! ALTREP views: received vectors whose elements stay in the shared pages they arrived in.
//!
//! A view holds the received buffer (which keeps the region mapped and referenced) in an
//! external pointer (`data1`). Reading goes straight to shared memory; the first request for a
//! writable pointer copies the elements into a private R vector (`data2`) that the view uses
//! from then on, so modifying a view never writes to shared pages. `Duplicate` gives a plain
//! private copy (R copies the attributes). Serialization writes the elements as a standard
//! vector (no serialized state), so `saveRDS` of a view stores ordinary data.

use std::cell::OnceCell;
use std::ffi::c_void;

use arrow_buffer::Buffer;

use crate::altrep::{Owned, Shared, Source, account, new_view};
use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{
    DATAPTR, R_ExternalPtrAddr, R_NilValue, R_altrep_class_t, R_altrep_data1, R_altrep_data2,
    R_altrep_inherits, R_make_altcomplex_class, R_make_altinteger_class, R_make_altlogical_class,
    R_make_altraw_class, R_make_altreal_class, R_set_altcomplex_Elt_method,
    R_set_altinteger_Elt_method, R_set_altlogical_Elt_method, R_set_altraw_Elt_method,
    R_set_altreal_Elt_method, R_set_altrep_Duplicate_method, R_set_altrep_Length_method,
    R_set_altrep_data2, R_set_altvec_Dataptr_method, R_set_altvec_Dataptr_or_null_method, R_xlen_t,
    Rboolean, Rcomplex, Rf_allocVector, Rf_protect, Rf_unprotect, SEXP, SEXPTYPE, TYPEOF,
};

/// The vector types that can be views, with their wire codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VType {
    /// `integer` (also factors, and `Date`s stored as integers).
    Int = 0,
    /// `double` (also `Date`, `POSIXct`, `difftime`).
    Real = 1,
    /// `logical`.
    Lgl = 2,
    /// `raw`.
    Raw = 3,
    /// `complex`.
    Cplx = 4,
    /// `character` (see `strview.rs`).
    Str = 5,
}

impl VType {
    /// From a wire code.
    pub fn from_code(c: u8) -> Option<VType> {
        Some(match c {
            0 => VType::Int,
            1 => VType::Real,
            2 => VType::Lgl,
            3 => VType::Raw,
            4 => VType::Cplx,
            5 => VType::Str,
            _ => return None,
        })
    }

    /// Its code in a payload's buffer table (`mizu_pool::wire::oob::code`: `R_INTEGER` ...
    /// `R_STRINGS`, in this order).
    pub fn wire(self) -> u8 {
        mizu_pool::wire::oob::code::R_INTEGER + self as u8
    }

    /// From its code in a payload's buffer table.
    pub fn from_wire(c: u8) -> Option<VType> {
        c.checked_sub(mizu_pool::wire::oob::code::R_INTEGER)
            .and_then(VType::from_code)
    }

    /// Of an R vector (None for types that cannot be views).
    pub fn of(t: SEXPTYPE) -> Option<VType> {
        Some(match t {
            SEXPTYPE::INTSXP => VType::Int,
            SEXPTYPE::REALSXP => VType::Real,
            SEXPTYPE::LGLSXP => VType::Lgl,
            SEXPTYPE::RAWSXP => VType::Raw,
            SEXPTYPE::CPLXSXP => VType::Cplx,
            SEXPTYPE::STRSXP => VType::Str,
            _ => return None,
        })
    }

    /// Bytes per element (for a character vector: of its offset).
    pub fn size(self) -> usize {
        match self {
            VType::Int | VType::Lgl => 4,
            VType::Real | VType::Str => 8,
            VType::Raw => 1,
            VType::Cplx => 16,
        }
    }

    pub(crate) fn sexptype(self) -> SEXPTYPE {
        match self {
            VType::Int => SEXPTYPE::INTSXP,
            VType::Real => SEXPTYPE::REALSXP,
            VType::Lgl => SEXPTYPE::LGLSXP,
            VType::Raw => SEXPTYPE::RAWSXP,
            VType::Cplx => SEXPTYPE::CPLXSXP,
            VType::Str => SEXPTYPE::STRSXP,
        }
    }
}

/// What a view's external pointer owns.
struct State {
    buf: Buffer,
    len: usize,
    /// Bytes counted for it (`account`).
    counted: usize,
    /// The encoded Arrow value the view came in (see `arrow_in.rs`), for re-sending it by
    /// reference; `None` for R's layout.
    src: Option<Source>,
}

thread_local! {
    /// The five ALTREP classes, registered once (on R's main thread).
    static CLASSES: OnceCell<[R_altrep_class_t; 5]> = const { OnceCell::new() };
}

/// # Safety
/// `x` is a view made by [`make`] (R calls the methods only on instances of our classes).
unsafe fn state<'a>(x: SEXP) -> &'a State {
    // SAFETY: data1 of our views is an external pointer to a live `State` (freed only by its
    // finalizer, when the view itself is unreachable).
    unsafe { &*R_ExternalPtrAddr(R_altrep_data1(x)).cast::<State>() }
}

/// The elements: the private copy once there is one, else the shared pages.
///
/// # Safety
/// As [`state`].
unsafe fn data(x: SEXP) -> *const c_void {
    // SAFETY: as `state`; data2 is nil or the private copy (a vector of x's type).
    unsafe {
        let d2 = R_altrep_data2(x);
        if d2 != R_NilValue {
            DATAPTR(d2).cast_const()
        } else {
            state(x).buf.as_ptr().cast()
        }
    }
}

/// A private copy of the elements.
///
/// # Safety
/// As [`state`].
unsafe fn copy_of(x: SEXP) -> SEXP {
    // SAFETY: as `state`; the new vector has room for `len` elements of the view's type.
    unsafe {
        let st = state(x);
        let t = TYPEOF(x);
        let size = VType::of(t).map_or(1, VType::size);
        let v = Rf_protect(Rf_allocVector(t, st.len as R_xlen_t));
        std::ptr::copy_nonoverlapping(data(x).cast::<u8>(), DATAPTR(v).cast::<u8>(), st.len * size);
        Rf_unprotect(1);
        v
    }
}

unsafe extern "C" fn length(x: SEXP) -> R_xlen_t {
    // SAFETY: called by R on one of our views.
    unsafe { state(x).len as R_xlen_t }
}

unsafe extern "C" fn dataptr(x: SEXP, writeable: Rboolean) -> *mut c_void {
    // SAFETY: called by R on one of our views; R protects `x` during the call.
    unsafe {
        if writeable != Rboolean::FALSE && R_altrep_data2(x) == R_NilValue {
            // Copy on write: shared pages are never written.
            let v = copy_of(x);
            R_set_altrep_data2(x, v);
        }
        data(x).cast_mut()
    }
}

unsafe extern "C" fn dataptr_or_null(x: SEXP) -> *const c_void {
    // SAFETY: called by R on one of our views.
    unsafe { data(x) }
}

unsafe extern "C" fn duplicate(x: SEXP, _deep: Rboolean) -> SEXP {
    // SAFETY: called by R on one of our views.
    unsafe { copy_of(x) }
}

macro_rules! elt {
    ($name:ident, $t:ty) => {
        unsafe extern "C" fn $name(x: SEXP, i: R_xlen_t) -> $t {
            // SAFETY: called by R on one of our views with 0 <= i < length (R checks bounds);
            // the elements are aligned for $t (checked in `make`).
            unsafe { *data(x).cast::<$t>().add(i as usize) }
        }
    };
}
elt!(elt_int, i32);
elt!(elt_real, f64);
elt!(elt_raw, u8);
elt!(elt_cplx, Rcomplex);

impl Owned for State {
    fn bytes(&self) -> usize {
        self.counted
    }
}

fn classes() -> [R_altrep_class_t; 5] {
    CLASSES.with(|c| {
        *c.get_or_init(|| {
            let pkg = c"mizu";
            // SAFETY: R's main thread; each class is registered once with static names and
            // methods that match R's method signatures.
            unsafe {
                let make = [
                    R_make_altinteger_class(
                        c"mizu_view_int".as_ptr(),
                        pkg.as_ptr(),
                        std::ptr::null_mut(),
                    ),
                    R_make_altreal_class(
                        c"mizu_view_real".as_ptr(),
                        pkg.as_ptr(),
                        std::ptr::null_mut(),
                    ),
                    R_make_altlogical_class(
                        c"mizu_view_lgl".as_ptr(),
                        pkg.as_ptr(),
                        std::ptr::null_mut(),
                    ),
                    R_make_altraw_class(
                        c"mizu_view_raw".as_ptr(),
                        pkg.as_ptr(),
                        std::ptr::null_mut(),
                    ),
                    R_make_altcomplex_class(
                        c"mizu_view_cplx".as_ptr(),
                        pkg.as_ptr(),
                        std::ptr::null_mut(),
                    ),
                ];
                for c in make {
                    R_set_altrep_Length_method(c, Some(length));
                    R_set_altrep_Duplicate_method(c, Some(duplicate));
                    R_set_altvec_Dataptr_method(c, Some(dataptr));
                    R_set_altvec_Dataptr_or_null_method(c, Some(dataptr_or_null));
                }
                R_set_altinteger_Elt_method(make[0], Some(elt_int));
                R_set_altreal_Elt_method(make[1], Some(elt_real));
                R_set_altlogical_Elt_method(make[2], Some(elt_int));
                R_set_altraw_Elt_method(make[3], Some(elt_raw));
                R_set_altcomplex_Elt_method(make[4], Some(elt_cplx));
                make
            }
        })
    })
}

/// A vector of type `t` over `buf` (whose length is a whole number of elements; `copy` as in
/// [`account`]): a view when
/// the bytes are aligned for the type, else a private copy.
pub fn make(buf: Buffer, t: VType, copy: bool) -> Result<Robj> {
    make_from(buf, t, copy, None)
}

/// [`make`] for the values of an Arrow array that came in as (part of) `src`.
pub fn make_sourced(buf: Buffer, t: VType, copy: bool, src: Source) -> Result<Robj> {
    make_from(buf, t, copy, Some(src))
}

fn make_from(buf: Buffer, t: VType, copy: bool, src: Option<Source>) -> Result<Robj> {
    if t == VType::Str {
        return crate::strview::make(buf, copy);
    }
    let size = t.size();
    if !buf.len().is_multiple_of(size) {
        return Err(crate::rerr(format!(
            "malformed payload: {} bytes is not a whole number of {size}-byte elements",
            buf.len()
        )));
    }
    let len = buf.len() / size;
    let align = if t == VType::Cplx { 8 } else { size };
    if !(buf.as_ptr() as usize).is_multiple_of(align) {
        // SAFETY: a fresh vector of `len` elements of `t`; the copy fills it exactly.
        return Ok(unsafe {
            let v = Rf_protect(Rf_allocVector(t.sexptype(), len as R_xlen_t));
            std::ptr::copy_nonoverlapping(buf.as_ptr(), DATAPTR(v).cast::<u8>(), buf.len());
            let r = Robj::from_sexp(v);
            Rf_unprotect(1);
            r
        });
    }
    let class = classes()[t as usize];
    let counted = account(buf.len(), copy, buf.as_ptr());
    Ok(new_view(
        class,
        State {
            buf,
            len,
            counted,
            src,
        },
    ))
}

/// Whether `x` is a mizu view (shared pages or its private copy).
pub fn is_view_sexp(x: SEXP) -> bool {
    let cs = classes();
    // SAFETY: R_altrep_inherits accepts any SEXP.
    cs.iter()
        .any(|c| unsafe { R_altrep_inherits(x, *c) != Rboolean::FALSE })
}

/// What `x` shares when it is one of our (non-string) views, plain or lazy, and was not
/// modified.
pub fn shared(x: SEXP) -> Option<Shared> {
    if let Some(src) = crate::lazyview::unmodified_source(x) {
        return Some(Shared::Arrow(src));
    }
    // SAFETY: `state` and data2 are read only for our views (checked).
    unsafe {
        (is_view_sexp(x) && R_altrep_data2(x) == R_NilValue).then(|| {
            let st = state(x);
            match &st.src {
                Some(src) => Shared::Arrow(src.clone()),
                None => Shared::Elements(st.buf.clone()),
            }
        })
    }
}

/// Whether `x` is a view of any kind (plain, lazy, string).
pub fn is_any_view(x: SEXP) -> bool {
    is_view_sexp(x) || crate::lazyview::is_lazy_view(x) || crate::strview::string_view(x).is_some()
}

pub(crate) fn view_is_shared(x: Robj) -> bool {
    // SAFETY: `x` is live (held by R for this call); data2 is read only for our views.
    unsafe {
        if let Some(complete) = crate::strview::string_view(x.get()) {
            return !complete;
        }
        if let Some(shared) = crate::lazyview::lazy_shared(x.get()) {
            return shared;
        }
        is_view_sexp(x.get()) && R_altrep_data2(x.get()) == R_NilValue
    }
}

pub(crate) fn view_segment(x: Robj) -> Option<String> {
    Some(region_of(&x)?.describe().name)
}

pub(crate) fn view_region(x: Robj) -> Option<String> {
    let d = region_of(&x)?.describe();
    Some(format!("{}+{}", d.name, d.offset))
}

/// The region an unmodified view's elements are in.
fn region_of(x: &Robj) -> Option<std::sync::Arc<mizu_pool::wire::Region>> {
    // SAFETY: `x` is live (held by R for this call); this only reads it.
    let s = unsafe { x.get() };
    let buf = match shared(s).or_else(|| crate::strview::shared(s))? {
        Shared::Arrow(src) => src.bytes,
        Shared::Elements(b) => b,
    };
    Some(mizu_pool::wire::Region::containing(buf.as_ptr())?.0)
}

pub(crate) fn view_is_view(x: Robj) -> bool {
    // SAFETY: as above.
    let s = unsafe { x.get() };
    is_any_view(s)
}
