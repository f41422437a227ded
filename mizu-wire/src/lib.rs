//! How values travel in mizu: frames for ring slots, shared data segments for large payloads
//! (read in place by the receiver), the compact tagged value encoding, Arrow IPC for columnar
//! data (zero-copy views over the mapping), the R-semantics metadata, and the check R's own
//! serialization passes before R reads it.
//!
//! The normative format is `docs/wire-format.md`. This crate does not depend on Python or R.
//! Under `--cfg mizu_loom` only the atomic protocols (`refs`, `ledger_entry`) are built, on
//! loom's atomics, for the models in `tests/loom.rs`.
//!
//! # Example
//!
//! A value encoded and decoded (across processes, a large one travels through a region of a
//! data segment instead; see `examples/large_value.rs`):
//!
//! ```
//! use mizu_wire::{Value, decode_slice, encode};
//!
//! let v = Value::List(vec![Value::Int(1), Value::Str("水".into()), Value::None]);
//! let bytes = encode(&v)?.to_vec();
//! assert_eq!(decode_slice(&bytes)?, v);
//! # Ok::<(), mizu_wire::WireError>(())
//! ```

pub mod ledger_entry;
pub mod refs;

#[cfg(not(mizu_loom))]
mod checked;
#[cfg(not(mizu_loom))]
pub mod compact;
#[cfg(not(mizu_loom))]
pub mod copy;
#[cfg(not(mizu_loom))]
pub mod envelope;
#[cfg(not(mizu_loom))]
pub mod error;
#[cfg(not(mizu_loom))]
pub mod frame;
#[cfg(not(mizu_loom))]
mod janitor;
#[cfg(not(mizu_loom))]
pub mod ledger;
#[cfg(not(mizu_loom))]
pub mod oob;
#[cfg(not(mizu_loom))]
pub mod rmeta;
#[cfg(not(mizu_loom))]
pub mod rser;
#[cfg(not(mizu_loom))]
pub mod store;
#[cfg(not(mizu_loom))]
pub mod value;

#[cfg(not(mizu_loom))]
pub use {
    error::{Result, WireError},
    frame::{Received, read_value, write_region, write_value},
    store::{DataPool, Mapper, Region, RegionDesc},
    value::{
        CallTarget, Encoded, PrimitiveLayout, Value, arrow_schema, decode, decode_received,
        decode_shared, decode_slice, encode, encode_aligned, passed_before, passed_check,
    },
};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
