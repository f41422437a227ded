//! Reading an R payload (the layout: `codec.rs`): R's unserialization, then each out-of-band
//! buffer as a view where its placeholder was.

use std::ffi::CStr;

use arrow_buffer::Buffer;
use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{
    CAR, CDR, PRINTNAME, R_CHAR, R_ExternalPtrTag, R_NilValue, Rf_setAttrib, SET_VECTOR_ELT, SEXP,
    SEXPTYPE, TAG, TYPEOF, VECTOR_ELT, XLENGTH,
};

use mizu_pool::wire::oob;

use crate::codec::*;
use crate::encode::unserialize;
use crate::ffi;
use crate::payload::MAPPER;
use crate::view::{self, VType};

/// Which view a placeholder stands for.
fn placeholder_index(x: SEXP) -> Option<usize> {
    // SAFETY: reading the type, tag and symbol name of a live SEXP.
    unsafe {
        if TYPEOF(x) != SEXPTYPE::EXTPTRSXP {
            return None;
        }
        let tag = R_ExternalPtrTag(x);
        if TYPEOF(tag) != SEXPTYPE::SYMSXP {
            return None;
        }
        let name = CStr::from_ptr(R_CHAR(PRINTNAME(tag))).to_str().ok()?;
        name.strip_prefix(PLACEHOLDER)?.parse().ok()
    }
}

/// The view for placeholder `ph`, with the placeholder's attributes (set one by one, so R
/// checks each: a `dim` that does not fit is refused). For a data frame, each column gets the
/// attributes its carrier holds.
fn fill_in(ph: SEXP, views: &[Robj]) -> Result<SEXP> {
    let k = placeholder_index(ph).ok_or_else(|| bad("bad placeholder"))?;
    let v = views
        .get(k)
        .ok_or_else(|| bad(format!("placeholder {k} has no buffer")))?;
    // SAFETY: `v` and `ph` are live (protected by the caller); the R call's closure owns
    // nothing (SEXPs only), so R's error can jump out of it.
    unsafe {
        let vs = v.get();
        let carriers = extendr_ffi::R_ExternalPtrProtected(ph);
        let frame = TYPEOF(vs) == SEXPTYPE::VECSXP;
        if frame != (TYPEOF(carriers) == SEXPTYPE::VECSXP) {
            return Err(bad(format!("placeholder {k} does not match its buffer")));
        }
        if frame {
            if XLENGTH(carriers) != XLENGTH(vs) {
                return Err(bad(format!("placeholder {k}: columns do not match")));
            }
            if let Some(j) =
                (0..XLENGTH(vs)).find(|&j| TYPEOF(VECTOR_ELT(carriers, j)) != SEXPTYPE::EXTPTRSXP)
            {
                return Err(bad(format!("placeholder {k}: column {j} has no carrier")));
            }
        }
        // R checks each attribute as it is set; one that does not fit is reported as
        // malformed input below, not also printed by R.
        crate::rtry::try_r_quiet(move || {
            let set_attributes = |to: SEXP, from: SEXP| {
                let mut a = ffi::ATTRIB(from);
                while a != R_NilValue {
                    Rf_setAttrib(to, TAG(a), CAR(a));
                    a = CDR(a);
                }
            };
            if frame {
                for j in 0..XLENGTH(vs) {
                    set_attributes(VECTOR_ELT(vs, j), VECTOR_ELT(carriers, j));
                }
            }
            set_attributes(vs, ph);
            vs
        })
        .map_err(|_| bad("an attribute does not fit its vector"))
    }
}

fn fill_lists(x: SEXP, views: &[Robj], depth: usize) -> Result<()> {
    // SAFETY: `x` is a live list inside the (protected) decoded value.
    unsafe {
        if TYPEOF(x) != SEXPTYPE::VECSXP || depth > MAX_DEPTH {
            return Ok(());
        }
        for i in 0..XLENGTH(x) {
            let e = VECTOR_ELT(x, i);
            if TYPEOF(e) == SEXPTYPE::EXTPTRSXP && placeholder_index(e).is_some() {
                SET_VECTOR_ELT(x, i, fill_in(e, views)?);
            } else {
                fill_lists(e, views, depth + 1)?;
            }
        }
    }
    Ok(())
}

/// For a payload in the compact encoding: the value, fresh and unprotected (the caller
/// protects it before anything allocates), without an R handle (see `handle.rs` for why
/// that matters). `None` for any other payload: use [`decode`].
pub fn decode_small(buf: &Buffer) -> Option<Result<SEXP>> {
    let b = buf.as_slice();
    (b.first() == Some(&TAG_SMALL)).then(|| {
        crate::small_read::decode(&b[1..]).ok_or_else(|| bad("the compact encoding cannot be read"))
    })
}

/// Releases the region references written inside a payload nobody will read (the runtime's
/// discard hook, `mizu_pool::set_discard_hook`): each holds a count of its region, taken by
/// the sender (`Region::share`), that only a decoder adopting it would give back. Touches no
/// R API (it may run on the runtime's threads); malformed input releases nothing.
pub fn release_refs(b: &[u8]) {
    for d in oob::references(b) {
        // Adopting takes the reference over; dropping the region gives it back.
        drop(MAPPER.adopt(&d));
    }
}

