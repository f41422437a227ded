//! Entry points on values as such: `mizu_share()`, what a process holds for reuse, and the
//! payload format's test hooks.

use arrow_buffer::Buffer;
use extendr_api::Result;
use extendr_api::prelude::*;
use std::sync::Arc;

use mizu_pool::Fill;
// The layout's parser, its entry size, reference records and flags (see `mizu_pool::wire::oob`).
use mizu_pool::wire::Region;

use crate::codec::*;
use crate::decode::decode;
use crate::encode::{How, Outgoing};
use crate::payload::MAPPER;

pub(crate) fn codec_roundtrip(value: Robj) -> Result<Robj> {
    let out = Outgoing::encode(&value)?;
    match decode(Buffer::from_vec(out.to_vec()))? {
        Decoded::Value(v) => Ok(v),
        Decoded::Text(t) => Err(crate::rerr(t)),
    }
}

pub(crate) fn share_value(value: Robj) -> Result<Robj> {
    let out = Outgoing::encode(&value)?;
    let n = out.size();
    let region = mizu_pool::share::filled(n, |b| out.fill(b));
    crate::spill::warn_if_spilled();
    let region = region.map_err(|e| crate::rerr(format!("mizu_share: {e}")))?;
    let region = Arc::new(region);
    match decode(Region::buffer(&region).slice_with_length(0, n))? {
        Decoded::Value(v) => Ok(v),
        Decoded::Text(t) => Err(crate::rerr(t)),
    }
}

pub(crate) fn release_shared() {
    mizu_pool::share::release();
}

pub(crate) fn codec_encode(value: Robj) -> Result<Raw> {
    Ok(Raw::from_bytes(&Outgoing::encode(&value)?.to_vec()))
}

pub(crate) fn codec_arrow_frames(value: Robj) -> Result<List> {
    let out = Outgoing::encode(&value)?;
    let mut frames = Vec::new();
    for b in out.buffers() {
        if let How::Arrow(col) = &b.how {
            // As written into a payload, read back (so arrow checks it) and framed.
            let mut bytes = arrow_buffer::MutableBuffer::from_len_zeroed(col.len());
            col.write(bytes.as_slice_mut());
            let value = mizu_pool::wire::decode(&bytes.into()).map_err(bad)?;
            let enc = mizu_pool::wire::encode(&value).map_err(bad)?;
            let mut f = vec![0u8; enc.len() + 16];
            mizu_pool::wire::frame::write_inline(&enc, 0, &mut f);
            frames.push(Raw::from_bytes(&f));
        }
    }
    Ok(List::from_values(frames))
}

pub(crate) fn codec_arrow_read(frame: Raw) -> Result<Robj> {
    let f = mizu_pool::wire::frame::read(frame.as_slice()).map_err(bad)?;
    let mizu_pool::wire::frame::Body::Inline(value) = f.body else {
        return Err(bad("not an inline frame"));
    };
    crate::arrow_in::view(Buffer::from_slice_ref(value), true)
}

pub(crate) fn release_mappings() {
    MAPPER.release_unused();
}

pub(crate) fn give_back_idle() {
    mizu_pool::machine::give_back_idle_now();
}

pub(crate) fn codec_size(value: Robj) -> Result<f64> {
    Ok(Outgoing::encode(&value)?.size() as f64)
}

pub(crate) fn codec_decode(bytes: Raw) -> Result<Robj> {
    match decode(Buffer::from_slice_ref(bytes.as_slice()))? {
        Decoded::Value(v) => Ok(v),
        Decoded::Text(t) => Ok(Robj::from(t)),
    }
}
