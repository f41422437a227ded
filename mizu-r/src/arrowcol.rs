//! Out-of-band vectors as Arrow arrays: the `mizu-wire` R mapping (`docs/wire-format.md`, R
//! section), so the bytes of a large R vector in a payload are an Arrow array any Arrow reader
//! can take.
//!
//! On the way out ([`encode`]), integer, double and raw vectors lend their memory to the array
//! (one copy in all, into the payload); a validity bitmap is built for NA, whose bits stay
//! under the null so that the receiver can view the values as they are. Logical vectors
//! become bit-packed booleans, factors dictionaries of 0-based codes, `Date`s date32 and
//! `POSIXct`s timestamp[us] (both only when that is exact: a fractional day, a time with a
//! sub-microsecond part or a NaN that is not NA keeps the double as a float64, still exact
//! in R since the attributes travel in the serialization), `integer64`s int64.
//!
//! On the way in ([`view`]), an int32, float64, int64 or uint8 array whose nulls hold R's NA
//! is a plain view of the values (`view.rs`); anything else that needs converting — booleans,
//! dictionary codes, dates, timestamps, or nulls written by another Arrow writer over other
//! values — is a lazy view that converts an element when it is read (`lazyview.rs`). The R
//! attributes (class, levels, tz, names, dim) come from the serialization, not from the field
//! metadata, which is there for other readers.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, UInt8Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, DictionaryArray, Float64Array, Int32Array,
    Int64Array, StringArray, TimestampMicrosecondArray, UInt8Array,
};
use arrow_buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, TimeUnit};
use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{
    DATAPTR_RO, R_CHAR, R_LevelsSymbol, R_NaString, Rf_getAttrib, SEXP, SEXPTYPE, STRING_ELT,
    TYPEOF, XLENGTH,
};
use mizu_wire::rmeta::{CLASS, NA_INTEGER, NA_INTEGER64, TZ};
use mizu_wire::{Encoded, PrimitiveLayout, Value};

use crate::lazyview::Conv;
use crate::view::VType;

/// Owner of memory an array borrows from an R vector: nothing to free, the payload being
/// written holds the vector (`codec::Oob::vec`) for as long as the array exists.
struct Borrowed;

/// R's test for `NA_real_` (a NaN whose low word is 1954), as opposed to other NaNs.
fn is_na_real(v: f64) -> bool {
    v.is_nan() && (v.to_bits() & 0xFFFF_FFFF) == 1954
}

/// The elements of a live atomic vector as `T`s.
///
/// # Safety
/// `x` is a live vector of `n` elements of `T`'s size, protected (and unmodified) for as
/// long as the slice is used.
unsafe fn elements<'a, T>(x: SEXP, n: usize) -> &'a [T] {
    // SAFETY: as the caller promises; R aligns vector data for every element type.
    unsafe { std::slice::from_raw_parts(DATAPTR_RO(x).cast::<T>(), n) }
}

/// A buffer over `s` without copying it.
///
/// # Safety
/// `s` stays alive and unchanged as long as the buffer (and every clone of it) exists.
unsafe fn borrow<T>(s: &[T]) -> Buffer {
    let p = NonNull::new(s.as_ptr().cast::<u8>().cast_mut()).unwrap_or(NonNull::dangling());
    // SAFETY: as the caller promises; `Borrowed` frees nothing.
    unsafe { Buffer::from_custom_allocation(p, std::mem::size_of_val(s), Arc::new(Borrowed)) }
}

/// Bits of `pred` over `v`, 64 elements to a word (on the values, not through indices, so
/// the compiler can vectorize it: `collect_bool` with an indexing closure took ~1 ns an element).
fn pack<T: Copy>(v: &[T], pred: impl Fn(T) -> bool) -> BooleanBuffer {
    let word = |c: &[T]| {
        c.iter()
            .enumerate()
            .fold(0u64, |w, (j, &x)| w | (u64::from(pred(x)) << j))
    };
    let mut out = MutableBuffer::new(v.len().div_ceil(64) * 8);
    let chunks = v.chunks_exact(64);
    let rest = chunks.remainder();
    for c in chunks {
        out.push(word(c));
    }
    if !rest.is_empty() {
        out.push(word(rest));
    }
    BooleanBuffer::new(out.into(), 0, v.len())
}

