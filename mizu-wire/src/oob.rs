//! The bindings' out-of-band payloads: a language's own serialization (a pickle, an R
//! serialization) with large buffers beside it instead of inside it, each either in the payload
//! or by reference to a region of a data segment. Parsing the layout is pure and shared, so it
//! is fuzzed from Rust (`tests/fuzz.rs`); what the buffers become is the binding's business.
//!
//! Layout (integers little-endian): the tag byte (Python `B`; R `V` when the body is an R
//! serialization, `W` when it is the compact encoding, whose `R_OOB` items name buffers by
//! index), three zero bytes, `u32`
//! count `n` of buffers, `u64` length of the body; a table of `n` entries; the body; then the
//! buffers' bytes or reference records, each at or after the body's end. A reference record
//! is a region's 64-byte descriptor and the `u64` offset of the bytes in the region (R: plus a
//! `u64` column for [`R_FRAME_COL`]). Entries:
//!
//! * Python (16 bytes): `u64` position (bit 63 set: a reference record; bit 62 also set: the
//!   shared memory is writable by every holder), `u64` length;
//! * R (24 bytes): `u64` position, `u64` length, a type code byte (bit 7 set: by reference),
//!   seven zero bytes.

use std::ops::Range;

use crate::error::{Result, WireError, malformed};
use crate::store::RegionDesc;

/// Bytes of a reference record: a region descriptor, then the offset in the region.
pub const REF_RECORD: usize = 64 + 8;
/// Python: the position's flag of a buffer sent by reference.
pub const PY_BY_REF: u64 = 1 << 63;
/// Python: the position's flag of a buffer by reference that every holder may write (memory
/// of `pymizu.empty`/`zeros`); only with [`PY_BY_REF`]. Its entry's code is [`PY_WRITABLE`].
pub const PY_WRITABLE_REF: u64 = 1 << 62;
/// Python: the code of an entry whose buffer is writable shared memory.
pub const PY_WRITABLE: u8 = 1;
/// R: the type code's flag of a buffer sent by reference.
pub const R_BY_REF: u8 = 0x80;
/// R: the type code of one column of a data frame value sent on by reference (its reference
/// record carries the column's index after the offset).
pub const R_FRAME_COL: u8 = 8;
/// Bytes of a Python table entry.
pub const PY_ENTRY: usize = 16;
/// Bytes of an R table entry.
pub const R_ENTRY: usize = 24;

/// Which binding wrote the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// pymizu: 16-byte entries.
    Python,
    /// The R package: 24-byte entries with a type code.
    R,
}

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
        /// R: the data frame column ([`R_FRAME_COL`]).
        column: Option<u64>,
    },
}

/// One table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where its bytes are.
    pub place: Place,
    /// R: the type code without the by-reference flag; Python: [`PY_WRITABLE`] or 0.
    pub code: u8,
}

/// A parsed payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The body (pickle or serialization).
    pub body: Range<usize>,
    /// The buffers, in table order.
    pub entries: Vec<Entry>,
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The table's entry count and end, and the body's end, checked against the payload.
fn header(b: &[u8], entry: usize) -> Result<(usize, usize, usize)> {
    if b.len() < 16 {
        return Err(WireError::Truncated {
            what: "out-of-band header",
            offset: 0,
            needed: 16,
            available: b.len(),
        });
    }
    let n = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    let table_end = n
        .checked_mul(entry)
        .and_then(|t| t.checked_add(16))
        .filter(|&e| e <= b.len())
        .ok_or_else(|| malformed(4, format!("{n} buffers do not fit")))?;
    let body_end = (table_end as u64)
        .checked_add(word(b, 8))
        .filter(|&e| e <= b.len() as u64)
        .ok_or_else(|| malformed(8, "the body is out of bounds"))? as usize;
    Ok((n, table_end, body_end))
}

/// Parses a payload's layout (the tag byte is the caller's to check). Every range and record
/// lies inside `b`, after the body; region descriptors are parsed, not adopted.
pub fn parse(b: &[u8], dialect: Dialect) -> Result<Parsed> {
    let entry = match dialect {
        Dialect::Python => PY_ENTRY,
        Dialect::R => R_ENTRY,
    };
    let (n, table_end, body_end) = header(b, entry)?;
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let e = 16 + entry * i;
        let (mut at, len) = (word(b, e), word(b, e + 8));
        let (by_ref, code) = match dialect {
            Dialect::Python => {
                let r = at & PY_BY_REF != 0;
                let w = at & PY_WRITABLE_REF != 0;
                if w && !r {
                    return Err(malformed(e, format!("buffer {i}: writable but not shared")));
                }
                at &= !(PY_BY_REF | PY_WRITABLE_REF);
                (r, if w { PY_WRITABLE } else { 0 })
            }
            Dialect::R => (b[e + 16] & R_BY_REF != 0, b[e + 16] & !R_BY_REF),
        };
        let span = if by_ref {
            REF_RECORD as u64 + if code == R_FRAME_COL { 8 } else { 0 }
        } else {
            len
        };
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
        entries.push(Entry { place, code });
    }
    Ok(Parsed {
        body: table_end..body_end,
        entries,
    })
}

/// The region descriptors a payload refers to, as far as it can be read (for giving back the
/// references of a payload nobody will read: stops at the first malformed entry).
pub fn references(b: &[u8], dialect: Dialect) -> Vec<RegionDesc> {
    let mut out = Vec::new();
    let entry = match dialect {
        Dialect::Python => PY_ENTRY,
        Dialect::R => R_ENTRY,
    };
    let Ok((n, _, body_end)) = header(b, entry) else {
        return out;
    };
    for i in 0..n {
        let e = 16 + entry * i;
        let (at, by_ref) = match dialect {
            Dialect::Python => (
                word(b, e) & !(PY_BY_REF | PY_WRITABLE_REF),
                word(b, e) & PY_BY_REF != 0,
            ),
            Dialect::R => (word(b, e), b[e + 16] & R_BY_REF != 0),
        };
        if !by_ref {
            continue;
        }
        let Some(d) = usize::try_from(at)
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
