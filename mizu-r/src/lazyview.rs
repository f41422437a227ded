//! Lazy views: received Arrow arrays whose elements differ from R's layout (booleans, factor
//! codes, dates, timestamps, nulls over values that are not R's NA) as ALTREP vectors that
//! convert an element when it is read. The first request for the data pointer converts them
//! all into a private vector (`data2`), which the view uses from then on, so the shared
//! pages are never written. Serialization writes an ordinary vector (R reads the elements).

use std::cell::OnceCell;
use std::ffi::c_void;

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef};
use arrow_buffer::{BooleanBuffer, NullBuffer, ScalarBuffer};
use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{
    DATAPTR, R_ExternalPtrAddr, R_NilValue, R_altrep_class_t, R_altrep_data1, R_altrep_data2,
    R_altrep_inherits, R_make_altinteger_class, R_make_altlogical_class, R_make_altreal_class,
    R_set_altinteger_Elt_method, R_set_altinteger_Get_region_method, R_set_altlogical_Elt_method,
    R_set_altlogical_Get_region_method, R_set_altreal_Elt_method, R_set_altreal_Get_region_method,
    R_set_altrep_Duplicate_method, R_set_altrep_Length_method, R_set_altrep_data2,
    R_set_altvec_Dataptr_method, R_set_altvec_Dataptr_or_null_method, R_xlen_t, Rboolean,
    Rf_allocVector, Rf_protect, Rf_unprotect, SEXP, SEXPTYPE,
};
use mizu_pool::wire::rmeta::{NA_INTEGER, NA_REAL_BITS};

use crate::altrep::Source;

/// How an element is made from the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conv {
    /// int32 whose nulls do not hold `NA_integer_` → integer.
    Int32,
    /// Dictionary keys (0-based) → factor codes (1-based).
    Codes,
    /// Booleans → logical.
    Bool,
    /// float64 whose nulls do not hold `NA_real_` → double.
    Float64,
    /// int64 (`integer64`) whose nulls do not hold its NA → double (the same bits).
    Int64,
    /// date32 days → double days (`Date`).
    Date,
    /// Microseconds → double seconds (`POSIXct`).
    Micros,
}

impl Conv {
    fn sexptype(self) -> SEXPTYPE {
        match self {
            Conv::Int32 | Conv::Codes => SEXPTYPE::INTSXP,
            Conv::Bool => SEXPTYPE::LGLSXP,
            _ => SEXPTYPE::REALSXP,
        }
    }
}

enum Values {
    I32(ScalarBuffer<i32>),
    I64(ScalarBuffer<i64>),
    F64(ScalarBuffer<f64>),
    Bits(BooleanBuffer),
}

/// What a lazy view's external pointer owns.
struct State {
    conv: Conv,
    values: Values,
    nulls: Option<NullBuffer>,
    len: usize,
    /// Where it came from (see `arrow_in.rs`).
    src: Source,
    /// Bytes counted for it (`view::account`).
    bytes: usize,
}

impl State {
    fn int(&self, i: usize) -> i32 {
        if self.nulls.as_ref().is_some_and(|n| n.is_null(i)) {
            return NA_INTEGER;
        }
        match (&self.values, self.conv) {
            (Values::I32(v), Conv::Codes) => v[i].wrapping_add(1),
            (Values::I32(v), _) => v[i],
            (Values::Bits(b), _) => i32::from(b.value(i)),
            _ => NA_INTEGER,
        }
    }

    fn real(&self, i: usize) -> f64 {
        if self.nulls.as_ref().is_some_and(|n| n.is_null(i)) {
            return f64::from_bits(NA_REAL_BITS);
        }
        match (&self.values, self.conv) {
            (Values::F64(v), _) => v[i],
            (Values::I64(v), Conv::Int64) => f64::from_bits(v[i] as u64),
            (Values::I64(v), _) => v[i] as f64 / 1e6,
            (Values::I32(v), _) => f64::from(v[i]),
            _ => f64::from_bits(NA_REAL_BITS),
        }
    }
}

thread_local! {
    /// The three classes (integer, logical, double), registered once on R's main thread.
    static CLASSES: OnceCell<[R_altrep_class_t; 3]> = const { OnceCell::new() };
}

/// # Safety
/// `x` is a lazy view made by [`make`].
unsafe fn state<'a>(x: SEXP) -> &'a State {
    // SAFETY: data1 of our lazy views is an external pointer to a live `State` (freed only by
    // its finalizer, when the view is unreachable).
    unsafe { &*R_ExternalPtrAddr(R_altrep_data1(x)).cast::<State>() }
}