/// The validity `valid` gives, or `None` when every element is valid.
fn nulls<T: Copy>(v: &[T], valid: impl Fn(T) -> bool) -> Option<NullBuffer> {
    let nb = NullBuffer::new(pack(v, valid));
    (nb.null_count() > 0).then_some(nb)
}

/// The validity of integers (`NA_integer_` is null). Most vectors have no NA: a scan the
/// compiler vectorizes finds that out at memory speed, a bitmap is built only otherwise.
fn int_nulls<T: Copy + PartialEq>(v: &[T], na: T) -> Option<NullBuffer> {
    let any = v
        .chunks(256)
        .any(|c| c.iter().fold(false, |a, &x| a | (x == na)));
    any.then(|| nulls(v, |x| x != na)).flatten()
}

/// The validity of doubles (`NA_real_` is null, other NaNs are values); as [`int_nulls`].
fn real_nulls(v: &[f64]) -> Option<NullBuffer> {
    let any = v
        .chunks(256)
        .any(|c| c.iter().fold(false, |a, &x| a | x.is_nan()));
    any.then(|| nulls(v, |x| !is_na_real(x))).flatten()
}

fn inherits(x: SEXP, class: &std::ffi::CStr) -> bool {
    // SAFETY: Rf_inherits reads the class attribute of any live SEXP.
    unsafe { crate::ffi::Rf_inherits(x, class.as_ptr()) != 0 }
}

/// A string of a character vector as UTF-8, when it is NA (None inside) or its bytes are
/// UTF-8 by R's own marks (ASCII, or marked UTF-8); else `None`.
///
/// # Safety
/// `x` is a live, non-ALTREP character vector and `i` < its length.
unsafe fn utf8_elt<'a>(x: SEXP, i: usize) -> Option<Option<&'a str>> {
    // SAFETY: as the caller promises; CHARSXP bytes live as long as the vector.
    unsafe {
        let c = STRING_ELT(x, i as isize);
        if c == R_NaString {
            return Some(None);
        }
        let b = std::ffi::CStr::from_ptr(R_CHAR(c)).to_bytes();
        if !b.is_ascii() && crate::ffi::Rf_getCharCE(c) != 1 {
            return None;
        }
        std::str::from_utf8(b).ok().map(Some)
    }
}

/// The dictionary array of a factor, when its levels are UTF-8 and its codes in range.
///
/// # Safety
/// `x` is a live integer vector of `n` elements (protected for the call).
unsafe fn factor(x: SEXP, codes: &[i32]) -> Option<(ArrayRef, Vec<(String, String)>)> {
    // SAFETY: reading the attribute and the elements of live vectors.
    unsafe {
        let lev = Rf_getAttrib(x, R_LevelsSymbol);
        if TYPEOF(lev) != SEXPTYPE::STRSXP || extendr_ffi::ALTREP(lev) != 0 {
            return None;
        }
        let nlev = XLENGTH(lev) as usize;
        let levels = (0..nlev)
            .map(|i| utf8_elt(lev, i).flatten())
            .collect::<Option<Vec<&str>>>()?;
        // Two passes the compiler vectorizes (one with the range check in it did not).
        let lim = nlev.min(i32::MAX as usize) as u32;
        let out_of_range = codes.chunks(256).any(|c| {
            c.iter().fold(false, |a, &x| {
                a | ((x != NA_INTEGER) & (x.wrapping_sub(1) as u32 >= lim))
            })
        });
        if out_of_range {
            return None;
        }
        let keys: Vec<i32> = codes
            .iter()
            .map(|&c| if c == NA_INTEGER { 0 } else { c - 1 })
            .collect();
        let keys = Int32Array::new(ScalarBuffer::from(keys), int_nulls(codes, NA_INTEGER));
        // SAFETY: every key indexes the levels (checked above; a null's key is 0 and is
        // never read, or there are levels).
        let dict =
            DictionaryArray::<Int32Type>::new_unchecked(keys, Arc::new(StringArray::from(levels)));
        let class = if inherits(x, c"ordered") {
            "ordered"
        } else {
            "factor"
        };
        Some((Arc::new(dict), vec![(CLASS.into(), class.into())]))
    }
}

