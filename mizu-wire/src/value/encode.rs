//! Encoding a [`Value`] as a scatter list ([`Encoded`]): small items copied, large byte
//! strings and Arrow bodies referenced, so writing a value into a region is one copy.

use std::sync::Arc;

use arrow_array::{Array, RecordBatch};
use arrow_buffer::Buffer;
use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow_schema::Schema;

use crate::checked::written;
use crate::error::{Result, WireError};

use super::tree::{CallTarget, Value};
use crate::compact::{ALIGNED_BYTES_MIN, MAX_DEPTH, form, tag};

/// An encoded value as a scatter list (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Encoded {
    parts: Vec<Part>,
    cur: Vec<u8>,
    len: usize,
    /// Where the aligned arrays and tables are (offset, length), made from arrays this
    /// process holds (see [`written`]).
    arrow: Vec<(usize, usize)>,
}

#[derive(Debug, Clone)]
enum Part {
    Owned(Vec<u8>),
    Shared(Buffer),
}

impl Encoded {
    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was encoded.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn put(&mut self, b: &[u8]) {
        self.cur.extend_from_slice(b);
        self.len += b.len();
    }

    fn byte(&mut self, b: u8) {
        self.put(&[b]);
    }

    fn varint(&mut self, v: u64) {
        let (b, n) = crate::compact::varint(v);
        self.put(&b[..n]);
    }

    fn pad_to_align(&mut self) {
        let pad = self.len.next_multiple_of(64) - self.len;
        self.put(&[0u8; 64][..pad]);
    }

    fn share(&mut self, b: Buffer) {
        if b.len() < 4096 {
            self.put(b.as_slice());
            return;
        }
        if !self.cur.is_empty() {
            self.parts.push(Part::Owned(std::mem::take(&mut self.cur)));
        }
        self.len += b.len();
        self.parts.push(Part::Shared(b));
    }

    fn string(&mut self, s: &str) {
        self.varint(s.len() as u64);
        self.put(s.as_bytes());
    }

    fn finish(mut self) -> Self {
        if !self.cur.is_empty() {
            self.parts.push(Part::Owned(std::mem::take(&mut self.cur)));
        }
        self
    }

    /// Writes the value into `out` (at least [`Encoded::len`] bytes; its start must be
    /// 64-byte aligned for receivers to view large parts in place). One copy per byte.
    pub fn write_to(&self, out: &mut [u8]) {
        assert!(
            out.len() >= self.len,
            "output of {} bytes for a {}-byte value",
            out.len(),
            self.len
        );
        let mut at = 0;
        for p in &self.parts {
            let b: &[u8] = match p {
                Part::Owned(v) => v,
                Part::Shared(b) => b.as_slice(),
            };
            crate::copy::copy_large(&mut out[at..at + b.len()], b);
            at += b.len();
        }
        written::wrote(out.as_ptr(), &self.arrow);
    }

    /// [`Encoded::write_to`], except the bytes of referenced buffers starting at one of the
    /// addresses in `skip` (their ranges in `out` are left as they are, for the caller to
    /// write).
    pub fn write_to_except(&self, out: &mut [u8], skip: &[*const u8]) {
        assert!(out.len() >= self.len, "output too short for the value");
        let mut at = 0;
        for p in &self.parts {
            let b: &[u8] = match p {
                Part::Owned(v) => v,
                Part::Shared(b) => b.as_slice(),
            };
            if !(matches!(p, Part::Shared(_)) && skip.contains(&b.as_ptr())) {
                crate::copy::copy_large(&mut out[at..at + b.len()], b);
            }
            at += b.len();
        }
    }

