//! Native code of the `mizu` R package: the extendr layer over `mizu-pool`. It converts types,
//! lays out R payloads (R's serialization plus large vectors as out-of-band buffers in shared
//! memory), hands received vectors to R as ALTREP views of shared pages, runs R as a worker's
//! executor, and drives R's RNG from `mizu-rng` streams. The R API is in `pkg/R/`.
//!
//! R is single-threaded: every function here runs on R's main thread, and nothing calls into
//! R from another thread.

// The crate has no Rust API: what it exports are the `wrap__*` entry points extendr generates
// for R, which cannot carry doc comments. The R API is documented in `pkg/man`.
#![allow(missing_docs)]

mod altrep;
mod arrow_in;
mod arrow_out;
mod batch;
mod channel;
mod codec;
mod collect;
mod decode;
mod encode;
mod entry;
mod fast;
mod ffi;
mod functions;
mod globals;
mod handle;
mod heap;
mod interrupt;
mod kernels;
mod lazyview;
mod ntcopy;
mod outvec;
mod payload;
mod pool;
mod rng;
mod rtry;
mod sendable;
mod small;
mod small_read;
mod spill;
mod strview;
mod submit;
mod symbols;
mod task;
mod values;
mod view;
mod worker;
mod xcall;
mod xvalue;
mod xvalue_in;

use extendr_api::prelude::*;
use extendr_api::{Error, Result};

/// An error message for R (raised by the generated wrapper as an R error).
pub(crate) fn rerr(e: impl std::fmt::Display) -> Error {
    Error::Other(format!("mizu: {e}"))
}

/// Refuses handles inherited through `fork()` (e.g. `parallel::mclapply`): the child does
/// not own the parent's pool.
pub(crate) fn forked(origin: mizu_pool::Origin) -> Result<()> {
    origin.check().map_err(|_| {
        rerr("this handle belongs to the parent process; a forked child cannot use it")
    })
}

pub(crate) fn init_native() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Payloads nobody reads (abandoned results, cancelled inputs, undone submissions)
        // give back the regions they refer to.
        mizu_pool::set_discard_hook(decode::release_refs);
        // A full `/dev/shm`: views R's garbage still holds give their regions back. Every
        // path that needs room runs on R's main thread.
        mizu_pool::set_pressure_hook(altrep::collect_under_pressure);
        // SAFETY: the package's load, on R's main thread.
        unsafe { functions::init() };
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("mizu: "));
            if !ours {
                previous(info);
            }
        }));
    });
}

pub(crate) fn is_compiled(f: Robj) -> bool {
    // SAFETY: `f` is live (held for this call); TYPEOF reads any SEXP, and BODY is read only
    // of a closure.
    unsafe {
        let x = f.get();
        extendr_ffi::TYPEOF(x) == extendr_ffi::SEXPTYPE::CLOSXP
            && extendr_ffi::TYPEOF(extendr_ffi::get_closure_body(x))
                == extendr_ffi::SEXPTYPE::BCODESXP
    }
}

pub(crate) fn prune() -> Result<Vec<String>> {
    mizu_pool::machine::prune().map_err(rerr)
}

pub(crate) fn shm_names() -> Vec<String> {
    mizu_pool::machine::shm_names()
}

pub(crate) fn line_round_trip_ns(a: i32, b: i32) -> Result<f64> {
    let cpu = |c: i32| usize::try_from(c).map_err(|_| rerr(format!("no CPU {c}")));
    mizu_pool::machine::line_round_trip(cpu(a)?, cpu(b)?, 20_000, 5).map_err(rerr)
}

extendr_module! {
    mod mizu;
    use entry;
}
