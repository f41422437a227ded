//! A language's own payloads: a pickle, an R serialization or a compact value (the body), with
//! large buffers beside it instead of inside it, each either in the payload or by reference to
//! a region of a data segment. Both bindings write them with [`Writer`] and read them with
//! [`parse`] and [`receive`]; what the body and the buffers become is the binding's business.
//! Parsing is pure, so it is fuzzed from Rust (`tests/fuzz.rs`).
//!
//! Layout (integers little-endian, positions from the payload's start): the tag byte ([`tag`]).
//! An upper-case tag is followed by the body and nothing else. Its lower-case letter (the tag
//! plus [`tag::WITH_BUFFERS`]) is followed by three zero bytes, the `u32` count `n` of buffers,
//! the `u64` length of the body; a table of `n` entries of [`ENTRY`] bytes; the body; then each
//! buffer's bytes, or its reference record, 64-byte aligned after the body. An entry is the
//! `u64` position, the `u64` length of the buffer, a code byte ([`code`]) and seven zero bytes.
//! A reference record is a region's 64-byte descriptor and the `u64` offset of the bytes in the
//! region (for [`code::ARROW_COLUMN`], then the `u64` column).

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Result, WireError, malformed};
use crate::store::{Mapper, Region, RegionDesc};

/// The payload tags. No tag means two things: a reader knows from the first byte which
/// language wrote the body and how.
pub mod tag {
    /// Python: a pickle (protocol 5; its out-of-band buffers are the payload's buffers).
    pub const PICKLE: u8 = b'P';
    /// Python: a call of a function pickled by reference: a varint length and the function's
    /// pickle, then the pickle of the arguments (a tuple, or `[args, kwargs]`).
    pub const PICKLED_CALL: u8 = b'C';
    /// R: R's serialization (version 2), each large vector replaced by a placeholder that
    /// names a buffer.
    pub const R_SERIAL: u8 = b'R';
    /// Either language: one value of the compact encoding (`compact`), with that language's
    /// items, which name buffers by index.
    pub const COMPACT: u8 = b'K';
    /// Either language: a runtime error's UTF-8 text (never with buffers).
    pub const TEXT: u8 = b'T';
    /// Added to a tag: the payload has a buffer table (the tag's lower-case letter).
    pub const WITH_BUFFERS: u8 = 0x20;
}

/// The entry codes: what a buffer holds. The low six bits are the kind; the flags are above.
pub mod code {
    /// Plain bytes (a pickle's buffer, a numpy array's data).
    pub const BYTES: u8 = 0;
    /// An R integer vector's elements.
    pub const R_INTEGER: u8 = 1;
    /// An R double vector's elements.
    pub const R_DOUBLE: u8 = 2;
    /// An R logical vector's elements.
    pub const R_LOGICAL: u8 = 3;
    /// An R raw vector's elements.
    pub const R_RAW: u8 = 4;
    /// An R complex vector's elements.
    pub const R_COMPLEX: u8 = 5;
    /// An R character vector in the R package's string layout.
    pub const R_STRINGS: u8 = 6;
    /// An array value of the wire format (`value`).
    pub const ARROW_ARRAY: u8 = 7;
    /// A table value of the wire format (an R data frame).
    pub const ARROW_TABLE: u8 = 8;
    /// One column of a table value, by reference only: the record carries the column.
    pub const ARROW_COLUMN: u8 = 9;
    /// Flag: the buffer is a reference record.
    pub const BY_REF: u8 = 0x80;
    /// Flag (only with [`BY_REF`]): every holder of the memory may write it (memory of
    /// `pymizu.empty`/`zeros`).
    pub const WRITABLE: u8 = 0x40;
    /// The kind bits.
    pub const KIND: u8 = 0x3F;
}

/// Bytes of a table entry.
pub const ENTRY: usize = 24;
/// Bytes of the header before the table.
pub const HEADER: usize = 16;
/// Bytes of a reference record: a region descriptor, then the offset in the region.
pub const REF_RECORD: usize = 64 + 8;
/// Alignment of each buffer in the payload.
pub const ALIGN: usize = 64;

/// Where one buffer's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// In the payload.
    Inline(Range<usize>),
    /// In a region: `len` bytes at `offset`, checked against the region once adopted.
    Ref {
        /// The region.
        desc: RegionDesc,
        /// Where the bytes start in the region.
        offset: u64,
        /// How many.
        len: u64,
        /// For [`code::ARROW_COLUMN`]: the column.
        column: Option<u64>,
    },
}

/// One table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where its bytes are.
    pub place: Place,
    /// Its kind ([`code`], without the flags).
    pub code: u8,
    /// Whether every holder may write it ([`code::WRITABLE`]).
    pub writable: bool,
}

