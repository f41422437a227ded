//! Decoding a [`Value`] from bytes, large byte strings and Arrow data as views of them; bytes
//! from another process are checked before anything is built on them.

use std::sync::Arc;

use arrow_buffer::{Buffer, MutableBuffer};
use arrow_schema::Schema;

use crate::checked::validated;
use crate::error::{Result, WireError, malformed};

use super::arrow::decode_arrow;
use super::tree::{CallTarget, Value};
use crate::compact::{MAX_DEPTH, Reader, form, tag};

/// Decodes a value from `buf`, whose start is the value's start. Large byte strings and Arrow
/// data are views into `buf` (no copy) when `buf` is 64-byte aligned, as region buffers are;
/// Arrow data in a misaligned `buf` is refused (copy it into an aligned buffer first, as
/// [`decode_slice`] does).
pub fn decode(buf: &Buffer) -> Result<Value> {
    decode_in(buf, None, false)
}

/// [`decode`] for a payload in shared memory: references to values in other regions (tag
/// `0E`) are adopted with `mapper` (their arrays view that region), and every array or table
/// that starts 64-byte aligned is a [`Value::Shared`] of its standalone encoding, which can
/// be sent on by reference.
pub fn decode_shared(buf: &Buffer, mapper: &crate::store::Mapper) -> Result<Value> {
    decode_in(buf, Some(mapper), true)
}

pub(crate) fn decode_in(
    buf: &Buffer,
    mapper: Option<&crate::store::Mapper>,
    shared: bool,
) -> Result<Value> {
    let mut d = Decoder::new(buf, mapper, shared);
    let v = d.value(0)?;
    if d.r.pos != buf.len() {
        return Err(malformed(
            d.r.pos,
            format!("{} trailing bytes after the value", buf.len() - d.r.pos),
        ));
    }
    Ok(v)
}

/// Decodes a value from plain bytes, copying them into an aligned buffer first (for small
/// inline frames).
pub fn decode_slice(bytes: &[u8]) -> Result<Value> {
    let mut m = MutableBuffer::with_capacity(bytes.len());
    m.extend_from_slice(bytes);
    decode(&m.into())
}

struct Decoder<'a> {
    buf: &'a Buffer,
    r: Reader<'a>,
    /// Adopts the regions that references name (none: references are refused).
    mapper: Option<&'a crate::store::Mapper>,
    /// Aligned arrays and tables are returned as [`Value::Shared`].
    shared: bool,
    /// The bytes were decoded and validated by this process before (see [`validated`]): the
    /// arrays' contents are not checked again.
    trusted: bool,
}

impl<'a> Decoder<'a> {
    fn new(buf: &'a Buffer, mapper: Option<&'a crate::store::Mapper>, shared: bool) -> Self {
        Decoder {
            buf,
            r: Reader::new(buf.as_slice(), 0, 0),
            mapper,
            shared,
            trusted: false,
        }
    }

