//! The compact tagged encoding's tags and primitive items (normative text:
//! `docs/wire-format.md` §3), written and read in one place: the value tree's codec
//! ([`crate::value`]) builds on them, and so do the bindings' same-language fast paths, which
//! write and read their own objects item by item without building a tree (a trivial task's
//! round trip has no time for allocations).
//!
//! Tags `00`–`0F` are the items every reader understands. Tags from `10` are items of one
//! language, which only that language's same-language payloads carry; a reader of the other
//! language (or of the value tree) rejects them as unknown tags.

use crate::error::{Result, WireError, malformed};

/// The tag bytes.
pub mod tag {
    /// None / NULL.
    pub const NONE: u8 = 0x00;
    /// false.
    pub const FALSE: u8 = 0x01;
    /// true.
    pub const TRUE: u8 = 0x02;
    /// int64: 8 bytes.
    pub const INT: u8 = 0x03;
    /// float64: 8 bytes (the bit pattern).
    pub const FLOAT: u8 = 0x04;
    /// complex: two float64.
    pub const COMPLEX: u8 = 0x05;
    /// A string: varint length, UTF-8.
    pub const STR: u8 = 0x06;
    /// Bytes: varint length, padding to 64 when at least 64 bytes, the bytes.
    pub const BYTES: u8 = 0x07;
    /// A list: varint count, values.
    pub const LIST: u8 = 0x08;
    /// A dict with string keys: varint count, (string, value) pairs.
    pub const DICT: u8 = 0x09;
    /// An error: type name, message, traceback (strings).
    pub const ERROR: u8 = 0x0A;
    /// A call: u8 form, target, arguments, keyword arguments.
    pub const CALL: u8 = 0x0B;
    /// An Arrow array (one-field IPC stream).
    pub const ARRAY: u8 = 0x0C;
    /// An Arrow table.
    pub const TABLE: u8 = 0x0D;
    /// A reference to an array or table in a region.
    pub const SHARED: u8 = 0x0E;
    /// Alignment padding before an array or table.
    pub const ALIGNED: u8 = 0x0F;

    /// Python: a tuple (varint count, values).
    pub const PY_TUPLE: u8 = 0x10;
    /// Python: a dict whose keys are not all strings (varint count, (value, value) pairs).
    pub const PY_DICT: u8 = 0x11;
    /// Python: a numpy array, its bytes inline.
    pub const PY_NDARRAY: u8 = 0x12;
    /// Python: a numpy array whose bytes are one of the payload's buffers (`oob`), named by
    /// its varint index.
    pub const PY_NDARRAY_OOB: u8 = 0x13;

    /// R: an atomic vector (u8 type, varint length, the elements).
    pub const R_VECTOR: u8 = 0x18;
    /// R: a value with a `names` attribute (the names, a character vector item; the value).
    pub const R_NAMED: u8 = 0x19;
    /// R: a symbol (varint length, UTF-8 name).
    pub const R_SYMBOL: u8 = 0x1A;
    /// R: a call (varint count; per node a flag byte, 1 when tagged then the tag as a symbol
    /// item; the node's value).
    pub const R_CALL: u8 = 0x1B;
    /// R: the missing argument.
    pub const R_MISSING: u8 = 0x1C;
    /// R: a vector carried out of band (varint index into the payload's buffers; R's
    /// same-language payloads with buffers only).
    pub const R_OOB: u8 = 0x1D;
    /// R: a function of the global environment (varint byte length of the rest; varint count
    /// of formals, each a symbol item and its default, `R_MISSING` for none; then the body).
    pub const R_CLOSURE: u8 = 0x1E;
    /// R: a pairlist, such as the formals of a `function` call (as [`R_CALL`], a node list).
    pub const R_PAIRLIST: u8 = 0x1F;
}

