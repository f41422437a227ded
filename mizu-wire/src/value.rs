//! The compact tagged value encoding (normative text: `docs/wire-format.md`).
//!
//! Encoding produces a scatter list: small items are copied into owned chunks, large byte
//! strings and Arrow bodies are referenced, so writing a value into a region is one copy.
//! Positions are relative to the start of the value, which must land 64-byte aligned; large
//! byte strings and Arrow IPC streams are padded to 64-byte boundaries so receivers can view
//! them in place.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_buffer::{Buffer, MutableBuffer};
use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow_schema::{Field, FieldRef, Schema};

use crate::error::{Result, WireError, malformed};

pub use crate::compact::{ALIGNED_BYTES_MIN, MAX_DEPTH};
use crate::compact::{Reader, form, tag};

/// How a call names its function.
#[derive(Debug, Clone, PartialEq)]
pub enum CallTarget {
    /// A qualified name, e.g. `package.module:function` or `pkg::fun`.
    Name(String),
    /// Source text that evaluates to the function.
    Source(String),
}

/// A value that crosses between processes and languages.
#[derive(Debug, Clone)]
pub enum Value {
    /// Python `None`, R `NULL`.
    None,
    /// A boolean.
    Bool(bool),
    /// A 64-bit integer.
    Int(i64),
    /// A double (bit pattern preserved).
    Float(f64),
    /// A complex number (re, im).
    Complex(f64, f64),
    /// UTF-8 text.
    Str(String),
    /// Bytes; large ones are zero-copy views when decoded from a region.
    Bytes(Buffer),
    /// An ordered list.
    List(Vec<Value>),
    /// String keys, in order.
    Dict(Vec<(String, Value)>),
    /// An error raised by a task.
    Error {
        /// The remote exception type or condition class.
        type_name: String,
        /// Its message.
        message: String,
        /// The remote traceback, if any.
        traceback: String,
    },
    /// A function to call with arguments.
    Call {
        /// What to call.
        target: CallTarget,
        /// Positional arguments.
        args: Vec<Value>,
        /// Keyword (named) arguments.
        kwargs: Vec<(String, Value)>,
    },
    /// One Arrow array with its field (name, nullability, R metadata).
    Array {
        /// The field.
        field: FieldRef,
        /// The data.
        array: ArrayRef,
    },
    /// An Arrow record batch (a data frame).
    Table(RecordBatch),
    /// An array or table that is also a standalone encoded value in shared memory (`bytes`,
    /// 64-byte aligned): what [`decode_shared`] gives for one received in a region, and what
    /// a binding sends back unmodified. [`encode_aligned`] writes a reference to `bytes` (a
    /// region descriptor, no data) while its region can still be adopted, else `value`.
    Shared {
        /// The standalone encoding, inside a received region.
        bytes: Buffer,
        /// The decoded [`Value::Array`] or [`Value::Table`].
        value: Box<Value>,
    },
}

