//! Frames: what goes into a ring slot. A 16-byte header, then either the encoded value
//! (inline) or a 64-byte descriptor of the region holding it.

use arrow_buffer::Buffer;

use crate::error::{Result, WireError, malformed};
use crate::store::{DataPool, Mapper, Region, RegionDesc};
use crate::value::{Encoded, Value, decode, decode_slice, encode};

/// `b"MZ"`.
pub const FRAME_MAGIC: [u8; 2] = *b"MZ";
/// Frame format version.
pub const FRAME_VERSION: u8 = 1;
/// Header bytes.
pub const HEADER_LEN: usize = 16;
/// Descriptor bytes of a region frame.
pub const DESC_LEN: usize = 64;

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The value follows the header.
    Inline = 1,
    /// A region descriptor follows the header; the value is in the region.
    Region = 2,
}

/// A parsed frame, borrowing the slot.
#[derive(Debug)]
pub struct FrameRef<'a> {
    /// The caller-defined word (task id, element index, ...).
    pub aux: u64,
    /// Where the value is.
    pub body: Body<'a>,
}

/// A frame's payload.
#[derive(Debug)]
pub enum Body<'a> {
    /// The encoded value itself.
    Inline(&'a [u8]),
    /// A region reference (carrying one reference count).
    Region(RegionDesc),
}

fn header(out: &mut [u8], kind: Kind, len: usize, aux: u64) {
    out[0..2].copy_from_slice(&FRAME_MAGIC);
    out[2] = FRAME_VERSION;
    out[3] = kind as u8;
    out[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    out[8..16].copy_from_slice(&aux.to_le_bytes());
}

/// Writes an inline frame for an encoded value; `None` if it does not fit in `out`.
pub fn write_inline(enc: &Encoded, aux: u64, out: &mut [u8]) -> Option<usize> {
    let n = HEADER_LEN + enc.len();
    if n > out.len() || enc.len() > u32::MAX as usize {
        return None;
    }
    header(out, Kind::Inline, enc.len(), aux);
    enc.write_to(&mut out[HEADER_LEN..n]);
    Some(n)
}

/// Writes a region frame passing one new reference to `region` (a re-send never copies).
pub fn write_region(region: &Region, aux: u64, out: &mut [u8]) -> Result<usize> {
    let n = HEADER_LEN + DESC_LEN;
    if out.len() < n {
        return Err(WireError::Unsupported(format!(
            "a {}-byte slot cannot hold a {n}-byte region frame",
            out.len()
        )));
    }
    let d = region.share();
    header(out, Kind::Region, DESC_LEN, aux);
    d.write_to(&mut out[HEADER_LEN..n]);
    Ok(n)
}

/// Encodes `v` into a frame in `out`: inline when it fits, else through a region of `pool`.
pub fn write_value(v: &Value, aux: u64, out: &mut [u8], pool: &DataPool) -> Result<usize> {
    let enc = encode(v)?;
    if let Some(n) = write_inline(&enc, aux, out) {
        return Ok(n);
    }
    let mut r = pool.alloc(enc.len())?;
    enc.write_to(r.bytes_mut());
    let region = r.commit();
    write_region(&region, aux, out)
}

/// Parses a frame's header and body (no value decoding yet).
pub fn read(bytes: &[u8]) -> Result<FrameRef<'_>> {
    if bytes.len() < HEADER_LEN {
        return Err(WireError::Truncated {
            what: "frame header",
            offset: 0,
            needed: HEADER_LEN,
            available: bytes.len(),
        });
    }
    if bytes[0..2] != FRAME_MAGIC {
        return Err(malformed(
            0,
            format!("bad frame magic {:02x}{:02x}", bytes[0], bytes[1]),
        ));
    }
    if bytes[2] != FRAME_VERSION {
        return Err(malformed(
            2,
            format!(
                "frame version {} (this build reads {FRAME_VERSION})",
                bytes[2]
            ),
        ));
    }
    let len = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
    let aux = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let body = &bytes[HEADER_LEN..];
    if len > body.len() {
        return Err(WireError::Truncated {
            what: "frame body",
            offset: HEADER_LEN,
            needed: len,
            available: body.len(),
        });
    }
    let body = &body[..len];
    let body = match bytes[3] {
        1 => Body::Inline(body),
        2 => {
            if len != DESC_LEN {
                return Err(malformed(
                    4,
                    format!("region descriptor of {len} bytes, expected {DESC_LEN}"),
                ));
            }
            Body::Region(RegionDesc::read_from(body).map_err(|why| malformed(HEADER_LEN, why))?)
        }
        k => return Err(malformed(3, format!("unknown frame kind {k}"))),
    };
    Ok(FrameRef { aux, body })
}

/// A received value, with the region it lives in (if any) so it can be re-sent by reference.
#[derive(Debug)]
pub struct Received {
    /// The frame's aux word.
    pub aux: u64,
    /// The value; large parts are views into the region.
    pub value: Value,
    /// The region holding the value (one counted reference), for [`write_region`].
    pub region: Option<std::sync::Arc<Region>>,
}

/// Reads and decodes a frame, adopting the reference a region frame carries.
pub fn read_value(bytes: &[u8], mapper: &Mapper) -> Result<Received> {
    let f = read(bytes)?;
    match f.body {
        Body::Inline(b) => Ok(Received {
            aux: f.aux,
            value: decode_slice(b)?,
            region: None,
        }),
        Body::Region(d) => {
            let region = std::sync::Arc::new(mapper.adopt(&d)?);
            let buf: Buffer = Region::buffer(&region);
            Ok(Received {
                aux: f.aux,
                value: decode(&buf)?,
                region: Some(region),
            })
        }
    }
}