/// A new vector of every element.
///
/// # Safety
/// As [`state`].
unsafe fn convert(x: SEXP) -> SEXP {
    // SAFETY: as `state`; the new vector has `len` elements of the conversion's type.
    unsafe {
        let st = state(x);
        let v = Rf_protect(Rf_allocVector(st.conv.sexptype(), st.len as R_xlen_t));
        if st.conv.sexptype() == SEXPTYPE::REALSXP {
            let out = std::slice::from_raw_parts_mut(DATAPTR(v).cast::<f64>(), st.len);
            for (i, o) in out.iter_mut().enumerate() {
                *o = st.real(i);
            }
        } else {
            let out = std::slice::from_raw_parts_mut(DATAPTR(v).cast::<i32>(), st.len);
            for (i, o) in out.iter_mut().enumerate() {
                *o = st.int(i);
            }
        }
        Rf_unprotect(1);
        v
    }
}

unsafe extern "C" fn length(x: SEXP) -> R_xlen_t {
    // SAFETY: called by R on one of our lazy views.
    unsafe { state(x).len as R_xlen_t }
}

unsafe extern "C" fn dataptr(x: SEXP, _writeable: Rboolean) -> *mut c_void {
    // SAFETY: called by R on one of our lazy views (protected by R for the call).
    unsafe {
        if R_altrep_data2(x) == R_NilValue {
            R_set_altrep_data2(x, convert(x));
        }
        DATAPTR(R_altrep_data2(x))
    }
}

unsafe extern "C" fn dataptr_or_null(x: SEXP) -> *const c_void {
    // SAFETY: called by R on one of our lazy views; data2 is nil or the converted copy.
    unsafe {
        let d2 = R_altrep_data2(x);
        if d2 == R_NilValue {
            std::ptr::null()
        } else {
            DATAPTR(d2).cast_const()
        }
    }
}

unsafe extern "C" fn duplicate(x: SEXP, _deep: Rboolean) -> SEXP {
    // SAFETY: called by R on one of our lazy views.
    unsafe {
        let d2 = R_altrep_data2(x);
        if d2 == R_NilValue {
            return convert(x);
        }
        extendr_ffi::Rf_duplicate(d2)
    }
}

unsafe extern "C" fn elt_int(x: SEXP, i: R_xlen_t) -> i32 {
    // SAFETY: called by R on one of our integer or logical views with 0 <= i < length.
    unsafe {
        let d2 = R_altrep_data2(x);
        if d2 != R_NilValue {
            return *DATAPTR(d2).cast::<i32>().add(i as usize);
        }
        state(x).int(i as usize)
    }
}

unsafe extern "C" fn elt_real(x: SEXP, i: R_xlen_t) -> f64 {
    // SAFETY: called by R on one of our double views with 0 <= i < length.
    unsafe {
        let d2 = R_altrep_data2(x);
        if d2 != R_NilValue {
            return *DATAPTR(d2).cast::<f64>().add(i as usize);
        }
        state(x).real(i as usize)
    }
}

/// The elements `[i, i + n)` (clipped to the length) into `buf`; how many.
///
/// # Safety
/// As [`state`]; `buf` has room for `n` elements.
unsafe fn region<T>(
    x: SEXP,
    i: R_xlen_t,
    n: R_xlen_t,
    buf: *mut T,
    elt: unsafe extern "C" fn(SEXP, R_xlen_t) -> T,
) -> R_xlen_t {
    // SAFETY: as the caller promises.
    unsafe {
        let len = state(x).len as R_xlen_t;
        let k = n.min(len - i).max(0);
        for j in 0..k {
            *buf.add(j as usize) = elt(x, i + j);
        }
        k
    }
}

unsafe extern "C" fn region_int(x: SEXP, i: R_xlen_t, n: R_xlen_t, buf: *mut i32) -> R_xlen_t {
    // SAFETY: called by R on one of our integer or logical views with room for `n`.
    unsafe { region(x, i, n, buf, elt_int) }
}

unsafe extern "C" fn region_real(x: SEXP, i: R_xlen_t, n: R_xlen_t, buf: *mut f64) -> R_xlen_t {
    // SAFETY: called by R on one of our double views with room for `n`.
    unsafe { region(x, i, n, buf, elt_real) }
}

impl crate::altrep::Owned for State {
    fn bytes(&self) -> usize {
        self.bytes
    }
}

