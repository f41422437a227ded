//! R vectors and data frames out as Arrow: the `mizu-wire` R mapping (`docs/wire-format.md`,
//! R section), so the bytes of a large R vector or data frame in a payload are an Arrow array
//! or record batch any Arrow reader can take.
//!
//! Integer, double and raw vectors lend their memory to the array (one copy in all, into the
//! payload). R's NA becomes a null whose bits stay under it, so that an R receiver views the
//! values as they are; for integers and doubles the validity bitmap is made while the values
//! are copied into the payload ([`ArrowOut::write`]): a pass of its own to find the NAs cost
//! as much as the copy. Logical vectors become bit-packed booleans, factors dictionaries of
//! 0-based codes, `Date`s date32 and `POSIXct`s timestamp[us] (both only when that is exact:
//! a fractional day, a time with a sub-microsecond part or a NaN that is not NA keeps the
//! double as a float64, still exact in R since the attributes travel in the serialization),
//! `integer64`s int64. A data frame whose columns all map becomes one record batch (one
//! schema and one message for all of them: per-column streams cost ~15 µs each way).

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, DictionaryArray, Float64Array, Int32Array,
    Int64Array, StringArray, TimestampMicrosecondArray, UInt8Array,
};
use arrow_buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer, ScalarBuffer};
use arrow_schema::Field;
use arrow_schema::Schema;
use extendr_api::Result;
use extendr_ffi::{
    DATAPTR_RO, LENGTH, R_CHAR, R_LevelsSymbol, R_NaString, Rf_getAttrib, SEXP, SEXPTYPE,
    STRING_ELT, TYPEOF, XLENGTH,
};
use mizu_pool::wire::rmeta::{CLASS, NA_INTEGER, NA_INTEGER64, TZ};
use mizu_pool::wire::{Encoded, PrimitiveLayout, Value};

use crate::view::VType;

/// Owner of memory an array borrows from an R vector: nothing to free, the payload being
/// written holds the vector (`codec::Oob::vec`) for as long as the array exists.
struct Borrowed;

use crate::ntcopy::is_na_real;

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

/// [`int_nulls`] of R integers.
fn r_int_nulls(v: &[i32]) -> Option<NullBuffer> {
    crate::kernels::any_na_int(v)
        .then(|| nulls(v, |x| x != NA_INTEGER))
        .flatten()
}

/// The validity of doubles (`NA_real_` is null, other NaNs are values); as [`int_nulls`].
fn real_nulls(v: &[f64]) -> Option<NullBuffer> {
    crate::kernels::any_nan(v)
        .then(|| nulls(v, |x| !is_na_real(x)))
        .flatten()
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

/// The dictionary array of a factor, when its levels are UTF-8 and its codes in range: its
/// keys (codes − 1) are written with the validity bitmap straight into the payload (see
/// [`ArrowOut`]; the array is made with zero placeholders).
///
/// # Safety
/// `x` is a live integer vector whose elements are `codes`, protected and unmodified while
/// the column exists.
unsafe fn factor(x: SEXP, codes: &[i32]) -> Option<Col> {
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
        // A reduction the compiler vectorizes.
        let lim = nlev.min(i32::MAX as usize) as u32;
        let out_of_range = codes.iter().fold(false, |a, &x| {
            a | ((x != NA_INTEGER) & (x.wrapping_sub(1) as u32 >= lim))
        });
        if out_of_range {
            return None;
        }
        let n = codes.len();
        let keys = zeros(n * 4);
        let encoded = keys.as_ptr();
        let (placeholder, p) = placeholder_nulls(n);
        let keys = Int32Array::new(ScalarBuffer::new(keys, 0, n), Some(placeholder));
        // SAFETY: every key of the placeholder is 0 and there are levels, or every key is
        // under a null (0 levels: the codes are all NA, checked above); the real keys are
        // all in range (checked above).
        let dict =
            DictionaryArray::<Int32Type>::new_unchecked(keys, Arc::new(StringArray::from(levels)));
        let class = if inherits(x, c"ordered") {
            "ordered"
        } else {
            "factor"
        };
        Some(Col {
            array: Arc::new(dict),
            meta: vec![(CLASS.into(), class.into())],
            fuse: Some(FuseSrc {
                values: codes.as_ptr().cast(),
                encoded,
                placeholder: p,
                n,
                kind: Na::Codes,
            }),
        })
    }
}