impl Value {
    /// The value itself, whether or not it is [`Value::Shared`].
    pub fn unshared(&self) -> &Value {
        match self {
            Value::Shared { value, .. } => value,
            v => v,
        }
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        use Value::*;
        match (self, other) {
            (None, None) => true,
            (Bool(a), Bool(b)) => a == b,
            (Int(a), Int(b)) => a == b,
            // Bit equality: NaN payloads (R's NA_real_) must survive.
            (Float(a), Float(b)) => a.to_bits() == b.to_bits(),
            (Complex(a, b), Complex(c, d)) => {
                a.to_bits() == c.to_bits() && b.to_bits() == d.to_bits()
            }
            (Str(a), Str(b)) => a == b,
            (Bytes(a), Bytes(b)) => a.as_slice() == b.as_slice(),
            (List(a), List(b)) => a == b,
            (Dict(a), Dict(b)) => a == b,
            (
                Error {
                    type_name: a,
                    message: b,
                    traceback: c,
                },
                Error {
                    type_name: d,
                    message: e,
                    traceback: f,
                },
            ) => a == d && b == e && c == f,
            (
                Call {
                    target: a,
                    args: b,
                    kwargs: c,
                },
                Call {
                    target: d,
                    args: e,
                    kwargs: f,
                },
            ) => a == d && b == e && c == f,
            (Array { field: a, array: b }, Array { field: c, array: d }) => {
                a == c && b.to_data() == d.to_data()
            }
            (Table(a), Table(b)) => a == b,
            (Shared { value, .. }, b) => **value == *b,
            (a, Shared { value, .. }) => *a == **value,
            _ => false,
        }
    }
}

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
                        validated::insert(validated::key(&r.describe(), off, self.r.pos - at));
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
                let key = validated::key(&region.describe(), vat as usize, vlen as usize);
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
    let trusted = crate::store::Region::containing(bytes.as_ptr()).is_some_and(|(r, at)| {
        validated::contains(&validated::key(&r.describe(), at, bytes.len()))
    });
    let mut d = Decoder::new(bytes, None, false);
    d.trusted = trusted;
    let v = d.value(0)?;
    if d.r.pos != bytes.len() || !matches!(v, Value::Array { .. } | Value::Table(_)) {
        return Err(malformed(0, "not one array or table value"));
    }
    Ok(v)
}

/// Whether this process recorded (with [`passed_check`]) that `bytes`, a range of a shared
/// region, passed `check`: a binding's own test of received data (R: no string holds a NUL)
/// is made once per received value, not each time it is received again. Always `false`
/// outside shared regions.
pub fn passed_before(bytes: &[u8], check: &'static str) -> bool {
    crate::store::Region::containing(bytes.as_ptr()).is_some_and(|(r, at)| {
        validated::contains(&validated::checked(&r.describe(), at, bytes.len(), check))
    })
}

/// Records that `bytes` (a range of a shared region, immutable while referenced) passed
/// `check`; see [`passed_before`]. Nothing outside shared regions.
pub fn passed_check(bytes: &[u8], check: &'static str) {
    if let Some((r, at)) = crate::store::Region::containing(bytes.as_ptr()) {
        validated::insert(validated::checked(&r.describe(), at, bytes.len(), check));
    }
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

/// Arrow values this process wrote into a region it is filling, known good when the region
/// is committed: a value sent to another process and sent back by reference is then not
/// validated by the process that made it (it came from arrays this process held).
pub(crate) mod written {
    use std::cell::RefCell;

    /// Values written but not yet claimed by a commit: (address, length).
    const MAX: usize = 256;

    thread_local! {
        static PENDING: RefCell<Vec<(usize, usize)>> = const { RefCell::new(Vec::new()) };
    }

    /// `values` (offsets and lengths in the bytes at `base`) were just written.
    pub(crate) fn wrote(base: *const u8, values: &[(usize, usize)]) {
        if values.is_empty() {
            return;
        }
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() + values.len() > MAX {
                p.clear();
            }
            p.extend(values.iter().map(|&(at, len)| (base as usize + at, len)));
        });
    }

    /// A region is being allocated for filling: what was written before belongs to no region
    /// this thread fills from now on (a region that was dropped unfilled, say), and must not
    /// vouch for bytes that later take its place.
    pub(crate) fn forget() {
        PENDING.with(|p| p.borrow_mut().clear());
    }

    /// The region `desc`, whose payload is the `len` bytes at `start`, was committed: the
    /// values written inside it are known good, and the ones pending elsewhere are dropped
    /// (they went to buffers that are not regions).
    pub(crate) fn committed(desc: &crate::store::RegionDesc, start: *const u8, len: usize) {
        let start = start as usize;
        let inside: Vec<(usize, usize)> = PENDING.with(|p| {
            p.borrow_mut()
                .drain(..)
                .filter(|&(a, l)| a >= start && a + l <= start + len)
                .collect()
        });
        for (a, l) in inside {
            super::validated::insert(super::validated::key(desc, a - start, l));
        }
    }
}