    fn take(&mut self, what: &'static str, n: usize) -> Result<&'a [u8]> {
        self.r.take(what, n)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        self.r.u8(what)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        self.r.u64(what)
    }

    fn varint(&mut self, what: &'static str) -> Result<u64> {
        self.r.varint(what)
    }

    /// A length that must fit in what is left (never allocate for a claimed size).
    fn len(&mut self, what: &'static str) -> Result<usize> {
        self.r.len(what)
    }

    /// A count of items, each at least one byte long.
    fn count(&mut self, what: &'static str) -> Result<usize> {
        self.r.len(what)
    }

    fn string(&mut self, what: &'static str) -> Result<String> {
        self.r.str(what).map(str::to_owned)
    }

    fn skip_padding(&mut self) -> Result<()> {
        self.r.skip_padding()
    }

    fn value(&mut self, depth: usize) -> Result<Value> {
        if depth > MAX_DEPTH {
            return Err(WireError::TooDeep {
                offset: self.r.pos,
                max: MAX_DEPTH,
            });
        }
        let at = self.r.pos;
        Ok(match self.u8("tag")? {
            tag::NONE => Value::None,
            tag::FALSE => Value::Bool(false),
            tag::TRUE => Value::Bool(true),
            tag::INT => Value::Int(self.u64("int64")? as i64),
            tag::FLOAT => Value::Float(f64::from_bits(self.u64("float64")?)),
            tag::COMPLEX => Value::Complex(
                f64::from_bits(self.u64("complex")?),
                f64::from_bits(self.u64("complex")?),
            ),
            tag::STR => Value::Str(self.string("string")?),
            tag::BYTES => {
                let n = self.r.bytes_item("bytes")?.len();
                Value::Bytes(self.buf.slice_with_length(self.r.pos - n, n))
            }
            tag::LIST => {
                let n = self.count("list length")?;
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(self.value(depth + 1)?);
                }
                Value::List(items)
            }
            tag::DICT => Value::Dict(self.pairs(depth)?),
            tag::ERROR => Value::Error {
                type_name: self.string("error type")?,
                message: self.string("error message")?,
                traceback: self.string("error traceback")?,
            },
            tag::CALL => {
                let form_at = self.r.pos;
                let target = match self.u8("call form")? {
                    form::NAME => CallTarget::Name(self.string("call target")?),
                    form::SOURCE => CallTarget::Source(self.string("call target")?),
                    f => return Err(malformed(form_at, format!("unknown call form {f}"))),
                };
                let n = self.count("call argument count")?;
                let mut args = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    args.push(self.value(depth + 1)?);
                }
                Value::Call {
                    target,
                    args,
                    kwargs: self.pairs(depth)?,
                }
            }
            t @ (tag::ARRAY | tag::TABLE) => {
                let n = self.len("arrow stream length")?;
                self.skip_padding()?;
                self.r.need("arrow stream", n)?;
                let stream = self.buf.slice_with_length(self.r.pos, n);
                let batch = decode_arrow(stream, self.r.pos, self.trusted)?;
                self.r.pos += n;
                let v = if t == tag::TABLE {
                    Value::Table(batch)
                } else {
                    if batch.num_columns() != 1 {
                        return Err(malformed(
                            at,
                            format!("an array value has {} columns", batch.num_columns()),
                        ));
                    }
                    Value::Array {
                        field: batch.schema().field(0).clone().into(),
                        array: batch.column(0).clone(),
                    }
                };
                if self.shared && at.is_multiple_of(64) {
                    // Sent on by reference, these bytes come back: they are known good.
                    if let Some((r, off)) =
                        crate::store::Region::containing(self.buf.as_ptr().wrapping_add(at))
                    {
                        validated::insert(validated::key(r.place(), off, self.r.pos - at));
                    }
                    Value::Shared {
                        bytes: self.buf.slice_with_length(at, self.r.pos - at),
                        value: Box::new(v),
                    }
                } else {
                    v
                }
            }
            tag::ALIGNED => {
                let n = self.len("alignment length")?;
                if n >= 64 {
                    return Err(malformed(at, "alignment padding of 64 bytes or more"));
                }
                let pad_at = self.r.pos;
                if self.take("alignment padding", n)?.iter().any(|&b| b != 0) {
                    return Err(malformed(pad_at, "non-zero alignment padding"));
                }
                if !matches!(self.buf.get(self.r.pos), Some(&(tag::ARRAY | tag::TABLE))) {
                    return Err(malformed(
                        self.r.pos,
                        "alignment padding before a non-Arrow value",
                    ));
                }
                return self.value(depth);
            }
            tag::SHARED => {
                let Some(mapper) = self.mapper else {
                    return Err(malformed(
                        at,
                        "a shared value outside a pool or channel payload",
                    ));
                };
                let d = self.take("shared region descriptor", 64)?;
                let desc = crate::store::RegionDesc::read_from(d)
                    .map_err(|why| malformed(at + 1, format!("shared value: {why}")))?;
                let vat = self.u64("shared value offset")?;
                let vlen = self.u64("shared value length")?;
                // Adopting validates the descriptor and takes its reference over.
                let region = Arc::new(mapper.adopt(&desc)?);
                let whole = crate::store::Region::buffer(&region);
                let end = vat.checked_add(vlen).filter(|&e| e <= whole.len() as u64);
                if !vat.is_multiple_of(64) || end.is_none() || vlen == 0 {
                    return Err(malformed(
                        at,
                        format!("shared value {vat}+{vlen} is not an aligned range of its region"),
                    ));
                }
                let bytes = whole.slice_with_length(vat as usize, vlen as usize);
                let key = validated::key(region.place(), vat as usize, vlen as usize);
                let mut inner = Decoder::new(&bytes, None, false);
                inner.trusted = validated::contains(&key);
                let v = inner.value(depth + 1)?;
                if inner.r.pos != bytes.len() || !matches!(v, Value::Array { .. } | Value::Table(_))
                {
                    return Err(malformed(
                        at,
                        "a shared value that is not one array or table",
                    ));
                }
                validated::insert(key);
                Value::Shared {
                    bytes,
                    value: Box::new(v),
                }
            }
            t => return Err(malformed(at, format!("unknown tag {t:#04x}"))),
        })
    }

    fn pairs(&mut self, depth: usize) -> Result<Vec<(String, Value)>> {
        let n = self.count("dict length")?;
        let mut items = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let k = self.string("dict key")?;
            items.push((k, self.value(depth + 1)?));
        }
        Ok(items)
    }
}