fn classes() -> [R_altrep_class_t; 3] {
    CLASSES.with(|c| {
        *c.get_or_init(|| {
            let pkg = c"mizu";
            // SAFETY: R's main thread; each class is registered once with static names and
            // methods matching R's signatures.
            unsafe {
                let make = [
                    R_make_altinteger_class(
                        c"mizu_lazy_int".as_ptr(),
                        pkg.as_ptr(),
                        std::ptr::null_mut(),
                    ),
                    R_make_altlogical_class(
                        c"mizu_lazy_lgl".as_ptr(),
                        pkg.as_ptr(),
                        std::ptr::null_mut(),
                    ),
                    R_make_altreal_class(
                        c"mizu_lazy_real".as_ptr(),
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
                R_set_altinteger_Get_region_method(make[0], Some(region_int));
                R_set_altlogical_Elt_method(make[1], Some(elt_int));
                R_set_altlogical_Get_region_method(make[1], Some(region_int));
                R_set_altreal_Elt_method(make[2], Some(elt_real));
                R_set_altreal_Get_region_method(make[2], Some(region_real));
                make
            }
        })
    })
}

/// A lazy view of `array` converted by `conv` (whose array type the caller checked);
/// `src` is where it came from, `copy` as in `view::account`.
pub fn make(array: ArrayRef, conv: Conv, copy: bool, src: Source) -> Result<Robj> {
    let len = array.len();
    let (values, nulls) = match conv {
        Conv::Int32 => {
            let a = array.as_primitive::<Int32Type>();
            (Values::I32(a.values().clone()), a.nulls().cloned())
        }
        Conv::Date => {
            let a = array.as_primitive::<Date32Type>();
            (Values::I32(a.values().clone()), a.nulls().cloned())
        }
        Conv::Codes => {
            let keys = array.as_dictionary::<Int32Type>().keys();
            (Values::I32(keys.values().clone()), keys.nulls().cloned())
        }
        Conv::Bool => {
            let a = array.as_boolean();
            (Values::Bits(a.values().clone()), a.nulls().cloned())
        }
        Conv::Float64 => {
            let a = array.as_primitive::<Float64Type>();
            (Values::F64(a.values().clone()), a.nulls().cloned())
        }
        Conv::Int64 => {
            let a = array.as_primitive::<Int64Type>();
            (Values::I64(a.values().clone()), a.nulls().cloned())
        }
        Conv::Micros => {
            let a = array.as_primitive::<TimestampMicrosecondType>();
            (Values::I64(a.values().clone()), a.nulls().cloned())
        }
    };
    let class = classes()[match conv.sexptype() {
        SEXPTYPE::INTSXP => 0,
        SEXPTYPE::LGLSXP => 1,
        _ => 2,
    }];
    // What R would hold for it converted (the source may be a whole data frame).
    let bytes = len
        * if conv.sexptype() == SEXPTYPE::REALSXP {
            8
        } else {
            4
        };
    let bytes = crate::altrep::account(bytes, copy, src.bytes.as_ptr());
    Ok(crate::altrep::new_view(
        class,
        State {
            conv,
            values,
            nulls,
            len,
            src,
            bytes,
        },
    ))
}

/// Whether `x` is a lazy view.
pub fn is_lazy_view(x: SEXP) -> bool {
    // SAFETY: R_altrep_inherits accepts any SEXP.
    classes()
        .iter()
        .any(|c| unsafe { R_altrep_inherits(x, *c) != Rboolean::FALSE })
}

/// Where `x` came from, when it is a lazy view not converted yet (so unmodified).
pub fn unmodified_source(x: SEXP) -> Option<Source> {
    // SAFETY: `state` and data2 are read only for our lazy views (checked).
    unsafe { (is_lazy_view(x) && R_altrep_data2(x) == R_NilValue).then(|| state(x).src.clone()) }
}

/// The Arrow array an unmodified lazy view reads (for a factor, its 0-based keys: the caller
/// adds the levels), with how its elements convert; `None` for anything else.
pub fn unmodified_array(x: SEXP) -> Option<(Conv, ArrayRef)> {
    use arrow_array::{
        BooleanArray, Date32Array, Float64Array, Int32Array, Int64Array, TimestampMicrosecondArray,
    };
    use std::sync::Arc;
    // SAFETY: `state` and data2 are read only for our lazy views (checked).
    let st = unsafe {
        if !is_lazy_view(x) || R_altrep_data2(x) != R_NilValue {
            return None;
        }
        state(x)
    };
    let nulls = st.nulls.clone();
    let a: ArrayRef = match (&st.values, st.conv) {
        (Values::Bits(b), Conv::Bool) => Arc::new(BooleanArray::new(b.clone(), nulls)),
        (Values::I32(v), Conv::Date) => Arc::new(Date32Array::new(v.clone(), nulls)),
        (Values::I32(v), Conv::Int32 | Conv::Codes) => Arc::new(Int32Array::new(v.clone(), nulls)),
        (Values::I64(v), Conv::Micros) => {
            Arc::new(TimestampMicrosecondArray::new(v.clone(), nulls))
        }
        (Values::I64(v), Conv::Int64) => Arc::new(Int64Array::new(v.clone(), nulls)),
        (Values::F64(v), Conv::Float64) => Arc::new(Float64Array::new(v.clone(), nulls)),
        _ => return None,
    };
    (a.len() == st.len).then_some((st.conv, a))
}

/// Whether `x` is a lazy view still reading the shared pages (`Some(false)` once converted).
pub fn lazy_shared(x: SEXP) -> Option<bool> {
    // SAFETY: data2 is read only for our lazy views (checked).
    is_lazy_view(x).then(|| unsafe { R_altrep_data2(x) == R_NilValue })
}
