//! R objects to and from `mizu_pool::wire::Value` (the cross-language value tree; the mapping is
//! `docs/interop.md`). Vectors of length one without attributes are scalars; longer vectors,
//! and those with `dim`, a factor, Date, POSIXct, difftime or integer64 class, are Arrow
//! arrays (integer, double and raw vectors lend their memory until the payload is written);
//! data frames are record batches; lists are lists, or dicts when every element is named.
//! (Values into R: `xvalue_in.rs`.)

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field};
use extendr_api::prelude::*;
use extendr_ffi::SEXP;
use mizu_pool::wire::Value;
use mizu_pool::wire::rmeta::{self};

/// Why a value cannot cross, and where it sits (`x$a[[3]]`).
#[derive(Debug)]
pub struct NotPortable {
    /// Where.
    pub path: String,
    /// Why.
    pub why: String,
}

impl std::fmt::Display for NotPortable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.why)
    }
}

fn np(path: &str, why: impl Into<String>) -> NotPortable {
    NotPortable {
        path: path.to_owned(),
        why: why.into(),
    }
}

/// The attribute names of `x` other than `names`.
fn other_attrs(x: &Robj) -> Vec<String> {
    let mut out = Vec::new();
    // SAFETY: `x` is live (held by its Robj); walking its attribute pairlist reads tags
    // (symbols) and their names, and allocates nothing.
    unsafe {
        let mut a = crate::ffi::ATTRIB(x.get());
        while a != extendr_ffi::R_NilValue {
            let tag = extendr_ffi::TAG(a);
            let name = std::ffi::CStr::from_ptr(extendr_ffi::R_CHAR(extendr_ffi::PRINTNAME(tag)));
            let name = name.to_string_lossy();
            if name != "names" {
                out.push(name.into_owned());
            }
            a = extendr_ffi::CDR(a);
        }
    }
    out
}

/// The class attribute of `x` (empty without one).
fn classes(x: &Robj) -> Vec<String> {
    x.class()
        .map(|c| c.map(str::to_owned).collect())
        .unwrap_or_default()
}

fn describe(x: &Robj) -> &'static str {
    match x.rtype() {
        Rtype::Environment => "an environment",
        Rtype::ExternalPtr => "an external pointer",
        Rtype::Function | Rtype::Builtin | Rtype::Special => "a function",
        Rtype::Symbol => "a symbol",
        Rtype::Language => "a call",
        Rtype::Expressions => "an expression vector",
        Rtype::S4 => "an S4 object",
        Rtype::Pairlist => "a pairlist",
        _ => "this kind of value",
    }
}

/// The classes of `x` Arrow carries, or `None` when it has any other attribute.
fn mapped_class(x: &Robj) -> Option<()> {
    let known = [
        "factor",
        "ordered",
        "Date",
        "POSIXct",
        "POSIXt",
        "difftime",
        "integer64",
    ];
    let allowed_attrs = ["class", "levels", "tzone", "units", "dim", "dimnames"];
    if other_attrs(x)
        .iter()
        .any(|a| !allowed_attrs.contains(&a.as_str()))
    {
        return None;
    }
    if let Some(mut cs) = x.class()
        && !cs.all(|c| known.contains(&c))
    {
        return None;
    }
    Some(())
}

/// `x` (an R object) as a value; `path` names it in errors.
pub fn from_r(x: &Robj, path: &str) -> std::result::Result<Value, NotPortable> {
    let attrs = other_attrs(x);
    let named = x.names().is_some();
    match x.rtype() {
        Rtype::Null => Ok(Value::None),
        Rtype::List => list(x, path),
        Rtype::Raw if attrs.is_empty() && !named => Ok(Value::Bytes(Buffer::from_slice_ref(
            x.as_raw_slice().unwrap_or(&[]),
        ))),
        Rtype::Logicals
        | Rtype::Integers
        | Rtype::Doubles
        | Rtype::Strings
        | Rtype::Complexes
        | Rtype::Raw => {
            if attrs.is_empty() && named {
                return named_vector(x, path);
            }
            if attrs.is_empty() && x.len() == 1 {
                return Ok(scalar(x, 0));
            }
            if mapped_class(x).is_none() {
                let cls = classes(x);
                return Err(np(
                    path,
                    format!(
                        "an object of class {} cannot cross languages (unclass() it, or send \
                         its parts)",
                        if cls.is_empty() {
                            format!("with attributes {attrs:?}")
                        } else {
                            cls.join("/")
                        }
                    ),
                ));
            }
            if let Some(v) = resend(&[(x, "")], false) {
                return Ok(v);
            }
            let (field, array) = vector(x, path)?;
            Ok(Value::Array {
                field: Arc::new(field),
                array,
            })
        }
        _ => Err(np(path, format!("{} cannot cross languages", describe(x)))),
    }
}

