//! The Philox bijections of Random123 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
//! easy as 1, 2, 3", SC11): ten rounds of multiply-high/low mixing of a counter under a key.

/// Philox4x64 round multipliers.
const M64: [u64; 2] = [0xD2E7_470E_E14C_6C93, 0xCA5A_8263_9512_1157];
/// Philox4x64 key increments (golden ratio, sqrt(3) - 1).
const W64: [u64; 2] = [0x9E37_79B9_7F4A_7C15, 0xBB67_AE85_84CA_A73B];
/// Philox4x32 round multipliers.
const M32: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
/// Philox4x32 key increments.
const W32: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];

#[inline(always)]
fn mulhilo64(a: u64, b: u64) -> (u64, u64) {
    let p = u128::from(a) * u128::from(b);
    ((p >> 64) as u64, p as u64)
}

#[inline(always)]
fn round64(c: [u64; 4], k: [u64; 2]) -> [u64; 4] {
    let (hi0, lo0) = mulhilo64(M64[0], c[0]);
    let (hi1, lo1) = mulhilo64(M64[1], c[2]);
    [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
}

/// Philox4x64-10: the block for `counter` under `key`.
#[inline]
pub fn philox4x64_10(counter: [u64; 4], key: [u64; 2]) -> [u64; 4] {
    let mut c = counter;
    let mut k = key;
    c = round64(c, k);
    for _ in 1..10 {
        k = [k[0].wrapping_add(W64[0]), k[1].wrapping_add(W64[1])];
        c = round64(c, k);
    }
    c
}

/// Philox4x64-10 of `L` consecutive counters (`counter + 1`, …, `counter + L`, as the
/// generator steps: incremented before each block), the blocks in that order; the counter ends
/// at the last one. The rounds of the `L` blocks run interleaved: each block is a chain of ten
/// dependent multiplications, and independent chains side by side keep the multiplier busy
/// instead of waiting for each product (~1.4x the throughput of one block at a time here).
#[inline(always)]
pub(crate) fn philox4x64_10_lanes<const L: usize>(
    counter: &mut [u64; 4],
    key: [u64; 2],
) -> [[u64; 4]; L] {
    let mut c = [[0u64; 4]; L];
    for lane in c.iter_mut() {
        increment(counter);
        *lane = *counter;
    }
    let mut k = key;
    for lane in c.iter_mut() {
        *lane = round64(*lane, k);
    }
    for _ in 1..10 {
        k = [k[0].wrapping_add(W64[0]), k[1].wrapping_add(W64[1])];
        for lane in c.iter_mut() {
            *lane = round64(*lane, k);
        }
    }
    c
}

#[inline(always)]
fn mulhilo32(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

#[inline(always)]
fn round32(c: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let (hi0, lo0) = mulhilo32(M32[0], c[0]);
    let (hi1, lo1) = mulhilo32(M32[1], c[2]);
    [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
}

/// Philox4x32-10: the block for `counter` under `key`.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    c = round32(c, k);
    for _ in 1..10 {
        k = [k[0].wrapping_add(W32[0]), k[1].wrapping_add(W32[1])];
        c = round32(c, k);
    }
    c
}

/// Adds `n` to a little-endian multi-word counter, wrapping at the top.
#[inline]
pub(crate) fn add_counter<const N: usize>(ctr: &mut [u64; N], n: &[u64; N]) {
    let mut carry = 0u64;
    for i in 0..N {
        let (s1, c1) = ctr[i].overflowing_add(n[i]);
        let (s2, c2) = s1.overflowing_add(carry);
        ctr[i] = s2;
        carry = u64::from(c1) + u64::from(c2);
    }
}

/// Adds one to a little-endian 4-word counter.
#[inline(always)]
pub(crate) fn increment(ctr: &mut [u64; 4]) {
    for w in ctr.iter_mut() {
        *w = w.wrapping_add(1);
        if *w != 0 {
            return;
        }
    }
}

/// Adds one to a little-endian 4-word `u32` counter.
#[inline(always)]
pub(crate) fn increment32(ctr: &mut [u32; 4]) {
    for w in ctr.iter_mut() {
        *w = w.wrapping_add(1);
        if *w != 0 {
            return;
        }
    }
}