/// Days as date32, when every one is a whole number of days in range (or NA).
fn dates(d: &[f64]) -> Option<ArrayRef> {
    // `as` saturates (and NaN is 0): a day that converts back to the same bits is exact.
    let days: Vec<i32> = d.iter().map(|&v| v as i32).collect();
    let inexact = d.chunks(256).zip(days.chunks(256)).any(|(v, k)| {
        v.iter().zip(k).fold(false, |a, (&v, &k)| {
            a | ((f64::from(k).to_bits() != v.to_bits()) & !is_na_real(v))
        })
    });
    (!inexact)
        .then(|| Arc::new(Date32Array::new(ScalarBuffer::from(days), real_nulls(d))) as ArrayRef)
}

/// Seconds as timestamp[us, tz], when every one is a whole number of microseconds that
/// converts back to the same double (or NA). (`Sys.time()` values usually are not: R adds
/// the microseconds as `1e-6 * us`, a different rounding.)
fn times(s: &[f64], tz: &str) -> Option<ArrayRef> {
    // Rounding half away from zero through truncation (`f64::round` is a libm call here).
    let us: Vec<i64> = s
        .iter()
        .map(|&v| {
            let m = v * 1e6;
            (m + if m < 0.0 { -0.5 } else { 0.5 }) as i64
        })
        .collect();
    let inexact = s.chunks(256).zip(us.chunks(256)).any(|(v, k)| {
        v.iter().zip(k).fold(false, |a, (&v, &k)| {
            a | (((k as f64 / 1e6).to_bits() != v.to_bits()) & !is_na_real(v))
        })
    });
    (!inexact).then(|| {
        let a = TimestampMicrosecondArray::new(ScalarBuffer::from(us), real_nulls(s));
        Arc::new(if tz.is_empty() {
            a
        } else {
            a.with_timezone(tz)
        }) as ArrayRef
    })
}

/// The `tzone` attribute of a POSIXct vector ("" when absent or not one UTF-8 string).
///
/// # Safety
/// `x` is a live SEXP.
unsafe fn tzone(x: SEXP) -> String {
    // SAFETY: reading an attribute and its first element.
    unsafe {
        let tz = Rf_getAttrib(x, extendr_ffi::Rf_install(c"tzone".as_ptr()));
        if TYPEOF(tz) != SEXPTYPE::STRSXP || XLENGTH(tz) < 1 || extendr_ffi::ALTREP(tz) != 0 {
            return String::new();
        }
        utf8_elt(tz, 0).flatten().unwrap_or("").to_owned()
    }
}

/// How an out-of-band vector is written into a payload: its Arrow encoding, and for integer
/// and double vectors the place of the validity bitmap that [`Column::write`] makes while it
/// copies the values (a separate pass to find R's NAs cost as much as the copy itself).
pub struct Column {
    enc: Encoded,
    fused: Option<Fused>,
}

/// Where a fused write goes (see [`Column`]).
struct Fused {
    layout: PrimitiveLayout,
    /// The vector's elements (the payload being written holds the vector).
    values: *const u8,
    /// The all-zero bitmap the encoding was made with (not copied: rewritten).
    placeholder: *const u8,
    n: usize,
    kind: Na,
}

