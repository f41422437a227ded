//! The values the bindings convert their languages' objects to and from, as the runtime
//! carries them (the format is `mizu-wire`'s; `docs/wire-format.md` is normative): the
//! [`Value`] tree and its encoding, the cross-language task envelope, the R metadata both
//! languages honour, the compact encoding and out-of-band records of a language's own
//! payloads, and the data-segment regions large values live in.
//!
//! A binding names these through `mizu_pool::wire` and nothing of the layers below: what it
//! needs of storage policy (room in `/dev/shm`, giving back, pruning) is the runtime's
//! ([`crate::pressure`], [`crate::share`], [`crate::machine`]).

pub use mizu_wire::copy::copy_large;
pub use mizu_wire::{
    CallTarget, DataPool, Encoded, Mapper, PrimitiveLayout, Region, RegionDesc, Result, Value,
    WireError, compact, decode, decode_received, encode, envelope, frame, oob, passed_before,
    passed_check, rmeta, rser,
};