/// Decodes a received payload. Input is untrusted: every offset is checked.
pub fn decode(buf: Buffer) -> Result<Decoded> {
    crate::altrep::collect_garbage_if_due();
    let b = buf.as_slice();
    match b.first() {
        Some(&TAG_PLAIN) => Ok(Decoded::Value(unserialize(&b[1..])?)),
        Some(&mizu_pool::wire::envelope::TAG) => {
            crate::xvalue_in::received(&buf).map(Decoded::Value)
        }
        Some(&TAG_SMALL) => match crate::small_read::decode(&b[1..]) {
            // SAFETY: a fresh value; Robj protects it.
            Some(v) => Ok(Decoded::Value(unsafe { Robj::from_sexp(v) })),
            None => Err(bad("the compact encoding cannot be read")),
        },
        // R strings cannot hold a NUL: one in a message is shown as U+FFFD, as bad UTF-8 is.
        Some(&TAG_TEXT) => Ok(Decoded::Text(crate::xvalue_in::readable(
            &String::from_utf8_lossy(&b[1..]),
        ))),
        Some(&TAG_SMALL_BUFFERS) => {
            let layout = oob::parse(b).map_err(bad)?;
            let views = buffer_views(&buf, layout.entries)?;
            // SAFETY: each view is protected by its Robj in `views` while the value is read.
            let sexps: Vec<SEXP> = views.iter().map(|v| unsafe { v.get() }).collect();
            match crate::small_read::decode_with(&b[layout.body], &sexps) {
                // SAFETY: a fresh value; Robj protects it.
                Some(v) => Ok(Decoded::Value(unsafe { Robj::from_sexp(v) })),
                None => Err(bad("the compact encoding cannot be read")),
            }
        }
        Some(&TAG_BUFFERS) => {
            let layout = oob::parse(b).map_err(bad)?;
            let views = buffer_views(&buf, layout.entries)?;
            let value = unserialize(&b[layout.body])?;
            // SAFETY: `value` is protected by its Robj.
            let root = unsafe { value.get() };
            if placeholder_index(root).is_some() {
                // SAFETY: the view is protected by `views` until wrapped.
                return Ok(Decoded::Value(unsafe {
                    Robj::from_sexp(fill_in(root, &views)?)
                }));
            }
            fill_lists(root, &views, 0)?;
            Ok(Decoded::Value(value))
        }
        Some(t) => Err(bad(format!("unknown tag {t:#04x}"))),
        None => Err(bad("empty")),
    }
}

/// The views of a payload's out-of-band buffers (`entries`, parsed from `buf`), in order.
fn buffer_views(buf: &Buffer, entries: Vec<oob::Entry>) -> Result<Vec<Robj>> {
    // Every reference is adopted first (and given back if anything fails).
    let received = oob::receive(buf, entries, &MAPPER).map_err(bad)?;
    let mut views = Vec::with_capacity(received.len());
    // Data frame values already read for a column sent on by reference (every column
    // of one frame refers to the same value).
    let mut tables: Vec<(usize, arrow_array::RecordBatch, Buffer)> = Vec::new();
    for (i, r) in received.into_iter().enumerate() {
        let kind = r.code;
        let t = match kind {
            ARROW | FRAME | FRAME_COL => None,
            c => Some(
                VType::from_wire(c)
                    .ok_or_else(|| bad(format!("buffer {i} has unknown type {kind}")))?,
            ),
        };
        if (kind == FRAME && r.by_ref) || r.writable {
            return Err(bad(format!("buffer {i}: not a buffer an R payload has")));
        }
        let (bytes, copy) = (r.bytes, !r.by_ref);
        views.push(match (t, r.column) {
            (Some(t), _) => view::make(bytes, t, copy)?,
            (None, _) if kind == ARROW => crate::arrow_in::view(bytes, copy)?,
            (None, Some(col)) => {
                let key = bytes.as_ptr() as usize;
                let k = match tables.iter().position(|(a, ..)| *a == key) {
                    Some(k) => k,
                    None => {
                        let (batch, src) = crate::arrow_in::table(bytes)?;
                        tables.push((key, batch, src));
                        tables.len() - 1
                    }
                };
                let (_, batch, src) = &tables[k];
                let j = usize::try_from(col)
                    .ok()
                    .filter(|&j| j < batch.num_columns())
                    .ok_or_else(|| bad(format!("reference {i}: no column {col}")))?;
                let s = crate::altrep::Source {
                    bytes: src.clone(),
                    col: Some(j as u32),
                };
                crate::arrow_in::column(batch.column(j), s, false)?
            }
            (None, None) => {
                let cols = crate::arrow_in::frame(bytes, true)?;
                Robj::from(List::from_values(cols))
            }
        });
    }
    Ok(views)
}