/// The array or table of a standalone encoding this process received in shared memory (the
/// `bytes` of a [`Value::Shared`]), decoded again as views of those bytes: for a binding that
/// sends a received value on by reference and needs the value beside it. Bytes this process
/// already validated are not validated again, so this costs per column, not per element.
pub fn decode_received(bytes: &Buffer) -> Result<Value> {
    let trusted = crate::store::Region::containing(bytes.as_ptr())
        .is_some_and(|(r, at)| validated::contains(&validated::key(r.place(), at, bytes.len())));
    let mut d = Decoder::new(bytes, None, false);
    d.trusted = trusted;
    let v = d.value(0)?;
    if d.r.pos != bytes.len() || !matches!(v, Value::Array { .. } | Value::Table(_)) {
        return Err(malformed(0, "not one array or table value"));
    }
    Ok(v)
}

/// The schema of an encoded array (`0C`) or table (`0D`) value, read from its first IPC
/// message alone (no data is decoded or validated): for a binding that checks that what it
/// would send on is still what it received.
pub fn arrow_schema(bytes: &[u8]) -> Result<Arc<Schema>> {
    if !matches!(bytes.first(), Some(&(tag::ARRAY | tag::TABLE))) {
        return Err(malformed(0, "not an array or table value"));
    }
    let buf = Buffer::from_slice_ref(&bytes[..bytes.len().min(1 << 20)]);
    let mut d = Decoder::new(&buf, None, false);
    d.r.pos = 1;
    d.varint("arrow stream length")?;
    d.skip_padding()?;
    let at = d.r.pos;
    let b = &buf.as_slice()[at..];
    let head = b
        .get(..8)
        .ok_or_else(|| malformed(at, "arrow stream: truncated"))?;
    if head[..4] != [0xff; 4] {
        return Err(malformed(
            at,
            "arrow stream: message without continuation marker",
        ));
    }
    let meta_len = usize::try_from(i32::from_le_bytes(head[4..8].try_into().expect("4 bytes")))
        .ok()
        .filter(|&m| 8 + m <= b.len())
        .ok_or_else(|| malformed(at, "arrow stream: metadata length out of range"))?;
    let msg = arrow_ipc::root_as_message(&b[8..8 + meta_len])
        .map_err(|e| malformed(at, format!("arrow stream: {e}")))?;
    let s = msg
        .header_as_schema()
        .ok_or_else(|| malformed(at, "arrow stream: no schema first"))?;
    Ok(Arc::new(arrow_ipc::convert::try_fb_to_schema(s)?))
}