/// A parsed payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The tag, upper-case.
    pub tag: u8,
    /// The body.
    pub body: Range<usize>,
    /// The buffers, in table order.
    pub entries: Vec<Entry>,
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Whether `t` is a tag of this layout (either case).
pub fn is_tag(t: u8) -> bool {
    matches!(
        t & !tag::WITH_BUFFERS,
        tag::PICKLE | tag::PICKLED_CALL | tag::R_SERIAL | tag::COMPACT
    ) || t == tag::TEXT
}

/// The table's entry count and end, and the body's end, checked against the payload.
fn header(b: &[u8]) -> Result<(usize, usize, usize)> {
    if b.len() < HEADER {
        return Err(WireError::Truncated {
            what: "buffer table header",
            offset: 0,
            needed: HEADER,
            available: b.len(),
        });
    }
    if b[1..4] != [0, 0, 0] {
        return Err(malformed(1, "non-zero reserved bytes"));
    }
    let n = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    let table_end = n
        .checked_mul(ENTRY)
        .and_then(|t| t.checked_add(HEADER))
        .filter(|&e| e <= b.len())
        .ok_or_else(|| malformed(4, format!("{n} buffers do not fit")))?;
    let body_end = (table_end as u64)
        .checked_add(word(b, 8))
        .filter(|&e| e <= b.len() as u64)
        .ok_or_else(|| malformed(8, "the body is out of bounds"))? as usize;
    Ok((n, table_end, body_end))
}

/// Parses a payload's layout. Every range and record lies inside `b`, after the body, at a
/// multiple of [`ALIGN`] from the payload's start; region descriptors are parsed, not adopted.
pub fn parse(b: &[u8]) -> Result<Parsed> {
    let t = *b.first().ok_or(WireError::Truncated {
        what: "payload tag",
        offset: 0,
        needed: 1,
        available: 0,
    })?;
    if !is_tag(t) || t == tag::TEXT | tag::WITH_BUFFERS {
        return Err(malformed(0, format!("unknown payload tag {t:#04x}")));
    }
    if t & tag::WITH_BUFFERS == 0 {
        return Ok(Parsed {
            tag: t,
            body: 1..b.len(),
            entries: Vec::new(),
        });
    }
    let (n, table_end, body_end) = header(b)?;
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let e = HEADER + ENTRY * i;
        let (at, len, c) = (word(b, e), word(b, e + 8), b[e + 16]);
        if b[e + 17..e + ENTRY].iter().any(|&x| x != 0) {
            return Err(malformed(
                e + 17,
                format!("buffer {i}: non-zero reserved bytes"),
            ));
        }
        let (by_ref, writable, kind) = (
            c & code::BY_REF != 0,
            c & code::WRITABLE != 0,
            c & code::KIND,
        );
        if kind > code::ARROW_COLUMN {
            return Err(malformed(
                e + 16,
                format!("buffer {i}: unknown code {c:#04x}"),
            ));
        }
        if writable && !by_ref {
            return Err(malformed(
                e + 16,
                format!("buffer {i}: writable but not shared"),
            ));
        }
        if kind == code::ARROW_COLUMN && !by_ref {
            return Err(malformed(
                e + 16,
                format!("buffer {i}: a column not by reference"),
            ));
        }
        let span = match (by_ref, kind == code::ARROW_COLUMN) {
            (true, true) => REF_RECORD as u64 + 8,
            (true, false) => REF_RECORD as u64,
            (false, _) => len,
        };
        if at % ALIGN as u64 != 0 {
            return Err(malformed(e, format!("buffer {i} is not 64-byte aligned")));
        }
        let end = at
            .checked_add(span)
            .filter(|&x| at >= body_end as u64 && x <= b.len() as u64)
            .ok_or_else(|| malformed(e, format!("buffer {i} is out of bounds")))?
            as usize;
        let at = at as usize;
        let place = if by_ref {
            let desc = RegionDesc::read_from(&b[at..at + 64])
                .map_err(|why| malformed(at, format!("buffer {i}: {why}")))?;
            Place::Ref {
                desc,
                offset: word(b, at + 64),
                len,
                column: (end > at + REF_RECORD).then(|| word(b, at + REF_RECORD)),
            }
        } else {
            Place::Inline(at..end)
        };
        entries.push(Entry {
            place,
            code: kind,
            writable,
        });
    }
    Ok(Parsed {
        tag: t & !tag::WITH_BUFFERS,
        body: table_end..body_end,
        entries,
    })
}

