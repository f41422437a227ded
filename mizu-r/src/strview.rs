//! Character vectors out of band: their strings laid out in the payload (offsets, encodings,
//! bytes), received as an ALTREP character vector over the shared region that makes each
//! element's R string only when it is first read (and keeps it). Modifying one, or asking for
//! all its elements at once, completes a private copy that the view uses from then on.
//!
//! Layout (little-endian): `u64` count `n`; `n + 1` `u64` offsets into the bytes (from 0,
//! non-decreasing); `n` kind bytes (0 NA; 1 native, 2 UTF-8, 3 Latin-1, 4 bytes encoding);
//! zero padding to a multiple of 8; the bytes. A decoder checks all of it (and that no string
//! holds a NUL) before any element is made.

use std::cell::{Cell, OnceCell, RefCell};
use std::ffi::{c_char, c_int, c_void};

use arrow_buffer::Buffer;
use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{
    DATAPTR, LENGTH, R_CHAR, R_ExternalPtrAddr, R_NaString, R_NilValue, R_altrep_class_t,
    R_altrep_data1, R_altrep_data2, R_make_altstring_class, R_set_altrep_Duplicate_method,
    R_set_altrep_Length_method, R_set_altrep_data2, R_set_altstring_Elt_method,
    R_set_altstring_Set_elt_method, R_set_altvec_Dataptr_method,
    R_set_altvec_Dataptr_or_null_method, R_xlen_t, Rboolean, Rf_allocVector, Rf_mkCharLenCE,
    Rf_protect, Rf_unprotect, SET_STRING_ELT, SEXP, SEXPTYPE, STRING_ELT, XLENGTH, cetype_t,
};

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, GenericStringArray, LargeStringArray, OffsetSizeTrait, StringArray,
};

use crate::altrep::Shared;
use crate::altrep::Source;
use crate::ffi;

/// Whether `x` can be laid out without running code: a plain character vector, or one of our
/// views (an unmodified one is copied as it came; a completed one reads its private copy).
pub fn can_lay_out(x: SEXP) -> bool {
    // SAFETY: ALTREP reads any SEXP.
    let plain = unsafe { extendr_ffi::ALTREP(x) == 0 };
    plain || string_view(x).is_some()
}

/// Bytes the layout of `x` takes.
///
/// # Safety
/// `x` is a live character vector for which [`can_lay_out`] holds.
pub unsafe fn encoded_len(x: SEXP) -> usize {
    if string_view(x) == Some(false) && unmodified_array(x).is_none() {
        // SAFETY: one of our views (checked).
        return unsafe { state(x) }.buf.len();
    }
    // SAFETY: reads of a live vector's CHARSXPs (no allocation: not ALTREP, or a completed
    // view whose elements are all in its private copy).
    unsafe {
        let n = XLENGTH(x) as usize;
        let bytes: usize = (0..n)
            .map(|i| {
                let c = STRING_ELT(x, i as R_xlen_t);
                if c == R_NaString {
                    0
                } else {
                    LENGTH(c) as usize
                }
            })
            .sum();
        8 + 8 * (n + 1) + n.next_multiple_of(8) + bytes
    }
}