/// Which elements are R's NA.
#[derive(Clone, Copy)]
enum Na {
    Int,
    Real,
    Int64,
}

impl Column {
    /// Bytes it takes in the payload.
    pub fn len(&self) -> usize {
        self.enc.len()
    }

    /// Writes the encoded value into `out` (exactly [`Column::len`] bytes).
    pub fn write(&self, out: &mut [u8]) {
        let Some(f) = &self.fused else {
            self.enc.write_to(out);
            return;
        };
        self.enc.write_to_except(out, &[f.values, f.placeholder]);
        let (head, tail) = out.split_at_mut(f.layout.values.start);
        let bits = &mut head[f.layout.validity.clone()];
        let dst = &mut tail[..f.layout.values.len()];
        // SAFETY: `values` points to the `n` elements of the vector this column was made
        // from, which the payload holds unmodified (see `encode`).
        let nulls = unsafe {
            match f.kind {
                Na::Int => copy_marking(
                    std::slice::from_raw_parts(f.values.cast::<i32>(), f.n),
                    dst,
                    bits,
                    |x| x == NA_INTEGER,
                    |x| x != NA_INTEGER,
                ),
                Na::Int64 => copy_marking(
                    std::slice::from_raw_parts(f.values.cast::<i64>(), f.n),
                    dst,
                    bits,
                    |x| x == NA_INTEGER64,
                    |x| x != NA_INTEGER64,
                ),
                Na::Real => copy_marking(
                    std::slice::from_raw_parts(f.values.cast::<f64>(), f.n),
                    dst,
                    bits,
                    f64::is_nan,
                    |x| !is_na_real(x),
                ),
            }
        };
        let at = f.layout.null_count_at;
        out[at..at + 8].copy_from_slice(&(nulls as i64).to_le_bytes());
    }
}

/// Copies `src` into `dst` 64 elements at a time, setting bit `i` of `bits` when element `i`
/// is `valid` meanwhile (the chunk is in cache); the number of elements not valid.
/// `maybe_na` is a cheaper test that holds for every element that is not valid: a chunk with
/// none (the usual case) takes one vectorized pass.
fn copy_marking<T: Copy>(
    src: &[T],
    dst: &mut [u8],
    bits: &mut [u8],
    maybe_na: impl Fn(T) -> bool,
    valid: impl Fn(T) -> bool,
) -> usize {
    let size = std::mem::size_of::<T>();
    let mut nulls = 0;
    for (k, c) in src.chunks(64).enumerate() {
        // SAFETY: the chunk's elements are plain data.
        let bytes = unsafe {
            std::slice::from_raw_parts(c.as_ptr().cast::<u8>(), std::mem::size_of_val(c))
        };
        let at = k * 64 * size;
        dst[at..at + bytes.len()].copy_from_slice(bytes);
        let w = if c.iter().fold(false, |a, &x| a | maybe_na(x)) {
            let w = c
                .iter()
                .enumerate()
                .fold(0u64, |w, (j, &x)| w | (u64::from(valid(x)) << j));
            nulls += c.len() - w.count_ones() as usize;
            w
        } else {
            u64::MAX >> (64 - c.len())
        };
        let b = k * 8;
        let m = bits.len().saturating_sub(b).min(8);
        bits[b..b + m].copy_from_slice(&w.to_le_bytes()[..m]);
    }
    nulls
}

/// A validity bitmap to encode with, whose bits and count [`Column::write`] replaces: it
/// claims one null so that the IPC writer lays a bitmap out.
fn placeholder_nulls(n: usize) -> (NullBuffer, *const u8) {
    let b: Buffer = MutableBuffer::from_len_zeroed(n.div_ceil(8)).into();
    let p = b.as_ptr();
    // SAFETY: the count is wrong on purpose and only the IPC writer reads it (it writes it
    // into the field node, where `Column::write` puts the real one); the array is dropped
    // after encoding.
    (
        unsafe { NullBuffer::new_unchecked(BooleanBuffer::new(b, 0, n), 1) },
        p,
    )
}