/// Call forms (the byte after [`tag::CALL`]).
pub mod form {
    /// A qualified name in the worker's language (string).
    pub const NAME: u8 = 0;
    /// Source text (string).
    pub const SOURCE: u8 = 1;
    /// A function in the caller's own serialization (varint length, the bytes: a pickle by
    /// reference); same-language payloads only.
    pub const NATIVE: u8 = 2;
}

/// Deepest nesting of lists, dicts and calls a decoder accepts.
pub const MAX_DEPTH: usize = 64;

/// Byte strings at least this long are 64-byte aligned.
pub const ALIGNED_BYTES_MIN: usize = 64;

/// `v` as an unsigned LEB128 varint: the bytes and how many of them are used.
pub fn varint(mut v: u64) -> ([u8; 10], usize) {
    let mut buf = [0u8; 10];
    let mut n = 0;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        buf[n] = b | if v != 0 { 0x80 } else { 0 };
        n += 1;
        if v == 0 {
            return (buf, n);
        }
    }
}

/// Appends the varint of `v`.
#[inline]
pub fn put_varint(out: &mut Vec<u8>, v: u64) {
    // Most varints are a small length or count: one byte, written in place by the caller's
    // code rather than through a call and a copy (an encoded task writes a dozen).
    if v < 0x80 {
        out.push(v as u8);
    } else {
        put_long_varint(out, v);
    }
}

fn put_long_varint(out: &mut Vec<u8>, v: u64) {
    let (b, n) = varint(v);
    out.extend_from_slice(&b[..n]);
}

/// Appends a string (varint length, UTF-8).
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Appends a bytes item (tag, length, padding, bytes); `base` is where the outermost value
/// starts in `out` (padding is relative to it).
pub fn put_bytes(out: &mut Vec<u8>, base: usize, b: &[u8]) {
    out.push(tag::BYTES);
    put_varint(out, b.len() as u64);
    if b.len() >= ALIGNED_BYTES_MIN {
        let at = out.len() - base;
        out.resize(out.len() + (at.next_multiple_of(64) - at), 0);
    }
    out.extend_from_slice(b);
}

/// Reads items from untrusted bytes: every length is checked against what is left before
/// anything is sized by it.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    /// The position of the next byte.
    pub pos: usize,
    /// Where the outermost value starts (alignment padding is relative to it).
    pub base: usize,
}

