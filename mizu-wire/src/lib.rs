//! How values travel in mizu: frames for ring slots, shared data segments for large payloads
//! (read in place by the receiver), the compact tagged value encoding, Arrow IPC for columnar
//! data (zero-copy views over the mapping) and the R-semantics metadata.
//!
//! The normative format is `docs/wire-format.md`. This crate does not depend on Python or R.

pub mod error;
pub mod frame;
mod janitor;
pub mod ledger;
pub mod rmeta;
pub mod store;
pub mod value;

pub use error::{Result, WireError};
pub use frame::{Received, read_value, write_region, write_value};
pub use store::{DataPool, Mapper, Region, RegionDesc};
pub use value::{CallTarget, Encoded, PrimitiveLayout, Value, decode, decode_slice, encode};
