//! Cross-language values into R objects: received arrays become views of the shared memory
//! they arrived in (see `arrow_in`); the mapping is `docs/interop.md`.

use arrow_array::cast::AsArray;
use arrow_array::types::DurationMicrosecondType;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_schema::Field;
use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::SEXP;
use mizu_pool::wire::Value;
use mizu_pool::wire::rmeta::{self, RType};

use crate::altrep::Source;

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

/// Refuses received strings that hold a NUL byte, before R is asked to make them: R strings
/// cannot hold one (R would raise its own error through Rust), and data must not change on the
/// way. `what` names them in the error.
pub(crate) fn no_nul<S: AsRef<str>>(what: &str, strings: &[S]) -> Result<()> {
    match strings.iter().any(|s| s.as_ref().contains('\0')) {
        true => Err(rerr(format!(
            "{what} holds a NUL byte, which R strings cannot"
        ))),
        false => Ok(()),
    }
}

/// A received call's function name (or source) and argument names, checked before R is
/// asked to make them (see [`no_nul`]).
pub(crate) fn call_names(
    target: &mizu_pool::wire::CallTarget,
    kwargs: &[(String, Value)],
) -> Result<()> {
    let (mizu_pool::wire::CallTarget::Name(t) | mizu_pool::wire::CallTarget::Source(t)) = target;
    no_nul("the call's target", &[t])?;
    no_nul(
        "an argument name",
        &kwargs.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
    )
}

/// A received diagnostic (an error's message, class, call or traceback) as R can hold it: a
/// NUL is shown as U+FFFD, as bad UTF-8 is.
pub(crate) fn readable(s: &str) -> String {
    s.replace('\0', "\u{fffd}")
}

/// [`readable`] as an R string.
fn shown(s: &str) -> Robj {
    Robj::from(readable(s).as_str())
}

/// A received cross-language outcome payload: the value, or for a task's failure the
/// condition the caller raises (classes `mizu_error_python`, `mizu_error_task`, `mizu_error`,
/// `error`, `condition`; fields `type`, `classes`, `traceback`).
pub fn received(payload: &Buffer) -> Result<Robj> {
    use mizu_pool::wire::envelope::{self, Received};
    let _reading = Reading::payload(payload);
    match envelope::read_with(payload, Some(&crate::payload::MAPPER)).map_err(rerr)? {
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
            let classes: Vec<String> = e.classes.iter().map(|c| readable(c)).collect();
            let mut l: Robj = List::from_values([
                shown(&message),
                Robj::from(()),
                shown(&first),
                Robj::from(classes),
                shown(&e.traceback),
                shown(&e.call),
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
        Value::Str(s) => {
            no_nul("a string", &[&s])?;
            Robj::from(s.as_str())
        }
        Value::Bytes(b) => Robj::from(Raw::from_bytes(b.as_slice())),
        Value::List(items) => {
            let v = items.into_iter().map(to_r).collect::<Result<Vec<_>>>()?;
            List::from_values(v).into()
        }
        Value::Dict(kv) => {
            let (names, vals): (Vec<String>, Vec<Value>) = kv.into_iter().unzip();
            no_nul("a dict key", &names)?;
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
            let mut l: Robj = List::from_values([shown(&message), shown(&traceback)]).into();
            l.set_names(["message", "traceback"])?;
            let type_name = readable(&type_name);
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
pub(crate) fn attributes(
    field: &Field,
    array: &ArrayRef,
    t: &RType,
) -> Result<Vec<(&'static str, Robj)>> {
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
            no_nul("a factor level", &levels)?;
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
            no_nul("a time zone", &[tz])?;
            a.push(("tzone", Robj::from(tz.as_str())));
            a.push(("class", Robj::from(["POSIXct", "POSIXt"])));
        }
        RType::Difftime { units } => {
            no_nul("a difftime unit", &[units])?;
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
    no_nul("a column name", &names)?;
    let mut df: Robj = List::from_values(cols).into();
    df.set_names(names)?;
    df.set_attrib("row.names", [i32::MIN, -(batch.num_rows() as i32)])?;
    df.set_class(["data.frame"])?;
    Ok(df)
}

/// [`to_r`] as a raw `SEXP`, protected once (the caller unprotects it): scalars are made
/// without an R handle.
///
/// # Safety
/// R's main thread.
pub unsafe fn to_sexp_protected(v: Value) -> Result<SEXP> {
    use extendr_ffi::{R_NilValue, Rf_ScalarInteger, Rf_protect};
    if let Value::Str(s) = &v {
        no_nul("a string", &[s])?;
    }
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