impl<'a> Reader<'a> {
    /// A reader of `bytes` at `pos`, the outermost value starting at `base`.
    pub fn new(bytes: &'a [u8], pos: usize, base: usize) -> Reader<'a> {
        Reader { bytes, pos, base }
    }

    /// The bytes read.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Bytes not read yet.
    pub fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Whether every byte was read.
    pub fn at_end(&self) -> bool {
        self.pos == self.bytes.len()
    }

    /// Fails unless `n` more bytes are there.
    pub fn need(&self, what: &'static str, n: usize) -> Result<()> {
        let available = self.left();
        if n > available {
            return Err(WireError::Truncated {
                what,
                offset: self.pos,
                needed: n,
                available,
            });
        }
        Ok(())
    }

    /// The next `n` bytes.
    pub fn take(&mut self, what: &'static str, n: usize) -> Result<&'a [u8]> {
        self.need(what, n)?;
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        Ok(self.take(what, N)?.try_into().expect("N bytes"))
    }

    /// A byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(what, 1)?[0])
    }

    /// A little-endian u64.
    pub fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A little-endian i64.
    pub fn i64(&mut self, what: &'static str) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// A float64 from its little-endian bit pattern.
    pub fn f64(&mut self, what: &'static str) -> Result<f64> {
        Ok(f64::from_bits(self.u64(what)?))
    }

    /// A varint (at most 10 bytes, the 10th at most 1).
    pub fn varint(&mut self, what: &'static str) -> Result<u64> {
        let start = self.pos;
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8(what)?;
            if i == 9 && b > 1 {
                return Err(malformed(
                    start,
                    format!("{what}: varint overflows 64 bits"),
                ));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(malformed(
            start,
            format!("{what}: varint longer than 10 bytes"),
        ))
    }

    /// A length that must fit in what is left (never allocate for a claimed size).
    pub fn len(&mut self, what: &'static str) -> Result<usize> {
        self.len_of(what, 1)
    }

    /// A count of items of at least `each` bytes, which must fit in what is left.
    pub fn len_of(&mut self, what: &'static str, each: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.varint(what)?;
        let left = self.left() as u64;
        if n.saturating_mul(each.max(1) as u64) > left {
            return Err(WireError::Truncated {
                what,
                offset: at,
                needed: n.saturating_mul(each.max(1) as u64).min(usize::MAX as u64) as usize,
                available: left as usize,
            });
        }
        Ok(n as usize)
    }

    /// A string item's text (varint length, UTF-8), borrowed.
    pub fn str(&mut self, what: &'static str) -> Result<&'a str> {
        let n = self.len(what)?;
        let at = self.pos;
        let b = self.take(what, n)?;
        std::str::from_utf8(b).map_err(|e| malformed(at, format!("{what}: invalid UTF-8: {e}")))
    }

    /// A bytes item's content after its tag (length, padding, bytes), borrowed.
    pub fn bytes_item(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let n = self.len(what)?;
        if n >= ALIGNED_BYTES_MIN {
            self.skip_padding()?;
        }
        self.take(what, n)
    }

    /// Zero bytes up to the next multiple of 64 from `base`.
    pub fn skip_padding(&mut self) -> Result<()> {
        let rel = self.pos - self.base;
        let pad = rel.next_multiple_of(64) - rel;
        let at = self.pos;
        if self.take("alignment padding", pad)?.iter().any(|&b| b != 0) {
            return Err(malformed(at, "non-zero alignment padding"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_overlong_ones_are_refused() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut r = Reader::new(&out, 0, 0);
            assert_eq!(r.varint("v").unwrap(), v);
            assert!(r.at_end());
        }
        let mut over = vec![0xff; 9];
        over.push(2);
        assert!(Reader::new(&over, 0, 0).varint("v").is_err());
        assert!(Reader::new(&[0x80; 11], 0, 0).varint("v").is_err());
        assert!(Reader::new(&[0x80], 0, 0).varint("v").is_err());
    }

    #[test]
    fn lengths_never_exceed_what_is_left() {
        let mut out = Vec::new();
        put_varint(&mut out, 5);
        out.extend_from_slice(b"abc");
        assert!(Reader::new(&out, 0, 0).len("n").is_err());
        let mut two = Vec::new();
        put_varint(&mut two, 2);
        two.extend_from_slice(&[0; 8]);
        assert!(Reader::new(&two, 0, 0).len_of("n", 8).is_err());
        assert_eq!(Reader::new(&two, 0, 0).len_of("n", 4).unwrap(), 2);
    }

    #[test]
    fn bytes_are_padded_relative_to_the_value_start() {
        for base in [0usize, 1, 63] {
            let mut out = vec![0xee; base];
            let long = vec![7u8; 100];
            put_bytes(&mut out, base, &long);
            put_bytes(&mut out, base, b"short");
            let mut r = Reader::new(&out, base, base);
            assert_eq!(r.u8("t").unwrap(), tag::BYTES);
            let got = r.bytes_item("b").unwrap();
            assert_eq!(got, &long[..]);
            assert_eq!(
                (got.as_ptr() as usize - out.as_ptr() as usize - base) % 64,
                0
            );
            assert_eq!(r.u8("t").unwrap(), tag::BYTES);
            assert_eq!(r.bytes_item("b").unwrap(), b"short");
            assert!(r.at_end());
        }
        // Non-zero padding is refused.
        let mut out = Vec::new();
        put_bytes(&mut out, 0, &[1u8; 64]);
        out[3] = 1;
        let mut r = Reader::new(&out, 1, 0);
        assert!(r.bytes_item("b").is_err());
    }
}
