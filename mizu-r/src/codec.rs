//! R payloads: R's serialization of a value, with every large atomic vector (and data frame of
//! such columns) taken out and carried as an out-of-band buffer, laid out in one task payload —
//! so a large value travels in one shared-memory region copied once from the sender's vectors,
//! and the receiver sees each buffer as an ALTREP view of that region.
//!
//! Encoding walks the value's lists; each vector of at least [`FLOOR`] bytes (a character
//! vector: of 512 elements or more, see `strview.rs`), and each data frame whose columns Arrow
//! maps (see `arrow_out.rs`) of at least as many bytes, is replaced, for the length of the
//! serialization, by a placeholder (an external pointer tagged `mizu_oob_<k>` carrying the
//! value's attributes; a data frame's also carries a list of its columns' attributes in its
//! `prot` field) and put back afterwards. Decoding unserializes and puts view `k` (with the
//! placeholder's attributes) where each placeholder is. Serialization goes straight through
//! R's C API into a byte buffer.
//!
//! Layout (all integers little-endian; offsets from the payload start):
//! * `R` then the serialization — no buffers;
//! * `S` then the compact encoding of a small plain value (see `small.rs`) — no buffers;
//! * `V`, 3 zero bytes, `u32` buffer count `n`, `u64` serialization length, then `n` entries of
//!   (`u64` offset, `u64` length, `u8` type code, 7 zero bytes), the serialization, then each
//!   buffer at its offset, 64-byte aligned. Type codes: 0–5 a vector in R's layout
//!   ([`VType`]: integer, double, logical, raw, complex, the string layout of `strview.rs`), 6
//!   a `mizu-wire` Arrow array value, 7 a `mizu-wire` record batch value (a data frame), and
//!   with bit `0x80` a reference instead: a region descriptor (64 bytes) and the `u64` offset
//!   in the region of the bytes (code 8: a record batch value, followed by the `u64` column);
//! * `T` then UTF-8 text: a runtime error (not an R condition).

use extendr_api::Error;
use extendr_api::prelude::*;

pub(crate) const TAG_PLAIN: u8 = b'R';
pub(crate) const TAG_SMALL: u8 = b'S';
pub(crate) const TAG_BUFFERS: u8 = b'V';
/// Buffers as [`TAG_BUFFERS`], with the compact encoding (`small.rs`) as the body.
pub(crate) const TAG_SMALL_BUFFERS: u8 = b'W';
/// A runtime error message (see the module docs).
pub const TAG_TEXT: u8 = b'T';
pub(crate) const ALIGN: usize = 64;
/// Lists nested deeper than this are serialized whole.
pub(crate) const MAX_DEPTH: usize = 64;
pub(crate) const PLACEHOLDER: &str = "mizu_oob_";
/// Type code of a vector carried as a `mizu-wire` Arrow array value (see `arrow_out.rs`).
pub(crate) const ARROW: u8 = 6;
/// Type code of a data frame carried as a `mizu-wire` Arrow record batch value.
pub(crate) const FRAME: u8 = 7;

pub(crate) fn bad(why: impl std::fmt::Display) -> Error {
    crate::rerr(format!("malformed payload: {why}"))
}

/// A decoded payload.
pub enum Decoded {
    /// The value.
    Value(Robj),
    /// A runtime error's text.
    Text(String),
}

/// A runtime error as a payload.
pub fn text(msg: &str) -> Vec<u8> {
    let mut v = vec![TAG_TEXT];
    v.extend_from_slice(msg.as_bytes());
    v
}