    /// For an encoded [`Value::Array`] or [`Value::Table`]: where each top-level column's
    /// validity bitmap, values and null count sit (see [`PrimitiveLayout`]); `None` in the
    /// list for a column that is not one validity buffer and one values buffer (strings,
    /// binary), and `None` for a value that is not Arrow or has nested columns.
    pub fn column_layouts(&self) -> Option<Vec<Option<PrimitiveLayout>>> {
        use arrow_ipc::Type;
        let Some(Part::Owned(head)) = self.parts.first() else {
            return None;
        };
        if !matches!(head.first(), Some(&tag::ARRAY | &tag::TABLE)) {
            return None;
        }
        let mut pos = 1;
        loop {
            let b = *head.get(pos)?;
            pos += 1;
            if b & 0x80 == 0 {
                break;
            }
        }
        // A message: continuation marker, metadata length, metadata; its body follows.
        let message = |at: usize| {
            let h = head.get(at..at.checked_add(8)?)?;
            if h[..4] != [0xff; 4] {
                return None;
            }
            let len = usize::try_from(i32::from_le_bytes(h[4..8].try_into().ok()?)).ok()?;
            let end = (at + 8).checked_add(len)?;
            let msg = arrow_ipc::root_as_message(head.get(at + 8..end)?).ok()?;
            Some((msg, end))
        };
        let (schema, mut end) = message(pos.next_multiple_of(64))?;
        let fields = schema.header_as_schema()?.fields()?;
        // Dictionaries come first, each a message of its own.
        let (batch, body) = loop {
            let (m, e) = message(end.checked_add(usize::try_from(schema.bodyLength()).ok()?)?)?;
            if m.header_as_dictionary_batch().is_some() {
                end = e.checked_add(usize::try_from(m.bodyLength()).ok()?)?;
                continue;
            }
            break (m, e);
        };
        let rb = batch.header_as_record_batch()?;
        let nodes = rb.nodes()?;
        let buffers = rb.buffers()?;
        if nodes.len() != fields.len() {
            return None;
        }
        let node0 = nodes.bytes().as_ptr() as usize - head.as_ptr() as usize;
        let range = |i: usize| {
            let b = buffers.get(i);
            let start = body.checked_add(usize::try_from(b.offset()).ok()?)?;
            Some(start..start.checked_add(usize::try_from(b.length()).ok()?)?)
        };
        let mut out = Vec::with_capacity(fields.len());
        let mut buf = 0;
        for (i, f) in fields.iter().enumerate() {
            if f.children().is_some_and(|c| !c.is_empty()) {
                return None;
            }
            let n = if f.dictionary().is_some() {
                2
            } else {
                match f.type_type() {
                    Type::Utf8 | Type::Binary | Type::LargeUtf8 | Type::LargeBinary => 3,
                    Type::Int
                    | Type::FloatingPoint
                    | Type::Bool
                    | Type::Date
                    | Type::Time
                    | Type::Timestamp
                    | Type::Duration
                    | Type::Decimal
                    | Type::FixedSizeBinary => 2,
                    _ => return None,
                }
            };
            if buf + n > buffers.len() {
                return None;
            }
            out.push(if n == 2 {
                let l = PrimitiveLayout {
                    null_count_at: node0 + 16 * i + 8,
                    validity: range(buf)?,
                    values: range(buf + 1)?,
                };
                (l.values.end <= self.len && l.validity.end <= l.values.start).then_some(l)
            } else {
                None
            });
            buf += n;
        }
        (buf == buffers.len()).then_some(out)
    }

    /// The encoding as one vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.write_to(&mut v);
        v
    }
}

/// Where the pieces of an encoded primitive array sit, in bytes from the value's start: for
/// a writer that makes the validity bitmap while it copies the values, then writes the null
/// count (an `i64`, little-endian).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimitiveLayout {
    /// The array's null count in its field node.
    pub null_count_at: usize,
    /// The validity bitmap.
    pub validity: std::ops::Range<usize>,
    /// The values.
    pub values: std::ops::Range<usize>,
}

/// Encodes `v` (a [`Value::Shared`] as its value).
pub fn encode(v: &Value) -> Result<Encoded> {
    let mut e = Encoded::default();
    encode_into(&mut e, v, 0, false)?;
    Ok(e.finish())
}

/// Encodes `v` for a payload in shared memory: every array and table starts 64-byte aligned
/// (after an `0F` padding item where needed), so that a receiver can send it on by reference,
/// and a [`Value::Shared`] whose region can still be adopted is written as a reference to it
/// (tag `0E`: a region descriptor carrying one counted reference, which the reader adopts).
pub fn encode_aligned(v: &Value) -> Result<Encoded> {
    let mut e = Encoded::default();
    encode_into(&mut e, v, 0, true)?;
    Ok(e.finish())
}

/// Pads with an `0F` item so that the next item starts 64-byte aligned.
fn align_item(e: &mut Encoded) {
    if e.len.is_multiple_of(64) {
        return;
    }
    // Tag and one varint byte (the padding is under 64 bytes), then the zeros.
    let n = (64 - (e.len + 2) % 64) % 64;
    e.byte(tag::ALIGNED);
    e.varint(n as u64);
    e.put(&[0u8; 64][..n]);
}

/// A reference to `bytes` (a standalone value inside a region this process holds), when the
/// region can still be adopted by another process.
fn write_reference(e: &mut Encoded, bytes: &Buffer) -> bool {
    let Some((region, at)) = crate::store::Region::containing(bytes.as_ptr()) else {
        return false;
    };
    if !at.is_multiple_of(64) || at + bytes.len() > region.len() || !region.still_named() {
        return false;
    }
    let mut d = [0u8; 64];
    region.share().write_to(&mut d);
    e.byte(tag::SHARED);
    e.put(&d);
    e.put(&(at as u64).to_le_bytes());
    e.put(&(bytes.len() as u64).to_le_bytes());
    true
}

