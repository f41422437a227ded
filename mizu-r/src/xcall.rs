//! Cross-language calls and messages: the envelope of a call of a Python function (or of a
//! chunk of a map over Python workers), a channel message to a Python peer, and the
//! `xlang_dumps`/`xlang_loads` and `xlang_task_dumps`/`xlang_task_loads` test hooks.

use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::SEXP;
use mizu_pool::wire::Value;

use crate::xvalue::from_sexp;
use crate::xvalue_in::received;

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

pub(crate) fn xlang_dumps(x: Robj) -> Result<Raw> {
    Ok(Raw::from_bytes(&message(&x, "x")?))
}

pub(crate) fn xlang_loads(b: Raw) -> Result<Robj> {
    // Arrow parts are read in place from a 64-byte aligned copy, as from a region.
    let mut m = arrow_buffer::MutableBuffer::with_capacity(b.len());
    m.extend_from_slice(b.as_slice());
    received(&m.into())
}

/// The payload of a task calling `call` (a `mizu_call()`), of a map chunk over `elements`
/// when that is a list: the seeds of the R fuzz harness's task reader.
pub(crate) fn xlang_task_dumps(call: Robj, elements: Robj) -> Result<Raw> {
    // SAFETY: R's main thread; `call` and `elements` are arguments of the .Call, protected
    // by R until it returns, and the payload is written before then.
    let env = unsafe {
        if elements.is_null() {
            call_envelope(call.get(), extendr_ffi::R_NilValue)
        } else {
            chunk_envelope(
                call.get(),
                extendr_ffi::R_NilValue,
                elements.get(),
                Some(7.0),
                0.0,
            )
        }
    }
    .map_err(crate::rerr)?;
    Ok(Raw::from_bytes(&env.to_vec()))
}

/// What an R worker makes of a cross-language task payload (bytes as Python sends them),
/// without running it: the message it would dispatch (`worker::xlang_message`). Malformed
/// bytes are an error saying the payload cannot be read.
pub(crate) fn xlang_task_loads(b: Raw) -> Result<Robj> {
    let mut m = arrow_buffer::MutableBuffer::with_capacity(b.len());
    m.extend_from_slice(b.as_slice());
    let buf: arrow_buffer::Buffer = m.into();
    let _reading = crate::xvalue_in::Reading::payload(&buf);
    let t = mizu_pool::wire::envelope::read_task(&buf, Some(&crate::payload::MAPPER))
        .map_err(|e| crate::rerr(format!("cannot read a cross-language task: {e}")))?;
    crate::xvalue_in::call_names(&t.target, &t.kwargs)?;
    crate::worker::xlang_message(t)
}
