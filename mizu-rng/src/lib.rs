//! Counter-based random numbers for reproducible parallel maps: Philox4x64-10 and
//! Philox4x32-10 (Random123), as `rand_core` 0.10 generators whose 64-bit streams equal numpy's
//! `np.random.Philox`, plus the per-element stream keying every mizu map uses.
//!
//! No dependency beyond `rand_core`. See the crate README for the stream definition.
//!
//! # Example
//!
//! Element 3 of a map seeded with 42 draws the same numbers wherever it runs (numpy:
//! `np.random.Generator(np.random.Philox(key=42, counter=3 << 128))`):
//!
//! ```
//! let mut a = mizu_rng::element_stream(42, 3);
//! let mut b = mizu_rng::element_stream(42, 3);
//! assert_eq!(a.next_f64(), b.next_f64());
//! assert_ne!(mizu_rng::element_stream(42, 4).next_u64(), mizu_rng::element_stream(42, 3).next_u64());
//! ```

pub mod philox;
pub mod rng;
pub mod stream;

pub use philox::{philox4x32_10, philox4x64_10};
pub use rng::{Philox4x32, Philox4x32Core, Philox4x64, Philox4x64Core, u64_to_f64};
pub use stream::{element_key_counter, element_stream, element_stream_at};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
