//! The compact tagged value encoding (normative text: `docs/wire-format.md`).
//!
//! Encoding produces a scatter list: small items are copied into owned chunks, large byte
//! strings and Arrow bodies are referenced, so writing a value into a region is one copy.
//! Positions are relative to the start of the value, which must land 64-byte aligned; large
//! byte strings and Arrow IPC streams are padded to 64-byte boundaries so receivers can view
//! them in place.

pub(crate) mod arrow;
pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod tree;

pub use crate::compact::{ALIGNED_BYTES_MIN, MAX_DEPTH};
pub use arrow::{passed_before, passed_check};
pub(crate) use decode::decode_in;
pub use decode::{arrow_schema, decode, decode_received, decode_shared, decode_slice};
pub use encode::{Encoded, PrimitiveLayout, encode, encode_aligned};
pub use tree::{CallTarget, Value, array};