/// The region descriptors a payload refers to, as far as it can be read (for giving back the
/// references of a payload nobody will read: stops at the first malformed entry).
pub fn references(b: &[u8]) -> Vec<RegionDesc> {
    let mut out = Vec::new();
    if !b
        .first()
        .is_some_and(|&t| is_tag(t) && t & tag::WITH_BUFFERS != 0)
    {
        return out;
    }
    let Ok((n, _, body_end)) = header(b) else {
        return out;
    };
    for i in 0..n {
        let e = HEADER + ENTRY * i;
        if b[e + 16] & code::BY_REF == 0 {
            continue;
        }
        let Some(d) = usize::try_from(word(b, e))
            .ok()
            .filter(|&a| a >= body_end)
            .and_then(|a| b.get(a..a.checked_add(64)?))
            .and_then(|d| RegionDesc::read_from(d).ok())
        else {
            return out;
        };
        out.push(d);
    }
    out
}

/// A received buffer: its bytes (in the payload, or in the region it names, which they keep
/// mapped) and what its entry says of them.
#[derive(Debug, Clone)]
pub struct Buffer {
    /// The bytes.
    pub bytes: arrow_buffer::Buffer,
    /// Its kind ([`code`]).
    pub code: u8,
    /// Whether every holder may write it.
    pub writable: bool,
    /// Whether it came by reference (its bytes are a region's, not the payload's).
    pub by_ref: bool,
    /// For [`code::ARROW_COLUMN`]: the column.
    pub column: Option<u64>,
}

/// The buffers of a payload (`entries`, parsed from `payload`), in order: inline ones as
/// slices of the payload, those by reference in their regions, adopted through `mapper`. Every
/// reference is adopted (and given back when the buffers drop) even when an earlier one fails,
/// so that a payload read in error holds nothing.
pub fn receive(
    payload: &arrow_buffer::Buffer,
    entries: Vec<Entry>,
    mapper: &Mapper,
) -> Result<Vec<Buffer>> {
    let mut out = Vec::with_capacity(entries.len());
    let mut first_error = None;
    for (i, e) in entries.into_iter().enumerate() {
        let (bytes, by_ref, column) = match e.place {
            Place::Inline(r) => (payload.slice_with_length(r.start, r.len()), false, None),
            Place::Ref {
                desc,
                offset,
                len,
                column,
            } => {
                let region = match mapper.adopt(&desc) {
                    Ok(r) => Arc::new(r),
                    Err(why) => {
                        first_error.get_or_insert(malformed(0, format!("buffer {i}: {why}")));
                        continue;
                    }
                };
                match offset
                    .checked_add(len)
                    .filter(|&end| end <= region.len() as u64)
                {
                    Some(_) => (
                        Region::buffer(&region).slice_with_length(offset as usize, len as usize),
                        true,
                        column,
                    ),
                    None => {
                        first_error.get_or_insert(malformed(
                            0,
                            format!("buffer {i} lies beyond its region"),
                        ));
                        continue;
                    }
                }
            }
        };
        out.push(Buffer {
            bytes,
            code: e.code,
            writable: e.writable,
            by_ref,
            column,
        });
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Bytes a [`Writer`] copies into the payload: the body, or one buffer.
pub trait Source {
    /// How many.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Writes them into `out` (exactly [`Source::len`] bytes).
    fn write_to(&self, out: &mut [u8]);
}

impl Source for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    #[inline]
    fn write_to(&self, out: &mut [u8]) {
        if self.len() < crate::copy::SPLIT_FROM {
            out.copy_from_slice(self);
        } else {
            crate::copy::copy_large(out, self);
        }
    }
}

impl Source for Vec<u8> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn write_to(&self, out: &mut [u8]) {
        self.as_slice().write_to(out);
    }
}

impl<S: Source + ?Sized> Source for &S {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn write_to(&self, out: &mut [u8]) {
        (**self).write_to(out);
    }
}

/// Two pieces, one after the other (a call's header and its arguments' pickle).
impl<A: Source, B: Source> Source for (A, B) {
    fn len(&self) -> usize {
        self.0.len() + self.1.len()
    }
    fn write_to(&self, out: &mut [u8]) {
        let (a, b) = out.split_at_mut(self.0.len());
        self.0.write_to(a);
        self.1.write_to(b);
    }
}

/// A buffer to write.
enum Item<S> {
    /// Its bytes, copied in.
    Inline { code: u8, src: S },
    /// A reference to `len` bytes at `offset` of `region`: each write takes a new reference,
    /// which the receiver adopts (or the runtime gives back with the payload's other ones).
    Ref {
        code: u8,
        region: Arc<Region>,
        offset: usize,
        len: usize,
        column: Option<u64>,
    },
}

impl<S: Source> Item<S> {
    fn space(&self) -> usize {
        match self {
            Item::Inline { src, .. } => src.len(),
            Item::Ref { column: None, .. } => REF_RECORD,
            Item::Ref {
                column: Some(_), ..
            } => REF_RECORD + 8,
        }
    }
}

