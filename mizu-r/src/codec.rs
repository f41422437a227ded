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
//! The payload is the runtime's one layout of a language's own payloads
//! (`mizu_pool::wire::oob`, `docs/wire-format.md`): `R` an R serialization, `K` the compact
//! encoding of a small plain value (`small.rs`, whose `R_OOB` items name buffers by index), each
//! in its lower-case letter with a buffer table; `T` a runtime error's text (not an R
//! condition). Buffer codes: a vector in R's layout (`VType::wire`; a character vector in the
//! string layout of `strview.rs`), an Arrow array value, a record batch value (a data frame),
//! or by reference a region and the offset of the bytes in it (a column of a record batch
//! value: and the column).

use extendr_api::Error;
use extendr_api::prelude::*;

use mizu_pool::wire::oob::{code, tag};

/// An R serialization.
pub(crate) const TAG_PLAIN: u8 = tag::R_SERIAL;
/// The compact encoding.
pub(crate) const TAG_SMALL: u8 = tag::COMPACT;
/// [`TAG_PLAIN`] with a buffer table.
pub(crate) const TAG_BUFFERS: u8 = tag::R_SERIAL | tag::WITH_BUFFERS;
/// [`TAG_SMALL`] with a buffer table.
pub(crate) const TAG_SMALL_BUFFERS: u8 = tag::COMPACT | tag::WITH_BUFFERS;
/// A runtime error message (see the module docs).
pub const TAG_TEXT: u8 = tag::TEXT;
/// Lists nested deeper than this are serialized whole.
pub(crate) const MAX_DEPTH: usize = 64;
pub(crate) const PLACEHOLDER: &str = "mizu_oob_";
/// Code of a vector carried as a `mizu-wire` Arrow array value (see `arrow_out.rs`).
pub(crate) const ARROW: u8 = code::ARROW_ARRAY;
/// Code of a data frame carried as a `mizu-wire` Arrow record batch value.
pub(crate) const FRAME: u8 = code::ARROW_TABLE;
/// Code of one column of a data frame value sent on by reference.
pub(crate) const FRAME_COL: u8 = code::ARROW_COLUMN;

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
