//! Typed map results written straight into shared memory: the caller allocates one output
//! region, every chunk task writes its elements' values at their positions, and the result is
//! a view of the region — no assembling copy in the caller.
//!
//! The region is an *output region* (`mizu_pool::wire::Region::write_at`): the chunk tasks write
//! disjoint ranges, and the caller reads only after every chunk task finished. Every chunk
//! task's message carries a raw view of the whole region (the *token*), which crosses by
//! reference like any unmodified view: the task holds a counted reference from the moment
//! its message exists until its view is collected, so the space cannot be reused under a
//! chunk still writing (a map that failed and dropped its region included). The message also
//! carries the region's descriptor: a token that arrived as a copy (not the output region) is
//! refused rather than written into.

use std::sync::Arc;

use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{DATAPTR, TYPEOF, XLENGTH};
use mizu_pool::wire::{Region, RegionDesc};

use crate::rerr;
use crate::view::VType;

/// Bytes of an output spec: the region descriptor, the type code, the element count.
const SPEC_BYTES: usize = 64 + 1 + 8;

/// The caller's output region.
struct OutVec {
    region: Arc<Region>,
    t: VType,
}

/// The type of `ptype` when map results of it can be written in place (fixed-size elements).
fn out_type(ptype: &Robj) -> Option<VType> {
    // SAFETY: TYPEOF reads any live SEXP; `ptype` is held by its handle.
    let t = VType::of(unsafe { TYPEOF(ptype.get()) })?;
    (t != VType::Str).then_some(t)
}

pub(crate) fn out_new(pool: Robj, ptype: Robj, n: f64) -> Result<Robj> {
    let Some(t) = out_type(&ptype) else {
        return Ok(Robj::from(()));
    };
    if !(n.is_finite() && n >= 0.0) {
        return Err(rerr("the element count must be a non-negative number"));
    }
    let len = (n as usize)
        .checked_mul(t.size())
        .ok_or_else(|| rerr("the output is too large"))?;
    if len < crate::payload::FLOOR {
        return Ok(Robj::from(()));
    }
    let region = Arc::new(
        crate::pool::with_data_pool(&pool, |dp| dp.alloc(len))?
            .map_err(rerr)?
            .commit(),
    );
    let mut spec = vec![0u8; SPEC_BYTES];
    region.describe().write_to(&mut spec[..64]);
    spec[64] = t as u8;
    spec[65..].copy_from_slice(&(n as u64).to_le_bytes());
    let token = crate::view::make(Region::buffer(&region), VType::Raw, false)?;
    let handle: Robj = ExternalPtr::new(OutVec { region, t }).into();
    let spec = List::from_values([token, Robj::from(spec.as_slice())]);
    Ok(List::from_values([handle, spec.into()]).into())
}

pub(crate) fn out_write(spec: Robj, start: f64, values: Robj) -> Result<()> {
    let bad = |why: &str| rerr(format!("malformed map output spec: {why}"));
    let parts = spec
        .as_list()
        .filter(|l| l.len() == 2)
        .ok_or_else(|| bad("not a list of a token and a descriptor"))?;
    let (token, meta) = (parts.elt(0)?, parts.elt(1)?);
    let s = meta.as_raw_slice().ok_or_else(|| bad("not a raw vector"))?;
    if s.len() != SPEC_BYTES {
        return Err(bad("wrong length"));
    }
    let desc = RegionDesc::read_from(&s[..64]).map_err(bad)?;
    let t = VType::from_code(s[64])
        .filter(|t| *t != VType::Str)
        .ok_or_else(|| bad("unknown type"))?;
    let n = u64::from_le_bytes(s[65..].try_into().expect("8 bytes"));
    // SAFETY: `token` is protected by its handle for the call.
    let region = match crate::view::shared(unsafe { token.get() }) {
        Some(crate::altrep::Shared::Elements(b)) => Region::containing(b.as_ptr())
            .filter(|(r, at)| *at == 0 && r.describe() == desc)
            .map(|(r, _)| r),
        _ => None,
    }
    .ok_or_else(|| bad("the output area did not arrive by reference"))?;
    let v = plain_vector(&values, t)?;
    // SAFETY: `v` is a live, non-ALTREP vector of type `t` (checked), held by `values`.
    let k = unsafe { XLENGTH(v) } as u64;
    if !(start.is_finite() && start >= 1.0) || (start as u64 - 1).saturating_add(k) > n {
        return Err(rerr(format!(
            "map output: {k} values at {start} do not fit {n} elements"
        )));
    }
    if region.len() as u64 != n * t.size() as u64 {
        return Err(bad("the region does not hold that many elements"));
    }
    let bytes = k as usize * t.size();
    // SAFETY: a plain vector's data is `k` elements of `t`, alive while `values` is.
    let data = unsafe { std::slice::from_raw_parts(DATAPTR(v).cast::<u8>(), bytes) };
    // SAFETY: the map gives every chunk task a range of elements of its own, and the caller
    // reads the region only after every chunk task finished; the token's counted reference
    // keeps the space from reuse meanwhile (see the module docs).
    unsafe { region.write_at((start as usize - 1) * t.size(), data) }.map_err(rerr)
}

pub(crate) fn out_view(handle: Robj) -> Result<Robj> {
    // SAFETY: `handle` is held by its Robj while the reference is used.
    let o = unsafe { crate::handle::ext_ref::<OutVec>(handle.get()) }
        .ok_or_else(|| rerr("not a map output handle"))?;
    crate::view::make(Region::buffer(&o.region), o.t, false)
}

/// `values` when it is a plain (not ALTREP) vector of type `t`.
fn plain_vector(values: &Robj, t: VType) -> Result<extendr_ffi::SEXP> {
    // SAFETY: TYPEOF/ALTREP read any live SEXP; `values` holds it.
    unsafe {
        let v = values.get();
        if TYPEOF(v) != t.sexptype() || extendr_ffi::ALTREP(v) != 0 {
            return Err(rerr("map output: values of the wrong type"));
        }
        Ok(v)
    }
}