/// Element `i` of an atomic vector as a scalar value (NA: `None`, except doubles, whose NA
/// keeps its bits).
fn scalar(x: &Robj, i: usize) -> Value {
    match x.rtype() {
        Rtype::Logicals => {
            let v = x.as_logical_slice().expect("logical")[i];
            if v.is_na() {
                Value::None
            } else {
                Value::Bool(v.is_true())
            }
        }
        Rtype::Integers => {
            let v = x.as_integer_slice().expect("integer")[i];
            if v == rmeta::NA_INTEGER {
                Value::None
            } else {
                Value::Int(i64::from(v))
            }
        }
        Rtype::Doubles => Value::Float(x.as_real_slice().expect("double")[i]),
        Rtype::Complexes => {
            // SAFETY: `x` is a live complex vector of more than `i` elements (R's layout: two
            // doubles each).
            let c = unsafe { *extendr_ffi::DATAPTR_RO(x.get()).cast::<[f64; 2]>().add(i) };
            Value::Complex(c[0], c[1])
        }
        Rtype::Strings => {
            let s = x
                .as_str_iter()
                .expect("character")
                .nth(i)
                .expect("in range");
            if s.is_na() {
                Value::None
            } else {
                Value::Str(s.to_owned())
            }
        }
        Rtype::Raw => Value::Int(i64::from(x.as_raw_slice().expect("raw")[i])),
        _ => Value::None,
    }
}

/// A vector with names only: a dict of scalars.
fn named_vector(x: &Robj, path: &str) -> std::result::Result<Value, NotPortable> {
    let names: Vec<String> = x.names().expect("named").map(str::to_owned).collect();
    check_names(&names, path)?;
    Ok(Value::Dict(
        names
            .into_iter()
            .enumerate()
            .map(|(i, n)| (n, scalar(x, i)))
            .collect(),
    ))
}

fn check_names(names: &[String], path: &str) -> std::result::Result<(), NotPortable> {
    let mut seen = std::collections::HashSet::new();
    for n in names {
        if n.is_empty() || n == "NA" {
            return Err(np(
                path,
                "a partly named list or vector cannot cross languages (name every element, or \
                 none)",
            ));
        }
        if !seen.insert(n.as_str()) {
            return Err(np(path, format!("the name {n:?} appears twice")));
        }
    }
    Ok(())
}

fn list(x: &Robj, path: &str) -> std::result::Result<Value, NotPortable> {
    if x.inherits("data.frame") {
        return frame(x, path).map(|f| match f {
            FrameOut::Batch(b) => Value::Table(b),
            FrameOut::Shared(bytes, value) => Value::Shared { bytes, value },
        });
    }
    if x.class().is_some() || !other_attrs(x).is_empty() {
        let cls = classes(x);
        return Err(np(
            path,
            format!(
                "a list of class {} cannot cross languages (unclass() it)",
                cls.join("/")
            ),
        ));
    }
    let l = x.as_list().expect("a list");
    match x.names() {
        Some(names) => {
            let names: Vec<String> = names.map(str::to_owned).collect();
            check_names(&names, path)?;
            let mut kv = Vec::with_capacity(names.len());
            for (n, v) in names.into_iter().zip(l.values()) {
                let p = format!("{path}${n}");
                kv.push((n, from_r(&v, &p)?));
            }
            Ok(Value::Dict(kv))
        }
        None => l
            .values()
            .enumerate()
            .map(|(i, v)| from_r(&v, &format!("{path}[[{}]]", i + 1)))
            .collect::<std::result::Result<_, _>>()
            .map(Value::List),
    }
}

/// An atomic vector (with a mapped class or `dim`) as an Arrow array and field.
fn vector(x: &Robj, path: &str) -> std::result::Result<(Field, ArrayRef), NotPortable> {
    vector_named(x, "", path)
}