/// A character vector as an Arrow utf8 array, when every string is NA, ASCII or marked
/// UTF-8 (and is UTF-8): others (native non-ASCII, Latin-1, bytes) keep R's layout
/// (`strview.rs`), which keeps their encodings. A string view that came as an array and was
/// not modified gives its array back.
///
/// # Safety
/// `x` is a live character vector, protected and unmodified while the result exists.
unsafe fn strings(x: SEXP) -> Option<ArrayRef> {
    if let Some(a) = crate::strview::unmodified_array(x) {
        return Some(a);
    }
    // SAFETY: reading a live vector; its CHARSXPs are read without allocating (a plain
    // vector, or one of our views whose strings are all made).
    unsafe {
        if extendr_ffi::ALTREP(x) != 0 && crate::strview::string_view(x) != Some(true) {
            return None;
        }
        let n = XLENGTH(x) as usize;
        let elts = std::slice::from_raw_parts(extendr_ffi::STRING_PTR_RO(x), n);
        // One pass, two calls into R per string (and the encoding only for non-ASCII).
        let mut values = MutableBuffer::with_capacity(n * 8);
        let mut offsets: Vec<i32> = Vec::with_capacity(n + 1);
        offsets.push(0);
        let mut missing = Vec::new();
        for (i, &c) in elts.iter().enumerate() {
            if c == R_NaString {
                missing.push(i);
            } else {
                let b = std::slice::from_raw_parts(R_CHAR(c).cast::<u8>(), LENGTH(c) as usize);
                let utf8 = b.is_ascii()
                    || (crate::ffi::Rf_getCharCE(c) == 1 && std::str::from_utf8(b).is_ok());
                if !utf8 {
                    return None;
                }
                values.extend_from_slice(b);
            }
            offsets.push(i32::try_from(values.len()).ok()?);
        }
        let nulls = (!missing.is_empty()).then(|| {
            let mut valid = arrow_buffer::BooleanBufferBuilder::new(n);
            valid.append_n(n, true);
            for &i in &missing {
                valid.set_bit(i, false);
            }
            NullBuffer::new(valid.finish())
        });
        // SAFETY: the offsets start at 0 and never decrease, end at the values' length, and
        // every string between two of them is UTF-8 (checked above).
        Some(Arc::new(StringArray::new_unchecked(
            arrow_buffer::OffsetBuffer::new_unchecked(offsets.into()),
            values.into(),
            nulls,
        )))
    }
}

/// Days as date32, when every one is a whole number of days in range (or NA).
fn dates(d: &[f64]) -> Option<ArrayRef> {
    let mut days = vec![0i32; d.len()];
    // A vector that does not convert usually fails on its first elements: try those alone.
    let k = d.len().min(256);
    let exact = crate::kernels::days(&d[..k], &mut days[..k])
        && crate::kernels::days(&d[k..], &mut days[k..]);
    exact.then(|| Arc::new(Date32Array::new(ScalarBuffer::from(days), real_nulls(d))) as ArrayRef)
}