/// Arrow values in shared memory this process has decoded and validated: a region's bytes
/// never change while it is referenced, and a segment's space is reused only in a new lap (a
/// new generation), so the same (segment, generation, region, offset, length) names the same
/// bytes — a value relayed back and forth is validated once per process, not per trip.
mod validated {
    use std::collections::{HashSet, VecDeque};
    use std::sync::Mutex;

    use crate::store::RegionDesc;

    /// Segment name, generation, region offset in the segment, offset in the region, length,
    /// and which check the bytes passed (`ARROW`: decoded and validated as a value).
    pub(super) type Key = (String, u64, u64, usize, usize, &'static str);

    /// The check of an encoded array or table value.
    pub(super) const ARROW: &str = "arrow";

    const MAX: usize = 4096;

    type Seen = (Option<HashSet<Key>>, VecDeque<Key>);
    static SEEN: Mutex<Seen> = Mutex::new((None, VecDeque::new()));

    pub(super) fn key(region: &RegionDesc, at: usize, len: usize) -> Key {
        checked(region, at, len, ARROW)
    }

    pub(super) fn checked(region: &RegionDesc, at: usize, len: usize, check: &'static str) -> Key {
        (
            region.name.clone(),
            region.generation,
            region.offset,
            at,
            len,
            check,
        )
    }

    pub(super) fn contains(k: &Key) -> bool {
        let g = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        g.0.as_ref().is_some_and(|s| s.contains(k))
    }

    pub(super) fn insert(k: Key) {
        let mut g = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *g;
        let set = set.get_or_insert_with(HashSet::new);
        if set.insert(k.clone()) {
            order.push_back(k);
            if order.len() > MAX
                && let Some(old) = order.pop_front()
            {
                set.remove(&old);
            }
        }
    }
}

/// Decodes an IPC stream holding exactly one record batch, zero-copy, requiring alignment.
fn decode_arrow(stream: Buffer, at: usize, trusted: bool) -> Result<RecordBatch> {
    // Arrow only checks each buffer's natural alignment; the format promises 64 so receivers
    // get SIMD-friendly views, and a value placed otherwise is a misuse worth an error.
    if !(stream.as_ptr() as usize).is_multiple_of(64) {
        return Err(malformed(
            at,
            "arrow stream is not 64-byte aligned in memory (decode from an aligned buffer)",
        ));
    }
    validate_ipc_stream(stream.as_slice(), at)?;
    // arrow-data 60.1 still asserts (panics) on some malformed bodies, e.g. an offsets buffer
    // whose length is not a whole number of offsets. Contain that here, on local state only,
    // so hostile bytes are an error and never a panic that could cross an FFI boundary.
    let decoded = quietly(move || read_ipc_stream(&stream, trusted));
    let (batch, extra) = match decoded {
        Ok(r) => r?,
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            return Err(malformed(
                at,
                format!("arrow-ipc could not decode the stream: {why}"),
            ));
        }
    };
    if extra {
        return Err(malformed(
            at,
            "an arrow value holds more than one record batch",
        ));
    }
    batch.ok_or_else(|| malformed(at, "an arrow value holds no record batch"))
}