fn vector_named(
    x: &Robj,
    name: &str,
    path: &str,
) -> std::result::Result<(Field, ArrayRef), NotPortable> {
    let (mut field, array) = if x.inherits("difftime") {
        let units = x
            .get_attrib("units")
            .and_then(|u| u.as_str().map(str::to_owned))
            .unwrap_or_else(|| "secs".into());
        let v = x
            .as_real_slice()
            .ok_or_else(|| np(path, "a difftime that is not double"))?;
        rmeta::difftime(name, v, &units).map_err(|e| np(path, e.to_string()))?
    } else if x.rtype() == Rtype::Complexes {
        return Err(np(
            path,
            "complex vectors cannot cross languages yet (send Re() and Im())",
        ));
    } else {
        // SAFETY: `x` is a live atomic vector held (protected) by its Robj for as long as the
        // caller keeps it, which is until the payload is written.
        match unsafe { crate::arrow_out::array(x.get(), name) } {
            Some(fa) => fa,
            None => strings(x, name).ok_or_else(|| np(path, "this vector cannot cross"))?,
        }
    };
    if let Some(d) = x.get_attrib("dim") {
        let d: Vec<i32> = match d.as_integer_slice() {
            Some(s) => s.to_vec(),
            None => d
                .as_real_slice()
                .map(|s| s.iter().map(|&v| v as i32).collect())
                .unwrap_or_default(),
        };
        field = rmeta::with_dim(field, &d);
    }
    Ok((field, array))
}

/// A character vector whose strings are in another encoding, translated to UTF-8.
fn strings(x: &Robj, name: &str) -> Option<(Field, ArrayRef)> {
    let it = x.as_str_iter()?;
    let a: StringArray = it
        .map(|s| (!s.is_na()).then(|| s.to_owned()))
        .collect::<Vec<Option<String>>>()
        .into();
    let a: ArrayRef = Arc::new(a);
    Some((Field::new(name, DataType::Utf8, true), a))
}

fn frame(x: &Robj, path: &str) -> std::result::Result<FrameOut, NotPortable> {
    let l = x.as_list().expect("a data frame is a list");
    let names: Vec<String> = x
        .names()
        .map(|n| n.map(str::to_owned).collect())
        .unwrap_or_default();
    let cols: Vec<Robj> = l.values().collect();
    if names.len() == cols.len() {
        let named: Vec<(&Robj, &str)> = cols
            .iter()
            .zip(&names)
            .map(|(c, n)| (c, n.as_str()))
            .collect();
        if let Some(Value::Shared { bytes, value }) = resend(&named, true) {
            return Ok(FrameOut::Shared(bytes, value));
        }
    }
    let mut out = Vec::with_capacity(cols.len());
    for (j, c) in cols.iter().enumerate() {
        let name = names.get(j).cloned().unwrap_or_default();
        let p = format!("{path}${name}");
        if !matches!(
            c.rtype(),
            Rtype::Logicals | Rtype::Integers | Rtype::Doubles | Rtype::Strings | Rtype::Raw
        ) || mapped_class(c).is_none()
        {
            return Err(np(&p, "this column cannot cross languages"));
        }
        out.push(vector_named(c, &name, &p)?);
    }
    rmeta::data_frame(out)
        .map(FrameOut::Batch)
        .map_err(|e| np(path, e.to_string()))
}

/// A data frame as a value: a record batch, or the one it came in, unchanged.
enum FrameOut {
    Batch(RecordBatch),
    Shared(Buffer, Box<Value>),
}

