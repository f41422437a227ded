//! Per-element streams: what makes a seeded parallel map reproducible for any worker count,
//! chunking or steal order, and identical in Python and R.
//!
//! Element `i` of a map seeded with `seed` draws from Philox4x64-10 with
//!
//! * key `[seed, 0]` — numpy: `key = seed`;
//! * counter `[0, 0, i, 0]` before the first increment — numpy: `counter = i << 128`.
//!
//! So `np.random.Generator(np.random.Philox(key=seed, counter=i << 128))` reproduces element
//! `i` exactly. Each element owns 2^128 blocks before its counter could reach the next
//! element's, so streams never overlap. Word 3 of the counter is reserved (zero) for nested
//! maps. A map over a slice starting at `offset` uses element indices `offset + i`, so a map
//! split in two parts reproduces the whole.

use crate::rng::Philox4x64;

/// Key and initial counter of element `element` of a map seeded with `seed`.
pub fn element_key_counter(seed: u64, element: u64) -> ([u64; 2], [u64; 4]) {
    ([seed, 0], [0, 0, element, 0])
}

/// The generator of element `element` of a map seeded with `seed`.
pub fn element_stream(seed: u64, element: u64) -> Philox4x64 {
    let (key, counter) = element_key_counter(seed, element);
    Philox4x64::new(key, counter)
}

/// The generator of the `i`-th element of a part of a map that starts at element `offset`.
/// Panics if `offset + i` overflows `u64` (no map has that many elements).
pub fn element_stream_at(seed: u64, offset: u64, i: u64) -> Philox4x64 {
    element_stream(
        seed,
        offset.checked_add(i).expect("element index overflows u64"),
    )
}
