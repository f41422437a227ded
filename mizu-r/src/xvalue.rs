//! R objects to and from `mizu_pool::wire::Value` (the cross-language value tree; the mapping is
//! `docs/interop.md`). Vectors of length one without attributes are scalars; longer vectors,
//! and those with `dim`, a factor, Date, POSIXct, difftime or integer64 class, are Arrow
//! arrays (integer, double and raw vectors lend their memory until the payload is written);
//! data frames are record batches; lists are lists, or dicts when every element is named.
//! Received arrays become views of the shared memory (see `arrow_in`).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::DurationMicrosecondType;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field};
use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::SEXP;
use mizu_pool::wire::Value;
use mizu_pool::wire::rmeta::{self, RType};

use crate::arrow_in::Source;

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
    use crate::view::Shared;
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
                .and_then(|t| attributes(field, array, &t).ok())
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

// -- values to R ----------------------------------------------------------------------------

thread_local! {
    /// The address range of the payload whose values are being made (see [`Reading`]).
    static READING: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// While it lives, views made of values are counted as new copies when their bytes are in
/// `payload` (sent for this task or reply) and as references otherwise (a region re-sent by
/// reference): R's collector is asked to run for the first kind (see `view::account`), so a
/// sender's fresh payload goes back as soon as the worker is idle.
pub struct Reading {
    before: (usize, usize),
}

impl Reading {
    /// Marks `payload` as the one being read.
    pub fn payload(payload: &Buffer) -> Reading {
        let start = payload.as_ptr() as usize;
        let before = READING.with(|r| r.replace((start, start + payload.len())));
        Reading { before }
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        READING.with(|r| r.set(self.before));
    }
}

/// Whether `bytes` lie in the payload being read (see [`Reading`]).
fn in_payload(bytes: &Buffer) -> bool {
    let (start, end) = READING.with(std::cell::Cell::get);
    let p = bytes.as_ptr() as usize;
    !bytes.is_empty() && p >= start && p + bytes.len() <= end
}

fn rerr(e: impl std::fmt::Display) -> Error {
    crate::rerr(format!("cannot read a cross-language value: {e}"))
}

/// A received cross-language outcome payload: the value, or for a task's failure the
/// condition the caller raises (classes `mizu_error_python`, `mizu_error_task`, `mizu_error`,
/// `error`, `condition`; fields `type`, `classes`, `traceback`).
pub fn received(payload: &Buffer) -> Result<Robj> {
    use mizu_pool::wire::envelope::{self, Received};
    let _reading = Reading::payload(payload);
    match envelope::read_with(payload, Some(&crate::codec::MAPPER)).map_err(rerr)? {
        Received::Value(v) | Received::Warned { value: v, .. } => to_r(v),
        Received::Error(e) => {
            let lang = if e.language == "python" {
                "python"
            } else {
                "r"
            };
            let first = e
                .classes
                .first()
                .cloned()
                .unwrap_or_else(|| "Exception".into());
            let message = if lang == "python" {
                format!("{first}: {}", e.message)
            } else {
                e.message.clone()
            };
            let mut l: Robj = List::from_values([
                Robj::from(message.as_str()),
                Robj::from(()),
                Robj::from(first.as_str()),
                Robj::from(e.classes.clone()),
                Robj::from(e.traceback.as_str()),
                Robj::from(e.call.as_str()),
                e.element
                    .map_or_else(|| Robj::from(()), |i| Robj::from(i as f64)),
            ])
            .into();
            l.set_names([
                "message",
                "call",
                "type",
                "classes",
                "traceback",
                "remote_call",
                "element",
            ])?;
            let own = format!("mizu_error_{lang}");
            l.set_class([
                own.as_str(),
                "mizu_error_task",
                "mizu_error",
                "error",
                "condition",
            ])?;
            Ok(l)
        }
        Received::Task { .. } => Err(rerr("a task where a result was expected")),
    }
}

/// A received value as an R object: arrays as views of the shared memory.
pub fn to_r(v: Value) -> Result<Robj> {
    Ok(match v {
        Value::None => Robj::from(()),
        Value::Bool(b) => Robj::from(b),
        Value::Int(i) => match i32::try_from(i) {
            Ok(x) if x != rmeta::NA_INTEGER => Robj::from(x),
            _ => Robj::from(i as f64),
        },
        Value::Float(f) => Robj::from(f),
        Value::Complex(re, im) => Robj::from(Rcplx::from((re, im))),
        Value::Str(s) => Robj::from(s.as_str()),
        Value::Bytes(b) => Robj::from(Raw::from_bytes(b.as_slice())),
        Value::List(items) => {
            let v = items.into_iter().map(to_r).collect::<Result<Vec<_>>>()?;
            List::from_values(v).into()
        }
        Value::Dict(kv) => {
            let (names, vals): (Vec<String>, Vec<Value>) = kv.into_iter().unzip();
            let vals = vals.into_iter().map(to_r).collect::<Result<Vec<_>>>()?;
            let mut l: Robj = List::from_values(vals).into();
            l.set_names(names)?;
            l
        }
        Value::Array { field, array } => column(&field, &array, None)?,
        Value::Table(batch) => data_frame(&batch, None)?,
        Value::Shared { bytes, value } => match *value {
            Value::Array { field, array } => column(&field, &array, Some((bytes, None)))?,
            Value::Table(batch) => data_frame(&batch, Some(bytes))?,
            v => to_r(v)?,
        },
        Value::Error {
            type_name,
            message,
            traceback,
        } => {
            let mut l: Robj =
                List::from_values([Robj::from(message.as_str()), Robj::from(traceback.as_str())])
                    .into();
            l.set_names(["message", "traceback"])?;
            l.set_class([type_name.as_str(), "error", "condition"])?;
            l
        }
        Value::Call { .. } => return Err(rerr("a call is not a value")),
    })
}

/// One received array as an R vector with its attributes; `shared`: the standalone encoding
/// it came in (and its column in a table), so that the view is sent on by reference.
fn column(field: &Field, array: &ArrayRef, shared: Option<(Buffer, Option<u32>)>) -> Result<Robj> {
    if rmeta::classify(field).is_err()
        && let Some((f, a)) = rmeta::normalize(field, array)
    {
        // (Converted: not the bytes that came.)
        return column(&f, &a, None);
    }
    let t = rmeta::classify(field).map_err(rerr)?;
    let attrs = attributes(field, array, &t)?;
    let src = match shared {
        Some((bytes, col)) => Source { bytes, col },
        // Not an encoding of its own: a view made here is sent on by copying.
        None => Source {
            bytes: Buffer::from_vec(Vec::<u8>::new()),
            col: None,
        },
    };
    let mut x = match &t {
        RType::Difftime { .. } => {
            // R keeps difftimes as doubles in their units.
            let secs = unit_seconds(&t);
            let a = array.as_primitive::<DurationMicrosecondType>();
            let v: Vec<f64> = (0..a.len())
                .map(|i| {
                    if a.is_null(i) {
                        f64::from_bits(rmeta::NA_REAL_BITS)
                    } else {
                        a.value(i) as f64 / 1e6 / secs
                    }
                })
                .collect();
            Robj::from(v)
        }
        _ => {
            let copy = in_payload(&src.bytes);
            crate::arrow_in::column(array, src, copy)?
        }
    };
    for (k, v) in attrs {
        x.set_attrib(k, v)?;
    }
    Ok(x)
}

/// The attributes of the R vector of a received array (`t`: its R type): its class and what
/// goes with it (levels, time zone, units), and `dim`.
fn attributes(field: &Field, array: &ArrayRef, t: &RType) -> Result<Vec<(&'static str, Robj)>> {
    let mut a: Vec<(&'static str, Robj)> = Vec::new();
    match t {
        RType::Factor { ordered } => {
            let levels = array
                .as_dictionary_opt::<arrow_array::types::Int32Type>()
                .ok_or_else(|| rerr("a factor that is not a dictionary of int32 keys"))?
                .values();
            let levels: Vec<String> = match levels.as_string_opt::<i32>() {
                Some(s) => s.iter().map(|v| v.unwrap_or_default().to_owned()).collect(),
                None => levels
                    .as_string::<i64>()
                    .iter()
                    .map(|v| v.unwrap_or_default().to_owned())
                    .collect(),
            };
            a.push(("levels", Robj::from(levels)));
            a.push((
                "class",
                if *ordered {
                    Robj::from(["ordered", "factor"])
                } else {
                    Robj::from("factor")
                },
            ));
        }
        RType::Date => a.push(("class", Robj::from("Date"))),
        RType::PosixCt { tz } => {
            a.push(("tzone", Robj::from(tz.as_str())));
            a.push(("class", Robj::from(["POSIXct", "POSIXt"])));
        }
        RType::Difftime { units } => {
            a.push(("units", Robj::from(units.as_str())));
            a.push(("class", Robj::from("difftime")));
        }
        RType::Integer64 => a.push(("class", Robj::from("integer64"))),
        _ => {}
    }
    if let Some(d) = rmeta::dim(field, array.len()).map_err(rerr)? {
        a.push(("dim", Robj::from(d)));
    }
    Ok(a)
}

fn unit_seconds(t: &RType) -> f64 {
    match t {
        RType::Difftime { units } => match units.as_str() {
            "mins" => 60.0,
            "hours" => 3600.0,
            "days" => 86400.0,
            "weeks" => 604800.0,
            _ => 1.0,
        },
        _ => 1.0,
    }
}

fn data_frame(batch: &RecordBatch, shared: Option<Buffer>) -> Result<Robj> {
    let schema = batch.schema();
    let mut cols = Vec::with_capacity(batch.num_columns());
    for (j, f) in schema.fields().iter().enumerate() {
        let s = shared.as_ref().map(|b| (b.clone(), Some(j as u32)));
        cols.push(column(f, batch.column(j), s)?);
    }
    let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let mut df: Robj = List::from_values(cols).into();
    df.set_names(names)?;
    df.set_attrib("row.names", [i32::MIN, -(batch.num_rows() as i32)])?;
    df.set_class(["data.frame"])?;
    Ok(df)
}

/// The payload of a cross-language task: `call` a `mizu_call()` (`list(target, source, args,
/// kwargs)`), `vars` further keyword arguments (a named list, or NULL). `Err`: why it cannot
/// cross.
///
/// # Safety
/// R's main thread; the arguments are live and protected until the payload is written (arrays
/// lend their memory).
pub unsafe fn call_envelope(
    call: SEXP,
    vars: SEXP,
) -> std::result::Result<mizu_pool::wire::envelope::Envelope, String> {
    // SAFETY: as the caller promises.
    let value = unsafe { call_value(call, vars) }?;
    mizu_pool::wire::envelope::Envelope::task(&value, mizu_pool::wire::envelope::Context::default())
        .map_err(|e| e.to_string())
}

/// The payload of a chunk of a cross-language map: `call` and `vars` as for
/// [`call_envelope`], `elements` a list whose items are appended to the arguments one at a
/// time; element `j` runs on the stream `(seed, first + j)`.
///
/// # Safety
/// As for [`call_envelope`].
pub unsafe fn chunk_envelope(
    call: SEXP,
    vars: SEXP,
    elements: SEXP,
    seed: Option<f64>,
    first: f64,
) -> std::result::Result<mizu_pool::wire::envelope::Envelope, String> {
    use extendr_ffi::{SEXPTYPE, TYPEOF, VECTOR_ELT, XLENGTH};
    // SAFETY: as the caller promises; `elements` is checked to be a list before its items
    // are read.
    let (value, elements) = unsafe {
        let value = call_value(call, vars)?;
        if TYPEOF(elements) != SEXPTYPE::VECSXP {
            return Err("a map's elements must be a list".into());
        }
        let mut xs = Vec::with_capacity(XLENGTH(elements) as usize);
        for j in 0..XLENGTH(elements) {
            let path = format!("element {}", first as i64 + j as i64 + 1);
            xs.push(from_sexp(VECTOR_ELT(elements, j), &path).map_err(|e| e.to_string())?);
        }
        (value, xs)
    };
    if matches!(
        value,
        Value::Call {
            target: mizu_pool::wire::CallTarget::Source(_),
            ..
        }
    ) {
        return Err("mizu_map() needs a mizu_call() that names a function".into());
    }
    mizu_pool::wire::envelope::Envelope::chunk(
        value,
        mizu_pool::wire::envelope::Chunk {
            elements,
            spread: false,
        },
        mizu_pool::wire::envelope::Context {
            seed: seed.map(|s| s as u64),
            index: first as u64,
        },
    )
    .map_err(|e| e.to_string())
}

/// A `mizu_call()` with further keyword arguments `vars`, as a call value.
///
/// # Safety
/// As for [`call_envelope`].
unsafe fn call_value(call: SEXP, vars: SEXP) -> std::result::Result<Value, String> {
    use extendr_ffi::{
        LOGICAL, R_CHAR, R_NaString, R_NamesSymbol, Rf_getAttrib, SEXPTYPE, STRING_ELT, TYPEOF,
        VECTOR_ELT, XLENGTH,
    };
    // Read through raw SEXPs: an extendr handle costs a table update each, and a cross-language
    // submit made a dozen of them (a sixth of an R caller's round trip).
    // SAFETY: as the caller promises; every type and length is checked before elements are
    // read, and the strings read are copied out at once.
    let (target, source, args, kwargs) = unsafe {
        let is_list = |x: SEXP| TYPEOF(x) == SEXPTYPE::VECSXP;
        if crate::ffi::Rf_inherits(call, c"mizu_call".as_ptr()) == 0 {
            return Err(
                "a pool of Python workers runs mizu_call() tasks, not R expressions".into(),
            );
        }
        if !is_list(call) || XLENGTH(call) < 4 {
            return Err("a mizu_call is a list of four parts".into());
        }
        let string = |x: SEXP, i: isize| -> Option<String> {
            let c = STRING_ELT(x, i);
            if c == R_NaString {
                return None;
            }
            std::ffi::CStr::from_ptr(R_CHAR(c))
                .to_str()
                .ok()
                .map(str::to_owned)
        };
        let t = VECTOR_ELT(call, 0);
        let target = (TYPEOF(t) == SEXPTYPE::STRSXP && XLENGTH(t) >= 1)
            .then(|| string(t, 0))
            .flatten()
            .ok_or("a mizu_call needs a target")?;
        let src = VECTOR_ELT(call, 1);
        let source = TYPEOF(src) == SEXPTYPE::LGLSXP && XLENGTH(src) >= 1 && *LOGICAL(src) == 1;
        let mut args = Vec::new();
        let a = VECTOR_ELT(call, 2);
        if is_list(a) {
            for i in 0..XLENGTH(a) {
                let path = || format!("argument {}", i + 1);
                args.push(from_sexp(VECTOR_ELT(a, i), &path()).map_err(|e| e.to_string())?);
            }
        }
        let mut kwargs = Vec::new();
        for kw in [VECTOR_ELT(call, 3), vars] {
            if !is_list(kw) || XLENGTH(kw) == 0 {
                continue;
            }
            let names = Rf_getAttrib(kw, R_NamesSymbol);
            let named = TYPEOF(names) == SEXPTYPE::STRSXP && XLENGTH(names) == XLENGTH(kw);
            for i in 0..XLENGTH(kw) {
                let name = named
                    .then(|| string(names, i))
                    .flatten()
                    .unwrap_or_default();
                if name.is_empty() || name == "NA" {
                    return Err("keyword arguments must be named".into());
                }
                let value = from_sexp(VECTOR_ELT(kw, i), &name).map_err(|e| e.to_string())?;
                kwargs.push((name, value));
            }
        }
        (target, source, args, kwargs)
    };
    let target = if source {
        mizu_pool::wire::CallTarget::Source(target)
    } else {
        mizu_pool::wire::CallTarget::Name(target)
    };
    Ok(Value::Call {
        target,
        args,
        kwargs,
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

/// [`to_r`] as a raw `SEXP`, protected once (the caller unprotects it): scalars are made
/// without an R handle.
///
/// # Safety
/// R's main thread.
pub unsafe fn to_sexp_protected(v: Value) -> Result<SEXP> {
    use extendr_ffi::{R_NilValue, Rf_ScalarInteger, Rf_protect};
    // SAFETY: R's main thread; each new value is protected before anything else allocates.
    unsafe {
        let fresh = match &v {
            Value::None => Some(R_NilValue),
            Value::Bool(b) => Some(crate::ffi::Rf_ScalarLogical(i32::from(*b))),
            Value::Int(i) => match i32::try_from(*i) {
                Ok(x) if x != rmeta::NA_INTEGER => Some(Rf_ScalarInteger(x)),
                _ => Some(crate::ffi::Rf_ScalarReal(*i as f64)),
            },
            Value::Float(f) => Some(crate::ffi::Rf_ScalarReal(*f)),
            Value::Str(s) => Some(crate::handle::mk_string(s)),
            _ => None,
        };
        if let Some(x) = fresh {
            return Ok(Rf_protect(x));
        }
        let r = to_r(v)?;
        Ok(Rf_protect(r.get()))
    }
}

/// `x` as the payload of a cross-language value message (what a Python peer receives);
/// `path` names it in errors (class `mizu_error_not_portable` in the message).
pub fn message(x: &Robj, path: &str) -> Result<Vec<u8>> {
    // SAFETY: `x` is held (protected) by its Robj for the call.
    let value = unsafe { from_sexp(x.get(), path) }
        .map_err(|e| crate::rerr(format!("mizu_error_not_portable: {e}")))?;
    mizu_pool::wire::envelope::Envelope::value(&value)
        .map(|e| e.to_vec())
        .map_err(crate::rerr)
}

/// `x` as the bytes of a cross-language value message (for the cross-language golden corpus).
#[extendr]
fn xlang_dumps(x: Robj) -> Result<Raw> {
    Ok(Raw::from_bytes(&message(&x, "x")?))
}

/// The R value of the bytes of a cross-language value message (as Python sends them); a
/// malformed one is an error.
#[extendr]
fn xlang_loads(b: Raw) -> Result<Robj> {
    // Arrow parts are read in place from a 64-byte aligned copy, as from a region.
    let mut m = arrow_buffer::MutableBuffer::with_capacity(b.len());
    m.extend_from_slice(b.as_slice());
    received(&m.into())
}

extendr_module! {
    mod xvalue;
    fn xlang_dumps;
    fn xlang_loads;
}
