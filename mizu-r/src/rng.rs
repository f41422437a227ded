//! R's user-supplied RNG hook: inside element `i` of a seeded map, R's `unif_rand()` (and so
//! `runif`, `rnorm`, `sample`) draws from the `mizu-rng` stream of `(seed, i)` — the stream
//! numpy's `Generator(Philox(key=seed, counter=i << 128))` reads, double for double.
//!
//! R finds the hook by name (`user_unif_rand`) once `RNGkind("user-supplied")` is set; the R
//! side (`pkg/R/rng.R`) switches to it around each element and restores the user's RNG kind
//! and `.Random.seed` afterwards.

use std::cell::{Cell, RefCell};

use extendr_api::Result;
use mizu_rng::{Philox4x64, element_stream};

thread_local! {
    static STREAM: RefCell<Option<Philox4x64>> = const { RefCell::new(None) };
}

/// R reads the draw through a pointer it gets from `user_unif_rand`: it must outlive the call.
struct Slot(Cell<f64>);
// SAFETY: R calls the hook only from its main thread; the cell is never touched elsewhere.
unsafe impl Sync for Slot {}
static DRAW: Slot = Slot(Cell::new(0.5));

fn seed_of(seed: f64) -> Result<u64> {
    if !(seed.is_finite() && seed >= 0.0 && seed.fract() == 0.0 && seed < 9007199254740992.0) {
        return Err(crate::rerr(format!(
            "a seed must be a whole number in [0, 2^53), got {seed}"
        )));
    }
    Ok(seed as u64)
}

fn index_of(i: f64) -> Result<u64> {
    if !(i.is_finite() && i >= 0.0 && i.fract() == 0.0 && i < 9007199254740992.0) {
        return Err(crate::rerr(format!("bad element index {i}")));
    }
    Ok(i as u64)
}

/// R's hook: the next double of the current stream, `(u64 >> 11) * 2^-53`. Outside a seeded
/// element (someone set the RNG kind by hand) it draws from the stream of seed 0, element 0.
#[unsafe(no_mangle)]
pub extern "C" fn user_unif_rand() -> *mut f64 {
    let x = STREAM.with(|s| {
        s.borrow_mut()
            .get_or_insert_with(|| element_stream(0, 0))
            .next_f64()
    });
    DRAW.0.set(x);
    DRAW.0.as_ptr()
}

pub(crate) fn rng_enter(seed: f64, index: f64) -> Result<()> {
    let s = element_stream(seed_of(seed)?, index_of(index)?);
    STREAM.with(|c| *c.borrow_mut() = Some(s));
    Ok(())
}

pub(crate) fn rng_exit() {
    STREAM.with(|c| *c.borrow_mut() = None);
}

pub(crate) fn rng_stream(seed: f64, index: f64, n: i32) -> Result<Vec<f64>> {
    let mut s = element_stream(seed_of(seed)?, index_of(index)?);
    Ok((0..n.max(0)).map(|_| s.next_f64()).collect())
}