thread_local! {
    /// Set while this thread runs arrow on untrusted bytes (see [`quietly`]).
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` catching a panic, without the panic hook's message: arrow asserts (panics) on
/// some malformed input, which is an error for us, not news for the user's terminal. The
/// hook, installed once, stays silent only on a thread inside `quietly`; any other panic is
/// reported by the hook that was there before.
fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                before(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r
}

/// Reads a one-batch IPC stream whose framing `validate_ipc_stream` checked. arrow-ipc's
/// `StreamDecoder` would validate every array as it builds it, but checks dictionary keys at
/// ~1.5 ns a key (a factor of 54 000 rows took 85 µs each time it arrived): the messages are
/// read here with arrow's validation off, then every array is validated by `validate_array`
/// before it is returned.
fn read_ipc_stream(
    stream: &Buffer,
    trusted: bool,
) -> std::result::Result<(Option<RecordBatch>, bool), arrow_schema::ArrowError> {
    use arrow_ipc::MessageHeader;
    use arrow_schema::ArrowError;
    let ipc = |why: &str| ArrowError::IpcError(why.to_string());
    let b = stream.as_slice();
    let mut skip = arrow_data::UnsafeFlag::new();
    // SAFETY: nothing read with it leaves this function before `validate_array` checked it.
    unsafe { skip.set(true) };
    let mut schema: Option<Arc<Schema>> = None;
    let mut dictionaries = std::collections::HashMap::new();
    let (mut batch, mut extra) = (None, false);
    let mut pos = 0usize;
    loop {
        let head = b.get(pos..pos + 8).ok_or_else(|| ipc("truncated"))?;
        let meta_len = usize::try_from(i32::from_le_bytes(head[4..8].try_into().expect("4")))
            .map_err(|_| ipc("negative metadata length"))?;
        if meta_len == 0 {
            break;
        }
        let meta_end = pos + 8 + meta_len;
        let msg = arrow_ipc::root_as_message(&b[pos + 8..meta_end])
            .map_err(|e| ipc(&format!("message metadata: {e}")))?;
        let body_len = usize::try_from(msg.bodyLength()).map_err(|_| ipc("body length"))?;
        let body = stream.slice_with_length(meta_end, body_len);
        let version = msg.version();
        match msg.header_type() {
            MessageHeader::Schema => {
                let s = msg.header_as_schema().ok_or_else(|| ipc("no schema"))?;
                schema = Some(Arc::new(arrow_ipc::convert::try_fb_to_schema(s)?));
            }
            MessageHeader::DictionaryBatch => {
                let d = msg
                    .header_as_dictionary_batch()
                    .ok_or_else(|| ipc("no dictionary"))?;
                let s = schema
                    .as_deref()
                    .ok_or_else(|| ipc("dictionary before the schema"))?;
                arrow_ipc::reader::read_dictionary_impl(
                    &body,
                    d,
                    s,
                    &mut dictionaries,
                    &version,
                    true,
                    skip.clone(),
                )?;
            }
            MessageHeader::RecordBatch => {
                let rb = msg
                    .header_as_record_batch()
                    .ok_or_else(|| ipc("no batch"))?;
                let s = schema
                    .clone()
                    .ok_or_else(|| ipc("batch before the schema"))?;
                let read = arrow_ipc::reader::RecordBatchDecoder::try_new(
                    &body,
                    rb,
                    s,
                    &dictionaries,
                    &version,
                )?
                .with_require_alignment(true)
                .with_skip_validation(skip.clone())
                .read_record_batch()?;
                if !trusted {
                    for c in read.columns() {
                        validate_array(&c.to_data())?;
                    }
                }
                extra |= batch.replace(read).is_some();
            }
            t => return Err(ipc(&format!("unsupported message type {t:?}"))),
        }
        pos = meta_end + body_len;
    }
    Ok((batch, extra))
}

/// What `ArrayData::validate_full` checks (structure, nulls, values, children), with int32
/// dictionary keys checked by a loop the compiler vectorizes.
fn validate_array(d: &arrow_data::ArrayData) -> std::result::Result<(), arrow_schema::ArrowError> {
    d.validate()?;
    d.validate_nulls()?;
    match d.data_type() {
        arrow_schema::DataType::Dictionary(k, _) if **k == arrow_schema::DataType::Int32 => {
            let values = d.child_data().first().map_or(0, |c| c.len());
            let lim = u32::try_from(values).unwrap_or(u32::MAX);
            // `validate` checked that the buffer holds offset + len keys.
            let keys = &d.buffers()[0].typed_data::<i32>()[d.offset()..d.offset() + d.len()];
            // A plain reduction the compiler vectorizes; the positions only when it finds one.
            if keys.iter().fold(false, |a, &x| a | (x as u32 >= lim)) {
                for (i, &x) in keys.iter().enumerate() {
                    // Keys under nulls may be anything.
                    if x as u32 >= lim && d.is_valid(i) {
                        return Err(arrow_schema::ArrowError::InvalidArgumentError(format!(
                            "dictionary key {x} at {i} out of 0..{values}"
                        )));
                    }
                }
            }
        }
        _ => d.validate_values()?,
    }
    d.child_data().iter().try_for_each(validate_array)
}

/// Checks the framing of an IPC stream before arrow-ipc reads it: arrow trusts buffer offsets
/// and panics on out-of-range ones, so every message's metadata is verified (flatbuffer
/// verifier) and every body buffer is checked to lie inside its message body.
fn validate_ipc_stream(b: &[u8], at: usize) -> Result<()> {
    use arrow_ipc::MessageHeader;
    let bad = |off: usize, why: String| malformed(at + off, format!("arrow stream: {why}"));
    let mut pos = 0usize;
    loop {
        let head = b
            .get(pos..pos + 8)
            .ok_or_else(|| bad(pos, "truncated before end-of-stream".into()))?;
        if head[..4] != [0xff; 4] {
            return Err(bad(pos, "message without continuation marker".into()));
        }
        let meta_len = i32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        if meta_len == 0 {
            if pos + 8 != b.len() {
                return Err(bad(
                    pos,
                    format!("{} bytes after end-of-stream", b.len() - pos - 8),
                ));
            }
            return Ok(());
        }
        let meta_end = usize::try_from(meta_len)
            .ok()
            .and_then(|m| (pos + 8).checked_add(m))
            .filter(|&e| e <= b.len())
            .ok_or_else(|| bad(pos, format!("metadata length {meta_len} out of range")))?;
        let msg = arrow_ipc::root_as_message(&b[pos + 8..meta_end])
            .map_err(|e| bad(pos, format!("invalid message metadata: {e}")))?;
        let body_len =
            u64::try_from(msg.bodyLength()).map_err(|_| bad(pos, "negative body length".into()))?;
        let end = (meta_end as u64)
            .checked_add(body_len)
            .filter(|&e| e <= b.len() as u64)
            .ok_or_else(|| bad(pos, format!("body of {body_len} bytes past the end")))?
            as usize;
        let batch = match msg.header_type() {
            MessageHeader::Schema => None,
            MessageHeader::RecordBatch => msg.header_as_record_batch(),
            MessageHeader::DictionaryBatch => {
                msg.header_as_dictionary_batch().and_then(|d| d.data())
            }
            other => return Err(bad(pos, format!("unsupported message type {other:?}"))),
        };
        if let Some(rb) = batch {
            for buf in rb.buffers().iter().flatten() {
                let ok = u64::try_from(buf.offset())
                    .ok()
                    .zip(u64::try_from(buf.length()).ok())
                    .and_then(|(o, l)| o.checked_add(l))
                    .is_some_and(|e| e <= body_len)
                    && buf.offset() % 8 == 0;
                if !ok {
                    return Err(bad(
                        pos,
                        format!(
                            "buffer {}+{} misaligned or outside a {body_len}-byte body",
                            buf.offset(),
                            buf.length()
                        ),
                    ));
                }
            }
        } else if msg.header_type() != MessageHeader::Schema {
            return Err(bad(pos, "batch message without a batch".into()));
        }
        pos = end;
    }
}

/// Builds an array value with a plain field named `name`.
pub fn array(name: &str, array: ArrayRef) -> Value {
    let field = Field::new(
        name,
        array.data_type().clone(),
        array.null_count() > 0 || array.is_nullable(),
    );
    Value::Array {
        field: Arc::new(field),
        array,
    }
}