fn encode_array(array: ArrayRef, meta: Vec<(String, String)>) -> Result<Encoded> {
    let field = Field::new("", array.data_type().clone(), true)
        .with_metadata(meta.into_iter().collect::<HashMap<_, _>>());
    mizu_wire::encode(&Value::Array {
        field: Arc::new(field),
        array,
    })
    .map_err(|e| crate::rerr(format!("cannot encode a vector as Arrow: {e}")))
}

/// A plain integer, integer64 or double vector: the values borrowed, the bitmap made while
/// they are written (or, should the encoding not have the expected layout, found now).
fn fused<T: Copy + arrow_buffer::ArrowNativeType>(
    v: &[T],
    kind: Na,
    make: impl Fn(ScalarBuffer<T>, Option<NullBuffer>) -> ArrayRef,
    meta: Vec<(String, String)>,
    nulls: impl Fn(&[T]) -> Option<NullBuffer>,
) -> Result<Column> {
    let n = v.len();
    // SAFETY: (of `borrow`) the caller of `encode` keeps the vector alive and unmodified.
    let values = || ScalarBuffer::new(unsafe { borrow(v) }, 0, n);
    let (placeholder, p) = placeholder_nulls(n);
    let enc = encode_array(make(values(), Some(placeholder)), meta.clone())?;
    match enc.primitive_layout() {
        Some(layout) if layout.values.len() == std::mem::size_of_val(v) => Ok(Column {
            enc,
            fused: Some(Fused {
                layout,
                values: v.as_ptr().cast(),
                placeholder: p,
                n,
                kind,
            }),
        }),
        _ => Ok(Column {
            enc: encode_array(make(values(), nulls(v)), meta)?,
            fused: None,
        }),
    }
}

/// The Arrow encoding of an out-of-band vector, or `None` for one that keeps R's layout
/// (complex and character vectors). Integer, double and raw arrays borrow the vector's
/// memory.
///
/// # Safety
/// `x` is a live atomic vector, protected and unmodified for as long as the result exists.
pub unsafe fn encode(x: SEXP) -> Option<Result<Column>> {
    let plain = |a: ArrayRef, meta| encode_array(a, meta).map(|enc| Column { enc, fused: None });
    // SAFETY: `x` is live; `elements` covers exactly its XLENGTH elements of its type, and
    // the borrowed buffers live no longer than the caller keeps `x` (see `Borrowed`).
    unsafe {
        let n = XLENGTH(x) as usize;
        Some(match VType::of(TYPEOF(x))? {
            VType::Int => {
                let v: &[i32] = elements(x, n);
                match inherits(x, c"factor").then(|| factor(x, v)).flatten() {
                    Some((a, meta)) => plain(a, meta),
                    None => fused(
                        v,
                        Na::Int,
                        |b, nb| Arc::new(Int32Array::new(b, nb)),
                        Vec::new(),
                        |v| int_nulls(v, NA_INTEGER),
                    ),
                }
            }
            VType::Lgl => {
                let v: &[i32] = elements(x, n);
                let values = pack(v, |x| x != 0 && x != NA_INTEGER);
                plain(
                    Arc::new(BooleanArray::new(values, int_nulls(v, NA_INTEGER))),
                    Vec::new(),
                )
            }
            VType::Real => {
                let v: &[f64] = elements(x, n);
                if inherits(x, c"integer64") {
                    let w: &[i64] = elements(x, n);
                    return Some(fused(
                        w,
                        Na::Int64,
                        |b, nb| Arc::new(Int64Array::new(b, nb)),
                        vec![(CLASS.to_owned(), "integer64".to_owned())],
                        |w| int_nulls(w, NA_INTEGER64),
                    ));
                }
                let special = if inherits(x, c"Date") {
                    dates(v).map(|a| (a, Vec::new()))
                } else if inherits(x, c"POSIXct") {
                    let tz = tzone(x);
                    times(v, &tz).map(|a| (a, vec![(TZ.to_owned(), tz)]))
                } else {
                    None
                };
                match special {
                    Some((a, meta)) => plain(a, meta),
                    None => fused(
                        v,
                        Na::Real,
                        |b, nb| Arc::new(Float64Array::new(b, nb)),
                        Vec::new(),
                        real_nulls,
                    ),
                }
            }
            VType::Raw => {
                let v: &[u8] = elements(x, n);
                plain(
                    Arc::new(UInt8Array::new(ScalarBuffer::new(borrow(v), 0, n), None)),
                    Vec::new(),
                )
            }
            VType::Cplx | VType::Str => return None,
        })
    }
}

