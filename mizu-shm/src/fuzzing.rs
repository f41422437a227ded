//! The mutations every fuzz harness of mizu applies to valid inputs (a live segment's
//! header, pool and map control blocks, encoded values, envelopes, ledgers): byte flips, words
//! set to values near a boundary (so a length or an offset is wrong in the ways that matter,
//! not only at random), a splice of another seed's tail and a cut. Starting from what an encoder
//! wrote, a mutation gets past magic numbers and checksums (a harness recomputes those when it
//! wants the parser behind them) into the code that trusts them. For the harnesses only (the
//! `test-helpers` feature).

use proptest::prelude::*;

/// One mutation of a seed.
#[derive(Debug, Clone)]
pub struct Mutation {
    /// Byte positions (taken modulo the length) and what to XOR them with.
    pub flips: Vec<(usize, u8)>,
    /// Aligned words (position modulo the length, 4 or 8 bytes) set to a boundary value.
    pub words: Vec<(usize, bool, usize)>,
    /// Another seed (modulo their number), where its tail starts, and where it goes in this
    /// one.
    pub splice: Option<(usize, usize, usize)>,
    /// Where to cut the result (modulo its length).
    pub cut: Option<usize>,
}

/// Values a length, count or offset word is set to.
fn boundary(i: usize, len: usize) -> u64 {
    let len = len as u64;
    [
        0,
        1,
        63,
        64,
        len,
        len + 1,
        len.wrapping_sub(1),
        1 << 31,
        u64::from(u32::MAX),
        1 << 32,
        1 << 63,
        u64::MAX,
        u64::MAX - 63,
    ][i % 13]
}

/// Any mutation: up to five flips, up to two words, sometimes a splice, sometimes a cut.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    (
        proptest::collection::vec((any::<usize>(), 1..=255u8), 0..6),
        proptest::collection::vec((any::<usize>(), any::<bool>(), any::<usize>()), 0..3),
        proptest::option::weighted(0.2, (any::<usize>(), any::<usize>(), any::<usize>())),
        proptest::option::weighted(0.2, any::<usize>()),
    )
        .prop_map(|(flips, words, splice, cut)| Mutation {
            flips,
            words,
            splice,
            cut,
        })
}

/// A mutation that keeps the length: flips and words only.
pub fn in_place() -> impl Strategy<Value = Mutation> {
    mutation().prop_map(|m| Mutation {
        splice: None,
        cut: None,
        ..m
    })
}

/// Applies the flips and words of `m` to `b` (its length unchanged).
pub fn mutate_in_place(b: &mut [u8], m: &Mutation) {
    let n = b.len();
    if n == 0 {
        return;
    }
    for &(at, x) in &m.flips {
        b[at % n] ^= x;
    }
    for &(at, wide, value) in &m.words {
        let w = if wide { 8 } else { 4 };
        if n < w {
            continue;
        }
        let at = (at % (n - w + 1)) / w * w;
        let v = boundary(value, n).to_le_bytes();
        b[at..at + w].copy_from_slice(&v[..w]);
    }
}

/// `seed` mutated by `m`; a splice takes its tail from one of `others`.
pub fn apply(seed: &[u8], m: &Mutation, others: &[Vec<u8>]) -> Vec<u8> {
    let mut b = seed.to_vec();
    mutate_in_place(&mut b, m);
    if let Some((which, from, into)) = m.splice
        && !others.is_empty()
    {
        let o = &others[which % others.len()];
        let from = if o.is_empty() { 0 } else { from % o.len() };
        let into = if b.is_empty() { 0 } else { into % b.len() };
        b.truncate(into);
        b.extend_from_slice(&o[from..]);
    }
    if let Some(cut) = m.cut {
        let n = if b.is_empty() { 0 } else { cut % b.len() };
        b.truncate(n);
    }
    b
}

/// Keeps this process's shared memory in a directory of its own (under the temporary
/// directory, removed when the process exits normally), so that a harness's mutated segment
/// names can only ever name its own segments. Call before the first segment; idempotent.
pub fn private_place() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("mizu-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a private shared-memory directory");
        crate::place::configure(crate::place::Place::new(&dir, "fz_").expect("a valid place"))
            .expect("configured before the first segment");
        DIR.set(dir).ok();
        extern "C" fn remove() {
            if let Some(d) = DIR.get() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        // SAFETY: `remove` is a plain function that lives as long as the program.
        unsafe { atexit(remove) };
    });
}

static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}