fn encode_into(e: &mut Encoded, v: &Value, depth: usize, aligned: bool) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(WireError::Unsupported(format!(
            "nesting deeper than {MAX_DEPTH} levels"
        )));
    }
    match v {
        Value::None => e.byte(tag::NONE),
        Value::Bool(b) => e.byte(if *b { tag::TRUE } else { tag::FALSE }),
        Value::Int(i) => {
            e.byte(tag::INT);
            e.put(&i.to_le_bytes());
        }
        Value::Float(f) => {
            e.byte(tag::FLOAT);
            e.put(&f.to_bits().to_le_bytes());
        }
        Value::Complex(re, im) => {
            e.byte(tag::COMPLEX);
            e.put(&re.to_bits().to_le_bytes());
            e.put(&im.to_bits().to_le_bytes());
        }
        Value::Str(s) => {
            e.byte(tag::STR);
            e.string(s);
        }
        Value::Bytes(b) => {
            e.byte(tag::BYTES);
            e.varint(b.len() as u64);
            if b.len() >= ALIGNED_BYTES_MIN {
                e.pad_to_align();
            }
            e.share(b.clone());
        }
        Value::List(items) => {
            e.byte(tag::LIST);
            e.varint(items.len() as u64);
            for it in items {
                encode_into(e, it, depth + 1, aligned)?;
            }
        }
        Value::Dict(items) => {
            e.byte(tag::DICT);
            encode_pairs(e, items, depth, aligned)?;
        }
        Value::Error {
            type_name,
            message,
            traceback,
        } => {
            e.byte(tag::ERROR);
            e.string(type_name);
            e.string(message);
            e.string(traceback);
        }
        Value::Call {
            target,
            args,
            kwargs,
        } => {
            e.byte(tag::CALL);
            let (form, text) = match target {
                CallTarget::Name(s) => (form::NAME, s),
                CallTarget::Source(s) => (form::SOURCE, s),
            };
            e.byte(form);
            e.string(text);
            e.varint(args.len() as u64);
            for a in args {
                encode_into(e, a, depth + 1, aligned)?;
            }
            encode_pairs(e, kwargs, depth, aligned)?;
        }
        Value::Array { field, array } => {
            if field.data_type() != array.data_type() {
                return Err(WireError::Unsupported(format!(
                    "field type {} does not match array type {}",
                    field.data_type(),
                    array.data_type()
                )));
            }
            let schema = Arc::new(Schema::new(vec![field.clone()]));
            let batch = RecordBatch::try_new(schema, vec![array.clone()])?;
            if aligned {
                align_item(e);
            }
            let at = e.len;
            encode_arrow(e, tag::ARRAY, &batch)?;
            if aligned {
                e.arrow.push((at, e.len - at));
            }
        }
        Value::Table(batch) => {
            if aligned {
                align_item(e);
            }
            let at = e.len;
            encode_arrow(e, tag::TABLE, batch)?;
            if aligned {
                e.arrow.push((at, e.len - at));
            }
        }
        Value::Shared { bytes, value } => {
            if !matches!(**value, Value::Array { .. } | Value::Table(_)) {
                return Err(WireError::Unsupported(
                    "a shared value is an array or a table".into(),
                ));
            }
            if !(aligned && write_reference(e, bytes)) {
                encode_into(e, value, depth, aligned)?;
            }
        }
    }
    Ok(())
}

fn encode_pairs(
    e: &mut Encoded,
    items: &[(String, Value)],
    depth: usize,
    aligned: bool,
) -> Result<()> {
    e.varint(items.len() as u64);
    for (k, v) in items {
        e.string(k);
        encode_into(e, v, depth + 1, aligned)?;
    }
    Ok(())
}

fn ipc_options() -> IpcWriteOptions {
    IpcWriteOptions::try_new(64, false, arrow_ipc::MetadataVersion::V5)
        .expect("64 is a valid IPC alignment")
}

fn encode_arrow(e: &mut Encoded, t: u8, batch: &RecordBatch) -> Result<()> {
    let mut enc = StreamEncoder::try_new_with_options(&batch.schema(), ipc_options())?;
    let mut bufs = enc.encode(batch)?;
    bufs.extend(enc.finish()?);
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    e.byte(t);
    e.varint(total as u64);
    e.pad_to_align();
    for b in bufs {
        e.share(b);
    }
    Ok(())
}