/// Writes a payload in place: a body of `B` and buffers of `S`, each copied once.
pub struct Writer<B, S> {
    tag: u8,
    body: B,
    items: Vec<Item<S>>,
}

impl<B: Source, S: Source> Writer<B, S> {
    /// A payload of `tag` (upper-case: the writer adds [`tag::WITH_BUFFERS`] when there are
    /// buffers) and `body`.
    pub fn new(tag: u8, body: B) -> Self {
        Writer {
            tag,
            body,
            items: Vec::new(),
        }
    }

    /// Adds a buffer of `code` whose bytes are copied in; returns its index.
    pub fn push(&mut self, code: u8, src: S) -> usize {
        self.items.push(Item::Inline { code, src });
        self.items.len() - 1
    }

    /// Adds a buffer sent by reference: `len` bytes at `offset` of `region` (with `writable`,
    /// every holder may write them; for [`code::ARROW_COLUMN`], `column`). Returns its index.
    pub fn push_ref(
        &mut self,
        code: u8,
        region: Arc<Region>,
        offset: usize,
        len: usize,
        writable: bool,
        column: Option<u64>,
    ) -> usize {
        let code = code | code::BY_REF | if writable { code::WRITABLE } else { 0 };
        self.items.push(Item::Ref {
            code,
            region,
            offset,
            len,
            column,
        });
        self.items.len() - 1
    }

    /// The buffers so far.
    pub fn buffers(&self) -> usize {
        self.items.len()
    }

    /// The buffers whose bytes are copied in, in order.
    pub fn sources(&self) -> impl Iterator<Item = &S> {
        self.items.iter().filter_map(|it| match it {
            Item::Inline { src, .. } => Some(src),
            Item::Ref { .. } => None,
        })
    }

    /// The body.
    pub fn body(&self) -> &B {
        &self.body
    }

    /// The body, to change or take back.
    pub fn body_mut(&mut self) -> &mut B {
        &mut self.body
    }

    /// Where the body starts.
    fn body_at(&self) -> usize {
        if self.items.is_empty() {
            1
        } else {
            HEADER + ENTRY * self.items.len()
        }
    }

    /// The buffers' positions, and the payload's size.
    fn positions(&self, mut f: impl FnMut(usize, &Item<S>)) -> usize {
        let mut at = self.body_at() + self.body.len();
        for it in &self.items {
            at = at.next_multiple_of(ALIGN);
            f(at, it);
            at += it.space();
        }
        at
    }

    /// The payload's size in bytes.
    pub fn size(&self) -> usize {
        self.positions(|_, _| {})
    }

    /// Writes the payload into `out` (exactly [`Writer::size`] bytes).
    pub fn write(&self, out: &mut [u8]) {
        let p = self.body_at();
        let body_end = p + self.body.len();
        if self.items.is_empty() {
            out[0] = self.tag;
            self.body.write_to(&mut out[p..body_end]);
            return;
        }
        out[..HEADER].fill(0);
        out[0] = self.tag | tag::WITH_BUFFERS;
        out[4..8].copy_from_slice(&(self.items.len() as u32).to_le_bytes());
        out[8..16].copy_from_slice(&(self.body.len() as u64).to_le_bytes());
        self.body.write_to(&mut out[p..body_end]);
        let mut end = body_end;
        let mut i = 0;
        self.positions(|at, it| {
            let e = HEADER + ENTRY * i;
            i += 1;
            out[e..e + ENTRY].fill(0);
            out[e..e + 8].copy_from_slice(&(at as u64).to_le_bytes());
            out[end..at].fill(0);
            match it {
                Item::Inline { code, src } => {
                    out[e + 8..e + 16].copy_from_slice(&(src.len() as u64).to_le_bytes());
                    out[e + 16] = *code;
                    src.write_to(&mut out[at..at + src.len()]);
                }
                Item::Ref {
                    code,
                    region,
                    offset,
                    len,
                    column,
                } => {
                    out[e + 8..e + 16].copy_from_slice(&(*len as u64).to_le_bytes());
                    out[e + 16] = *code;
                    region.share().write_to(&mut out[at..at + 64]);
                    out[at + 64..at + REF_RECORD].copy_from_slice(&(*offset as u64).to_le_bytes());
                    if let Some(c) = column {
                        out[at + REF_RECORD..at + REF_RECORD + 8].copy_from_slice(&c.to_le_bytes());
                    }
                }
            }
            end = at + it.space();
        });
    }

    /// The payload as bytes (where it cannot be written in place).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.size()];
        self.write(&mut v);
        v
    }
}