/// Seconds as timestamp[us, tz], when every one is a whole number of microseconds that
/// converts back to the same double (or NA). (`Sys.time()` values usually are not: R adds
/// the microseconds as `1e-6 * us`, a different rounding.)
fn times(s: &[f64], tz: &str) -> Option<ArrayRef> {
    let mut us = vec![0i64; s.len()];
    // As in `dates`: `Sys.time()`-like values fail on their first elements.
    let k = s.len().min(256);
    let exact = crate::kernels::micros(&s[..k], &mut us[..k])
        && crate::kernels::micros(&s[k..], &mut us[k..]);
    exact.then(|| {
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

/// One R vector as an Arrow array, with its field metadata.
struct Col {
    array: ArrayRef,
    meta: Vec<(String, String)>,
    /// For integers and doubles: what [`ArrowOut::write`] needs to make the bitmap (the
    /// array was made with a placeholder).
    fuse: Option<FuseSrc>,
}

/// Where a fused write reads from (see [`ArrowOut`]).
#[derive(Clone, Copy)]
struct FuseSrc {
    /// The vector's elements (the payload being written holds the vector).
    values: *const u8,
    /// The values buffer the encoding was made with (not copied: rewritten).
    encoded: *const u8,
    /// The all-zero bitmap the encoding was made with (not copied: rewritten).
    placeholder: *const u8,
    n: usize,
    kind: Na,
}

/// Which elements are R's NA.
#[derive(Clone, Copy)]
enum Na {
    Int,
    /// Factor codes, written as 0-based keys.
    Codes,
    Real,
    Int64,
}

impl FuseSrc {
    /// The array with its real keys or validity (when the encoding did not have the expected
    /// layout); `made` is the array made with placeholders.
    ///
    /// # Safety
    /// `values` still points to the vector's `n` elements.
    unsafe fn array(&self, made: &ArrayRef) -> ArrayRef {
        // SAFETY: as the caller promises.
        unsafe {
            match self.kind {
                Na::Codes => {
                    let codes = std::slice::from_raw_parts(self.values.cast::<i32>(), self.n);
                    let keys: Vec<i32> = codes
                        .iter()
                        .map(|&c| if c == NA_INTEGER { 0 } else { c - 1 })
                        .collect();
                    let keys = Int32Array::new(keys.into(), r_int_nulls(codes));
                    let levels = made.as_dictionary::<Int32Type>().values().clone();
                    // SAFETY: the keys are in range (checked by `factor`).
                    Arc::new(DictionaryArray::<Int32Type>::new_unchecked(keys, levels))
                }
                Na::Int => {
                    let v = std::slice::from_raw_parts(self.values.cast::<i32>(), self.n);
                    Arc::new(Int32Array::new(
                        ScalarBuffer::new(borrow(v), 0, self.n),
                        r_int_nulls(v),
                    ))
                }
                Na::Int64 => {
                    let v = std::slice::from_raw_parts(self.values.cast::<i64>(), self.n);
                    Arc::new(Int64Array::new(
                        ScalarBuffer::new(borrow(v), 0, self.n),
                        int_nulls(v, NA_INTEGER64),
                    ))
                }
                Na::Real => {
                    let v = std::slice::from_raw_parts(self.values.cast::<f64>(), self.n);
                    Arc::new(Float64Array::new(
                        ScalarBuffer::new(borrow(v), 0, self.n),
                        real_nulls(v),
                    ))
                }
            }
        }
    }

    fn size(&self) -> usize {
        match self.kind {
            Na::Int | Na::Codes => 4,
            Na::Real | Na::Int64 => 8,
        }
    }
}

/// How an out-of-band vector or data frame is written into a payload: its Arrow encoding,
/// and for integer and double columns where their bitmap goes.
pub struct ArrowOut {
    enc: Encoded,
    fused: Vec<(PrimitiveLayout, FuseSrc)>,
}

impl ArrowOut {
    /// Bytes it takes in the payload.
    pub fn len(&self) -> usize {
        self.enc.len()
    }

    /// Writes the encoded value into `out` (exactly [`ArrowOut::len`] bytes).
    pub fn write(&self, out: &mut [u8]) {
        let skip: Vec<*const u8> = self
            .fused
            .iter()
            .flat_map(|(_, f)| [f.encoded, f.placeholder])
            .collect();
        self.enc.write_to_except(out, &skip);
        for (layout, f) in &self.fused {
            let (head, tail) = out.split_at_mut(layout.values.start);
            let bits = &mut head[layout.validity.clone()];
            let dst = &mut tail[..layout.values.len()];
            // SAFETY: `values` points to the `n` elements of the vector this column was
            // made from, which the payload holds unmodified (see `encode`).
            let nulls = unsafe {
                match f.kind {
                    Na::Int => crate::ntcopy::copy_integers(
                        std::slice::from_raw_parts(f.values.cast::<i32>(), f.n),
                        dst,
                        bits,
                    ),
                    Na::Codes => crate::ntcopy::copy_codes(
                        std::slice::from_raw_parts(f.values.cast::<i32>(), f.n),
                        dst,
                        bits,
                    ),
                    Na::Int64 => crate::ntcopy::copy_integer64(
                        std::slice::from_raw_parts(f.values.cast::<i64>(), f.n),
                        dst,
                        bits,
                    ),
                    Na::Real => crate::ntcopy::copy_doubles(
                        std::slice::from_raw_parts(f.values.cast::<f64>(), f.n),
                        dst,
                        bits,
                    ),
                }
            };
            let at = layout.null_count_at;
            out[at..at + 8].copy_from_slice(&(nulls as i64).to_le_bytes());
        }
    }
}

/// `n` zero bytes for a placeholder (never read: the encoder lays it out, [`ArrowOut::write`]
/// writes over it), from one zeroed allocation kept for reuse: a fresh zeroed buffer for
/// each column cost a `memset` and a `malloc` of its size per payload.
fn zeros(n: usize) -> Buffer {
    thread_local! {
        static ZEROS: std::cell::RefCell<Buffer> = std::cell::RefCell::new(Buffer::from_vec(Vec::<u8>::new()));
    }
    ZEROS.with(|z| {
        let mut z = z.borrow_mut();
        if z.len() < n {
            *z = MutableBuffer::from_len_zeroed(n.next_power_of_two()).into();
        }
        z.slice_with_length(0, n)
    })
}

/// A validity bitmap to encode with, whose bits and count [`ArrowOut::write`] replaces: all
/// zeros (every element null, and counted so), so that the IPC writer lays a bitmap out and
/// the array it reads is a valid one.
fn placeholder_nulls(n: usize) -> (NullBuffer, *const u8) {
    let b = zeros(n.div_ceil(8));
    let p = b.as_ptr();
    // SAFETY: the `n` bits are all zero, so `n` is their null count.
    (
        unsafe { NullBuffer::new_unchecked(BooleanBuffer::new(b, 0, n), n) },
        p,
    )
}

/// A plain integer, integer64 or double vector: the values borrowed, with a placeholder
/// bitmap (see [`ArrowOut`]).
///
/// # Safety
/// The vector behind `v` stays alive and unmodified while the column exists.
unsafe fn fused<T: Copy + arrow_buffer::ArrowNativeType>(
    v: &[T],
    kind: Na,
    make: impl Fn(ScalarBuffer<T>, Option<NullBuffer>) -> ArrayRef,
    meta: Vec<(String, String)>,
) -> Col {
    let n = v.len();
    let (placeholder, p) = placeholder_nulls(n);
    Col {
        // SAFETY: as the caller promises.
        array: make(
            ScalarBuffer::new(unsafe { borrow(v) }, 0, n),
            Some(placeholder),
        ),
        meta,
        fuse: Some(FuseSrc {
            values: v.as_ptr().cast(),
            encoded: v.as_ptr().cast(),
            placeholder: p,
            n,
            kind,
        }),
    }
}

/// The Arrow array of a vector, or `None` for one that keeps R's layout (complex and
/// character vectors).
///
/// # Safety
/// `x` is a live atomic vector, protected and unmodified for as long as the column exists.
unsafe fn column(x: SEXP) -> Option<Col> {
    let plain = |array: ArrayRef, meta| Col {
        array,
        meta,
        fuse: None,
    };
    // SAFETY: `x` is live; `elements` covers exactly its XLENGTH elements of its type, and
    // the borrowed buffers live no longer than the caller keeps `x` (see `Borrowed`).
    unsafe {
        let n = XLENGTH(x) as usize;
        Some(match VType::of(TYPEOF(x))? {
            VType::Int => {
                let v: &[i32] = elements(x, n);
                match inherits(x, c"factor").then(|| factor(x, v)).flatten() {
                    Some(c) => c,
                    None => fused(
                        v,
                        Na::Int,
                        |b, nb| Arc::new(Int32Array::new(b, nb)),
                        Vec::new(),
                    ),
                }
            }
            VType::Lgl => {
                let v: &[i32] = elements(x, n);
                let words = n.div_ceil(64);
                let (mut values, mut valid) = (vec![0u64; words], vec![0u64; words]);
                let missing = crate::kernels::logical_bits(v, &mut values, &mut valid);
                let bits = |w: Vec<u64>| BooleanBuffer::new(Buffer::from_vec(w), 0, n);
                let nulls = (missing > 0).then(|| NullBuffer::new(bits(valid)));
                plain(Arc::new(BooleanArray::new(bits(values), nulls)), Vec::new())
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
            VType::Str => plain(strings(x)?, Vec::new()),
            VType::Cplx => return None,
        })
    }
}

fn field(name: &str, c: &Col) -> Field {
    mizu_pool::wire::rmeta::ordered_if_so(
        Field::new(name, c.array.data_type().clone(), true)
            .with_metadata(c.meta.iter().cloned().collect::<HashMap<_, _>>()),
    )
}

/// Encodes the columns (a one-array value, or with `frame` a record batch) and places their
/// fused bitmaps; should the encoding not have the expected layout, the columns are encoded
/// again with their real bitmaps.
fn finish(mut cols: Vec<(String, Col)>, frame: bool) -> Result<ArrowOut> {
    let err = |e: mizu_pool::wire::WireError| crate::rerr(format!("cannot encode as Arrow: {e}"));
    let value = |cols: &[(String, Col)]| -> Result<Value> {
        if !frame {
            let (name, c) = &cols[0];
            return Ok(Value::Array {
                field: Arc::new(field(name, c)),
                array: c.array.clone(),
            });
        }
        let schema = Schema::new(cols.iter().map(|(n, c)| field(n, c)).collect::<Vec<_>>())
            .with_metadata(HashMap::from([(CLASS.to_owned(), "data.frame".to_owned())]));
        RecordBatch::try_new(
            Arc::new(schema),
            cols.iter().map(|(_, c)| c.array.clone()).collect(),
        )
        .map(Value::Table)
        .map_err(|e| crate::rerr(format!("cannot encode a data frame as Arrow: {e}")))
    };
    let enc = mizu_pool::wire::encode(&value(&cols)?).map_err(err)?;
    if cols.iter().all(|(_, c)| c.fuse.is_none()) {
        return Ok(ArrowOut {
            enc,
            fused: Vec::new(),
        });
    }
    let layouts = enc.column_layouts().unwrap_or_default();
    let placed: Option<Vec<(PrimitiveLayout, FuseSrc)>> = cols
        .iter()
        .enumerate()
        .filter_map(|(i, (_, c))| c.fuse.map(|f| (i, f)))
        .map(|(i, f)| {
            let l = layouts.get(i).cloned().flatten()?;
            (l.values.len() == f.n * f.size() && l.validity.len() >= f.n.div_ceil(8))
                .then_some((l, f))
        })
        .collect();
    if let Some(fused) = placed {
        return Ok(ArrowOut { enc, fused });
    }
    for (_, c) in &mut cols {
        if let Some(f) = c.fuse.take() {
            // SAFETY: the vectors are alive and unmodified (the caller's promise to
            // `encode`).
            c.array = unsafe { f.array(&c.array) };
        }
    }
    Ok(ArrowOut {
        enc: mizu_pool::wire::encode(&value(&cols)?).map_err(err)?,
        fused: Vec::new(),
    })
}

/// The Arrow encoding of an out-of-band vector, or `None` for one that keeps R's layout
/// (complex vectors, and character vectors `strings` does not take).
///
/// # Safety
/// `x` is a live atomic vector, protected and unmodified for as long as the result exists.
pub unsafe fn encode(x: SEXP) -> Option<Result<ArrowOut>> {
    // SAFETY: as the caller promises.
    let c = unsafe { column(x) }?;
    Some(finish(vec![(String::new(), c)], false))
}

/// The record batch of a data frame (`df`, a list inheriting `data.frame`) whose columns are
/// all vectors Arrow maps, of one length, none of them a view of shared memory (those are
/// better sent on by reference, one by one) and together at least `floor` bytes; else `None`.
///
/// # Safety
/// `df` is a live list, protected and unmodified (its columns too) while the result exists.
pub unsafe fn encode_frame(df: SEXP, floor: usize) -> Option<Result<ArrowOut>> {
    // SAFETY: reading a live list, its names and its elements; `column` as promised.
    unsafe {
        if TYPEOF(df) != SEXPTYPE::VECSXP || !inherits(df, c"data.frame") {
            return None;
        }
        let ncol = XLENGTH(df) as usize;
        if ncol == 0 {
            return None;
        }
        let first = extendr_ffi::VECTOR_ELT(df, 0);
        let n = XLENGTH(first) as usize;
        let mut bytes = 0usize;
        for j in 0..ncol {
            let c = extendr_ffi::VECTOR_ELT(df, j as isize);
            let t = VType::of(TYPEOF(c))?;
            if XLENGTH(c) as usize != n
                || crate::view::shared(c).is_some()
                || (extendr_ffi::ALTREP(c) != 0 && crate::view::is_any_view(c))
            {
                return None;
            }
            bytes += n * t.size();
        }
        if bytes < floor {
            return None;
        }
        let names = Rf_getAttrib(df, extendr_ffi::R_NamesSymbol);
        let named = TYPEOF(names) == SEXPTYPE::STRSXP
            && extendr_ffi::ALTREP(names) == 0
            && XLENGTH(names) as usize == ncol;
        let mut cols = Vec::with_capacity(ncol);
        for j in 0..ncol {
            let name = if named {
                utf8_elt(names, j).flatten().unwrap_or("").to_owned()
            } else {
                String::new()
            };
            cols.push((name, column(extendr_ffi::VECTOR_ELT(df, j as isize))?));
        }
        Some(finish(cols, true))
    }
}

/// An atomic vector as one Arrow array with its field (name, R metadata) and its real validity
/// bitmap, for values built as a tree (cross-language payloads); `None` for vectors Arrow does
/// not map (complex vectors, strings that are neither ASCII nor marked UTF-8).
///
/// # Safety
/// `x` is a live atomic vector, protected and unmodified while the array lives (integer,
/// double and raw arrays lend its memory).
pub unsafe fn array(x: SEXP, name: &str) -> Option<(Field, ArrayRef)> {
    // An unmodified lazy view gives back the array it reads: converting it (what reading its
    // data pointer does) would copy every element twice.
    // SAFETY: as the caller promises.
    if let Some(c) = unsafe { lazy_column(x) } {
        return Some((field(name, &c), c.array));
    }
    // SAFETY: as the caller promises.
    let mut c = unsafe { column(x) }?;
    if let Some(f) = c.fuse.take() {
        // SAFETY: `x` is alive and unmodified (the caller's promise).
        c.array = unsafe { f.array(&c.array) };
    }
    Some((field(name, &c), c.array))
}

/// The column of an unmodified lazy view: its array, with a factor's levels and class and a
/// POSIXct's time zone from its attributes.
///
/// # Safety
/// `x` is a live vector, protected while the result exists.
unsafe fn lazy_column(x: SEXP) -> Option<Col> {
    use crate::lazyview::Conv;
    let (conv, a) = crate::lazyview::unmodified_array(x)?;
    let plain = |array: ArrayRef, meta| Col {
        array,
        meta,
        fuse: None,
    };
    // SAFETY: reading attributes of a live vector.
    unsafe {
        Some(match conv {
            Conv::Codes => {
                let lev = Rf_getAttrib(x, R_LevelsSymbol);
                if TYPEOF(lev) != SEXPTYPE::STRSXP {
                    return None;
                }
                let levels = strings(lev)?;
                let keys = a.as_primitive::<Int32Type>().clone();
                let dict = DictionaryArray::<Int32Type>::try_new(keys, levels).ok()?;
                let class = if inherits(x, c"ordered") {
                    "ordered"
                } else {
                    "factor"
                };
                plain(Arc::new(dict), vec![(CLASS.into(), class.into())])
            }
            Conv::Micros => {
                let tz = tzone(x);
                let t = a
                    .as_primitive::<arrow_array::types::TimestampMicrosecondType>()
                    .clone()
                    .with_timezone_opt((!tz.is_empty()).then(|| tz.clone()));
                plain(Arc::new(t), vec![(TZ.to_owned(), tz)])
            }
            Conv::Int64 => plain(a, vec![(CLASS.to_owned(), "integer64".to_owned())]),
            _ => plain(a, Vec::new()),
        })
    }
}