/// When `cols` (R vectors with their names) are unmodified views of one received value — the
/// vector of an array value, or with `frame` every column of a table value, in order — and
/// still have the names and attributes they came with, that value as a [`Value::Shared`],
/// which is sent on by reference. Decided per column, without reading an element: the data
/// were checked when they came and are immutable since. `None` when any was modified,
/// converted or given other attributes (those are sent by value).
fn resend(cols: &[(&Robj, &str)], frame: bool) -> Option<Value> {
    use crate::altrep::Shared;
    let mut bytes: Option<Buffer> = None;
    for (j, (x, _)) in cols.iter().enumerate() {
        // SAFETY: `x` is live (held by its Robj); this only reads it.
        let s = unsafe { x.get() };
        let src = match crate::view::shared(s).or_else(|| crate::strview::shared(s))? {
            Shared::Arrow(src) => src,
            Shared::Elements(_) => return None,
        };
        let want_col = (cols.len() > 1 || src.col.is_some()).then_some(j as u32);
        if src.col != want_col {
            return None;
        }
        match &bytes {
            None => bytes = Some(src.bytes),
            Some(b) if b.as_ptr() == src.bytes.as_ptr() && b.len() == src.bytes.len() => {}
            Some(_) => return None,
        }
    }
    let bytes = bytes?;
    mizu_pool::wire::Region::containing(bytes.as_ptr())?;
    let value = mizu_pool::wire::decode_received(&bytes).ok()?;
    let fits = |field: &Field, array: &ArrayRef, (x, name): &(&Robj, &str)| {
        field.name() == name
            && rmeta::classify(field)
                .ok()
                .and_then(|t| crate::xvalue_in::attributes(field, array, &t).ok())
                .is_some_and(|want| has_attributes(x, &want))
    };
    let ok = match &value {
        Value::Array { field, array } => !frame && cols.len() == 1 && fits(field, array, &cols[0]),
        Value::Table(b) => {
            frame
                && b.num_columns() == cols.len()
                && b.schema()
                    .fields()
                    .iter()
                    .zip(b.columns())
                    .zip(cols)
                    .all(|((f, a), c)| fits(f, a, c))
        }
        _ => false,
    };
    ok.then(|| Value::Shared {
        bytes,
        value: Box::new(value),
    })
}

/// The attributes that decide how a vector is sent, as [`column`] sets them.
const DECIDING: [&str; 5] = ["class", "levels", "tzone", "units", "dim"];

/// Whether `x` has exactly the deciding attributes `want` (and no other deciding one).
fn has_attributes(x: &Robj, want: &[(&str, Robj)]) -> bool {
    DECIDING.iter().all(|k| {
        let want = want.iter().find(|(n, _)| n == k).map(|(_, v)| v);
        match (x.get_attrib(*k), want) {
            (None, None) => true,
            (Some(have), Some(want)) => have == *want,
            _ => false,
        }
    })
}

/// [`from_r`] of a raw `SEXP`: plain scalars (and `NULL`) are read without an R handle
/// (extendr's handles cost a table update each, more than the rest of a small task).
///
/// # Safety
/// `x` is a live R object, protected for as long as the returned value lives.
pub unsafe fn from_sexp(x: SEXP, path: &str) -> std::result::Result<Value, NotPortable> {
    use extendr_ffi::{
        INTEGER, LOGICAL, R_CHAR, R_NaString, R_NilValue, REAL, SEXPTYPE, STRING_ELT, TYPEOF,
        XLENGTH,
    };
    // SAFETY: as the caller promises; types, lengths and attributes are checked before
    // elements are read.
    unsafe {
        let t = TYPEOF(x);
        if t == SEXPTYPE::NILSXP {
            return Ok(Value::None);
        }
        let atomic = matches!(
            t,
            SEXPTYPE::LGLSXP | SEXPTYPE::INTSXP | SEXPTYPE::REALSXP | SEXPTYPE::STRSXP
        );
        // (XLENGTH only of vectors: of an environment, say, it raises an R error.)
        if atomic && crate::ffi::ATTRIB(x) == R_NilValue && XLENGTH(x) == 1 {
            match t {
                SEXPTYPE::LGLSXP => {
                    let v = *LOGICAL(x);
                    return Ok(if v == rmeta::NA_INTEGER {
                        Value::None
                    } else {
                        Value::Bool(v != 0)
                    });
                }
                SEXPTYPE::INTSXP => {
                    let v = *INTEGER(x);
                    return Ok(if v == rmeta::NA_INTEGER {
                        Value::None
                    } else {
                        Value::Int(i64::from(v))
                    });
                }
                SEXPTYPE::REALSXP => return Ok(Value::Float(*REAL(x))),
                SEXPTYPE::STRSXP => {
                    let c = STRING_ELT(x, 0);
                    if c == R_NaString {
                        return Ok(Value::None);
                    }
                    let b = std::ffi::CStr::from_ptr(R_CHAR(c)).to_bytes();
                    if (b.is_ascii() || crate::ffi::Rf_getCharCE(c) == 1)
                        && let Ok(s) = std::str::from_utf8(b)
                    {
                        return Ok(Value::Str(s.to_owned()));
                    }
                }
                _ => {}
            }
        }
        let r = Robj::from_sexp(x);
        from_r(&r, path)
    }
}