/// Writes the layout of `x` into `out` (exactly `encoded_len(x)` bytes).
///
/// # Safety
/// As [`encoded_len`]; `x` unchanged since.
pub unsafe fn fill(x: SEXP, out: &mut [u8]) {
    if string_view(x) == Some(false) && unmodified_array(x).is_none() {
        // SAFETY: one of our views (checked); its layout was checked when it arrived.
        out.copy_from_slice(unsafe { state(x) }.buf.as_slice());
        return;
    }
    // SAFETY: as above.
    unsafe {
        let n = XLENGTH(x) as usize;
        out[..8].copy_from_slice(&(n as u64).to_le_bytes());
        let kinds_at = 8 + 8 * (n + 1);
        let bytes_at = kinds_at + n.next_multiple_of(8);
        out[kinds_at..bytes_at].fill(0);
        let mut off = 0usize;
        out[8..16].copy_from_slice(&0u64.to_le_bytes());
        for i in 0..n {
            let c = STRING_ELT(x, i as R_xlen_t);
            let kind = if c == R_NaString {
                0
            } else {
                let len = LENGTH(c) as usize;
                let src = std::slice::from_raw_parts(R_CHAR(c).cast::<u8>(), len);
                out[bytes_at + off..bytes_at + off + len].copy_from_slice(src);
                off += len;
                match ffi::Rf_getCharCE(c) {
                    1 => 2,
                    2 => 3,
                    3 => 4,
                    _ => 1,
                }
            };
            out[kinds_at + i] = kind;
            let e = 8 + 8 * (i + 1);
            out[e..e + 8].copy_from_slice(&(off as u64).to_le_bytes());
        }
    }
}

/// What a string view's external pointer owns.
struct State {
    /// The layout's bytes; for an Arrow array, the bytes of its values.
    buf: Buffer,
    n: usize,
    backing: Backing,
    /// Elements already made (in `data2`), one bit each (allocated when the first one is: a
    /// view relayed without being read costs nothing per element); all once `complete`.
    made: RefCell<Vec<u64>>,
    complete: Cell<bool>,
    /// Bytes counted for it (`view::account`).
    counted: usize,
}

/// Where the strings are.
enum Backing {
    /// This module's layout.
    Layout { kinds_at: usize, bytes_at: usize },
    /// An Arrow utf8 or large_utf8 array (see `arrow_in.rs`), and where it came from.
    Arrow(Strings, Source),
}

/// An Arrow string array of either offset width, read in place.
enum Strings {
    Utf8(StringArray),
    Large(LargeStringArray),
}

impl Strings {
    /// Element `i`'s bytes: `None` for a null, or for offsets (read from shared memory now)
    /// that do not lie in order inside the values.
    fn get(&self, i: usize) -> Option<&[u8]> {
        fn at<O: OffsetSizeTrait>(a: &GenericStringArray<O>, i: usize) -> Option<&[u8]> {
            if a.is_null(i) {
                return None;
            }
            let offsets = a.value_offsets();
            let (start, end) = (offsets.get(i)?.as_usize(), offsets.get(i + 1)?.as_usize());
            a.values().as_slice().get(start..end)
        }
        match self {
            Strings::Utf8(a) => at(a, i),
            Strings::Large(a) => at(a, i),
        }
    }

    fn array(&self) -> ArrayRef {
        match self {
            Strings::Utf8(a) => std::sync::Arc::new(a.clone()),
            Strings::Large(a) => std::sync::Arc::new(a.clone()),
        }
    }
}

impl State {
    /// Whether element `i` was made.
    fn is_made(&self, i: usize) -> bool {
        self.made
            .borrow()
            .get(i / 64)
            .is_some_and(|w| (w >> (i % 64)) & 1 == 1)
    }

    /// Records that element `i` was made.
    fn mark_made(&self, i: usize) {
        let mut m = self.made.borrow_mut();
        if m.is_empty() {
            m.resize(self.n.div_ceil(64), 0);
        }
        m[i / 64] |= 1 << (i % 64);
    }

    /// Offset `i` of this module's layout, as the shared bytes hold it now (0 where they
    /// could not hold one).
    fn offset(&self, i: usize) -> usize {
        let e = 8 + 8 * i;
        self.buf.as_slice().get(e..e + 8).map_or(0, |w| {
            u64::from_le_bytes(w.try_into().expect("8 bytes")) as usize
        })
    }
}

fn bad(why: impl std::fmt::Display) -> extendr_api::Error {
    crate::rerr(format!("malformed payload: character vector: {why}"))
}