fn bad(why: impl std::fmt::Display) -> extendr_api::Error {
    crate::rerr(format!("malformed payload: Arrow vector: {why}"))
}

/// Whether every null of `a` holds a value `ok` accepts (R's NA, so the values can be
/// viewed as they are).
fn nulls_hold(nulls: Option<&NullBuffer>, ok: impl Fn(usize) -> bool) -> bool {
    match nulls {
        None => true,
        Some(n) if n.null_count() == 0 => true,
        Some(n) => (!n.inner()).set_indices().all(ok),
    }
}

/// The R vector for an out-of-band Arrow value (`src`, the encoded value as it sits in the
/// payload: kept by the vector to be re-sent by reference). `copy` as in `view::account`.
pub fn view(src: Buffer, copy: bool) -> Result<Robj> {
    // Arrow data is read in place only at 64-byte alignment (a payload copied out of a ring
    // slot may not be).
    let src = if (src.as_ptr() as usize).is_multiple_of(64) {
        src
    } else {
        let mut m = MutableBuffer::with_capacity(src.len());
        m.extend_from_slice(src.as_slice());
        m.into()
    };
    let Value::Array { array, .. } = mizu_wire::decode(&src).map_err(bad)? else {
        return Err(bad("not an array"));
    };
    let plain =
        |values: &Buffer, t: VType| crate::view::make_sourced(values.clone(), t, copy, src.clone());
    let lazy = |conv: Conv| crate::lazyview::make(array.clone(), conv, copy, src.clone());
    match array.data_type() {
        DataType::Int32 => {
            let a = array.as_primitive::<Int32Type>();
            let v = a.values();
            if nulls_hold(a.nulls(), |i| v[i] == NA_INTEGER) {
                plain(v.inner(), VType::Int)
            } else {
                lazy(Conv::Int32)
            }
        }
        DataType::Float64 => {
            let a = array.as_primitive::<Float64Type>();
            let v = a.values();
            if nulls_hold(a.nulls(), |i| is_na_real(v[i])) {
                plain(v.inner(), VType::Real)
            } else {
                lazy(Conv::Float64)
            }
        }
        DataType::Int64 => {
            let a = array.as_primitive::<Int64Type>();
            let v = a.values();
            if nulls_hold(a.nulls(), |i| v[i] == NA_INTEGER64) {
                plain(v.inner(), VType::Real)
            } else {
                lazy(Conv::Int64)
            }
        }
        DataType::UInt8 => {
            let a = array.as_primitive::<UInt8Type>();
            if a.null_count() > 0 {
                return Err(bad("a raw vector has no NA"));
            }
            plain(a.values().inner(), VType::Raw)
        }
        DataType::Boolean => lazy(Conv::Bool),
        DataType::Date32 => lazy(Conv::Date),
        DataType::Timestamp(TimeUnit::Microsecond, _) => lazy(Conv::Micros),
        DataType::Dictionary(k, _) if **k == DataType::Int32 => lazy(Conv::Codes),
        t => Err(bad(format!("{t} has no R mapping"))),
    }
}