fn check(buf: &Buffer) -> Result<(usize, usize, usize)> {
    let b = buf.as_slice();
    let word = |at: usize| -> Result<u64> {
        b.get(at..at + 8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .ok_or_else(|| bad("truncated"))
    };
    let n = usize::try_from(word(0)?).map_err(|_| bad("count"))?;
    let kinds_at = n
        .checked_add(1)
        .and_then(|k| k.checked_mul(8))
        .and_then(|k| k.checked_add(8))
        .filter(|&k| k <= b.len())
        .ok_or_else(|| bad("count does not fit"))?;
    let bytes_at = kinds_at
        .checked_add(n.next_multiple_of(8))
        .filter(|&k| k <= b.len())
        .ok_or_else(|| bad("count does not fit"))?;
    let total = b.len() - bytes_at;
    let mut prev = 0u64;
    if word(8)? != 0 {
        return Err(bad("first offset"));
    }
    for i in 0..n {
        let next = word(8 + 8 * (i + 1))?;
        if next < prev || next > total as u64 {
            return Err(bad(format!("offset {i}")));
        }
        let kind = b[kinds_at + i];
        if kind > 4 || (kind == 0 && next != prev) {
            return Err(bad(format!("element {i} kind {kind}")));
        }
        if c_int::try_from(next - prev).is_err() {
            return Err(bad("a string longer than R allows"));
        }
        prev = next;
    }
    if b[bytes_at..bytes_at + prev as usize].contains(&0) {
        return Err(bad("a string holds a NUL byte"));
    }
    Ok((n, kinds_at, bytes_at))
}

thread_local! {
    static CLASS: OnceCell<R_altrep_class_t> = const { OnceCell::new() };
}

/// # Safety
/// `x` is one of our string views.
unsafe fn state<'a>(x: SEXP) -> &'a State {
    // SAFETY: data1 of our string views is an external pointer to a live `State`.
    unsafe { &*R_ExternalPtrAddr(R_altrep_data1(x)).cast::<State>() }
}

/// Element `i` as an R string (made from the shared bytes; may allocate).
///
/// The bytes are shared memory, checked when the view was made; another process could
/// still change them since. So what is read now is checked again before R reads a byte of it
/// — offsets in bounds and in order, a length R allows, no NUL (R would raise an error
/// through Rust frames) — and an element that fails is `NA`.
///
/// # Safety
/// As [`state`]; `i < n`.
unsafe fn make_elt(st: &State, i: usize) -> SEXP {
    let (bytes, ce) = match &st.backing {
        Backing::Layout { kinds_at, bytes_at } => {
            let b = st.buf.as_slice();
            let kind = b.get(kinds_at + i).copied().unwrap_or(0);
            let ce = match kind {
                2 => cetype_t::CE_UTF8,
                3 => cetype_t::CE_LATIN1,
                4 => cetype_t::CE_BYTES,
                _ => cetype_t::CE_NATIVE,
            };
            let range = (st.offset(i), st.offset(i + 1));
            let bytes = (kind != 0).then(|| within(b, *bytes_at, range)).flatten();
            (bytes, ce)
        }
        Backing::Arrow(a, _) => (a.get(i), cetype_t::CE_UTF8),
    };
    let Some(v) = bytes.filter(|v| c_int::try_from(v.len()).is_ok() && !v.contains(&0)) else {
        // SAFETY: R's NA string, a constant of the running R.
        return unsafe { R_NaString };
    };
    // SAFETY: `v` is `v.len()` readable bytes (checked just now), no NUL, a length R allows.
    unsafe { Rf_mkCharLenCE(v.as_ptr().cast::<c_char>(), v.len() as c_int, ce) }
}

/// The bytes `start..end` of the strings area at `base` of `b`, if they lie inside it.
fn within(b: &[u8], base: usize, (start, end): (usize, usize)) -> Option<&[u8]> {
    let strings = b.get(base..)?;
    strings.get(start..end)
}

/// The private vector of made elements (allocated on first use).
///
/// # Safety
/// As [`state`].
unsafe fn cache(x: SEXP, st: &State) -> SEXP {
    // SAFETY: data2 is nil or our STRSXP of length n.
    unsafe {
        let d2 = R_altrep_data2(x);
        if d2 != R_NilValue {
            return d2;
        }
        let v = Rf_allocVector(SEXPTYPE::STRSXP, st.n as R_xlen_t);
        R_set_altrep_data2(x, v);
        v
    }
}

/// Makes every element not made yet.
///
/// # Safety
/// As [`state`].
unsafe fn complete(x: SEXP) -> SEXP {
    // SAFETY: as above; `d2` is reachable from `x` (protected by R for the method call).
    unsafe {
        let st = state(x);
        let d2 = cache(x, st);
        if !st.complete.get() {
            for i in 0..st.n {
                let done = st.is_made(i);
                if !done {
                    SET_STRING_ELT(d2, i as R_xlen_t, make_elt(st, i));
                }
            }
            st.complete.set(true);
        }
        d2
    }
}

unsafe extern "C" fn length(x: SEXP) -> R_xlen_t {
    // SAFETY: called by R on one of our string views.
    unsafe { state(x).n as R_xlen_t }
}

unsafe extern "C" fn elt(x: SEXP, i: R_xlen_t) -> SEXP {
    // SAFETY: called by R on one of our views with 0 <= i < length.
    unsafe {
        let st = state(x);
        let i = i as usize;
        let d2 = cache(x, st);
        if st.complete.get() || st.is_made(i) {
            return STRING_ELT(d2, i as R_xlen_t);
        }
        let c = Rf_protect(make_elt(st, i));
        SET_STRING_ELT(d2, i as R_xlen_t, c);
        st.mark_made(i);
        Rf_unprotect(1);
        c
    }
}

unsafe extern "C" fn set_elt(x: SEXP, i: R_xlen_t, v: SEXP) {
    // SAFETY: called by R on one of our views with a valid index and CHARSXP.
    unsafe {
        let d2 = complete(x);
        SET_STRING_ELT(d2, i, v);
    }
}

unsafe extern "C" fn dataptr(x: SEXP, _writeable: Rboolean) -> *mut c_void {
    // SAFETY: called by R on one of our views.
    unsafe { DATAPTR(complete(x)) }
}

unsafe extern "C" fn dataptr_or_null(x: SEXP) -> *const c_void {
    // SAFETY: called by R on one of our views.
    unsafe {
        if state(x).complete.get() {
            DATAPTR(R_altrep_data2(x)).cast_const()
        } else {
            std::ptr::null()
        }
    }
}

unsafe extern "C" fn duplicate(x: SEXP, _deep: Rboolean) -> SEXP {
    // SAFETY: called by R on one of our views; the copy is a fresh vector of the elements.
    unsafe {
        let d2 = complete(x);
        let n = state(x).n;
        let v = Rf_protect(Rf_allocVector(SEXPTYPE::STRSXP, n as R_xlen_t));
        for i in 0..n {
            SET_STRING_ELT(v, i as R_xlen_t, STRING_ELT(d2, i as R_xlen_t));
        }
        Rf_unprotect(1);
        v
    }
}

impl crate::altrep::Owned for State {
    fn bytes(&self) -> usize {
        self.counted
    }
}

fn class() -> R_altrep_class_t {
    CLASS.with(|c| {
        *c.get_or_init(|| {
            // SAFETY: R's main thread; registered once with methods matching R's signatures.
            unsafe {
                let c = R_make_altstring_class(
                    c"mizu_view_str".as_ptr(),
                    c"mizu".as_ptr(),
                    std::ptr::null_mut(),
                );
                R_set_altrep_Length_method(c, Some(length));
                R_set_altrep_Duplicate_method(c, Some(duplicate));
                R_set_altvec_Dataptr_method(c, Some(dataptr));
                R_set_altvec_Dataptr_or_null_method(c, Some(dataptr_or_null));
                R_set_altstring_Elt_method(c, Some(elt));
                R_set_altstring_Set_elt_method(c, Some(set_elt));
                c
            }
        })
    })
}

/// A character vector over `buf` (checked first; `copy` as in `view::account`).
pub fn make(buf: Buffer, copy: bool) -> Result<Robj> {
    let (n, kinds_at, bytes_at) = check(&buf)?;
    new_view(buf, n, Backing::Layout { kinds_at, bytes_at }, copy)
}

/// A character vector over an Arrow utf8 or large_utf8 array (which came in `src`), its
/// offsets read as they are; refused when a string holds a NUL byte (R's strings cannot) or
/// is longer than R's strings can be.
pub fn make_arrow<O: OffsetSizeTrait>(
    a: GenericStringArray<O>,
    src: Source,
    copy: bool,
) -> Result<Robj> {
    let offsets = a.value_offsets();
    let (first, last) = (offsets[0].as_usize(), offsets[a.len()].as_usize());
    // (Only when all of them together could: each is shorter than all.)
    if last - first > i32::MAX as usize
        && offsets
            .windows(2)
            .any(|w| (w[1] - w[0]).as_usize() > i32::MAX as usize)
    {
        return Err(bad("a string of 2 GiB or more"));
    }
    let bytes = a.values().slice_with_length(first, last - first);
    // (Once per received array: received again by reference, it is the same bytes.)
    if !mizu_pool::wire::passed_before(&bytes, NO_NUL) {
        if bytes.as_slice().contains(&0) {
            return Err(bad("a string holds a NUL byte"));
        }
        mizu_pool::wire::passed_check(&bytes, NO_NUL);
    }
    let n = a.len();
    let a: ArrayRef = std::sync::Arc::new(a);
    let strings = match a.as_string_opt::<i32>() {
        Some(s) => Strings::Utf8(s.clone()),
        None => Strings::Large(a.as_string::<i64>().clone()),
    };
    new_view(bytes, n, Backing::Arrow(strings, src), copy)
}

/// The check that no string of an array's bytes holds a NUL.
const NO_NUL: &str = "mizu-r: no NUL";

fn new_view(buf: Buffer, n: usize, backing: Backing, copy: bool) -> Result<Robj> {
    let counted = crate::altrep::account(buf.len(), copy, buf.as_ptr());
    Ok(crate::altrep::new_view(
        class(),
        State {
            buf,
            n,
            backing,
            made: RefCell::new(Vec::new()),
            complete: Cell::new(false),
            counted,
        },
    ))
}

/// What `x` shares when it is one of our string views and was not modified.
pub fn shared(x: SEXP) -> Option<Shared> {
    if string_view(x) != Some(false) {
        return None;
    }
    // SAFETY: one of our string views (checked).
    let st = unsafe { state(x) };
    Some(match &st.backing {
        Backing::Layout { .. } => Shared::Elements(st.buf.clone()),
        Backing::Arrow(_, src) => Shared::Arrow(src.clone()),
    })
}

/// The Arrow array of `x` when it is one of our string views over one and was not modified.
pub fn unmodified_array(x: SEXP) -> Option<ArrayRef> {
    if string_view(x) != Some(false) {
        return None;
    }
    // SAFETY: one of our string views (checked).
    match &unsafe { state(x) }.backing {
        Backing::Arrow(a, _) => Some(a.array()),
        Backing::Layout { .. } => None,
    }
}

/// Whether `x` is a string view, and whether all of its elements were made (copied).
pub fn string_view(x: SEXP) -> Option<bool> {
    // SAFETY: R_altrep_inherits accepts any SEXP; `state` only for our views.
    unsafe {
        (extendr_ffi::R_altrep_inherits(x, class()) != Rboolean::FALSE)
            .then(|| state(x).complete.get())
    }
}
