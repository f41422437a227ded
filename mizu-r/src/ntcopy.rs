//! Copies of integer and double vectors into a payload that find R's NAs on the way.
//!
//! A large payload is written once and read by another process, so the copy uses streaming
//! (non-temporal) stores, as glibc's `memcpy` does for large copies: a copy in 32 KiB pieces
//! through the cache, with a pass over each piece for the NAs, cost 1.6x the plain `memcpy`
//! of an 8 MB vector. Here each pair (double) or quadruple (integer) of elements is loaded
//! once, stored with a streaming store and compared in the same registers: the validity
//! bitmap costs nothing measurable next to the copy.

/// `NA_integer_`.
const NA_INTEGER: i32 = i32::MIN;

/// R's test for `NA_real_` (a NaN whose low word is 1954), as opposed to other NaNs.
pub fn is_na_real(v: f64) -> bool {
    v.is_nan() && (v.to_bits() & 0xFFFF_FFFF) == 1954
}

/// Writes validity word `k` (64 elements; fewer bytes for the last) into `bits`.
fn put_word(bits: &mut [u8], k: usize, w: u64) {
    let o = k * 8;
    let m = bits.len().saturating_sub(o).min(8);
    bits[o..o + m].copy_from_slice(&w.to_le_bytes()[..m]);
}

/// The validity word of up to 64 elements, exactly.
fn word<T: Copy>(c: &[T], valid: impl Fn(T) -> bool) -> u64 {
    c.iter()
        .enumerate()
        .fold(0u64, |w, (j, &x)| w | (u64::from(valid(x)) << j))
}

/// Copies `src` into `dst` (its bytes), setting bit `i` of `bits` when element `i` is not
/// R's NA; the number of NAs. Any alignment, any architecture.
fn portable<T: Copy>(
    src: &[T],
    dst: &mut [u8],
    bits: &mut [u8],
    valid: impl Fn(T) -> bool,
) -> usize {
    // SAFETY: the elements are plain data.
    let bytes = unsafe {
        std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), std::mem::size_of_val(src))
    };
    dst[..bytes.len()].copy_from_slice(bytes);
    let mut nulls = 0;
    for (k, c) in src.chunks(64).enumerate() {
        let w = word(c, &valid);
        nulls += c.len() - w.count_ones() as usize;
        put_word(bits, k, w);
    }
    nulls
}

/// [`portable`] for doubles (`NA_real_` is not valid; other NaNs are).
pub fn copy_doubles(src: &[f64], dst: &mut [u8], bits: &mut [u8]) -> usize {
    assert!(dst.len() >= std::mem::size_of_val(src) && bits.len() >= src.len().div_ceil(8));
    #[cfg(target_arch = "x86_64")]
    if (dst.as_ptr() as usize).is_multiple_of(16) {
        use std::arch::x86_64::{
            _mm_cmpunord_pd, _mm_loadu_pd, _mm_movemask_pd, _mm_sfence, _mm_stream_pd,
        };
        let full = src.len() / 64;
        let mut nulls = 0;
        let d = dst.as_mut_ptr().cast::<f64>();
        for k in 0..full {
            let mut nan = 0u64;
            // SAFETY: SSE2 is part of x86_64; elements k*64 .. k*64+64 exist in `src` and
            // have room in `dst` (asserted), whose start is 16-byte aligned (checked), as is
            // every even element of it; unaligned loads from `src`.
            unsafe {
                for j in (0..64).step_by(2) {
                    let v = _mm_loadu_pd(src.as_ptr().add(k * 64 + j));
                    _mm_stream_pd(d.add(k * 64 + j), v);
                    nan |= (_mm_movemask_pd(_mm_cmpunord_pd(v, v)) as u64) << j;
                }
            }
            let w = if nan == 0 {
                u64::MAX
            } else {
                word(&src[k * 64..k * 64 + 64], |x| !is_na_real(x))
            };
            nulls += 64 - w.count_ones() as usize;
            put_word(bits, k, w);
        }
        // SAFETY: SSE2; orders the streaming stores before the stores that publish the
        // payload to its reader.
        unsafe { _mm_sfence() };
        let tail = &src[full * 64..];
        return nulls
            + portable(tail, &mut dst[full * 512..], &mut bits[full * 8..], |x| {
                !is_na_real(x)
            });
    }
    portable(src, dst, bits, |x| !is_na_real(x))
}

/// [`portable`] for integers (`NA_integer_` is not valid).
pub fn copy_integers(src: &[i32], dst: &mut [u8], bits: &mut [u8]) -> usize {
    copy_ints::<false>(src, dst, bits)
}

/// Factor codes (1-based, `NA_integer_`) as Arrow dictionary keys (0-based, 0 under a null),
/// with the validity bits; the number of NAs.
pub fn copy_codes(src: &[i32], dst: &mut [u8], bits: &mut [u8]) -> usize {
    copy_ints::<true>(src, dst, bits)
}

/// The integers of `src` into `dst` — as they are, or with `KEYS` as dictionary keys (minus
/// one, 0 for NA) — with the validity bits; the number of NAs.
fn copy_ints<const KEYS: bool>(src: &[i32], dst: &mut [u8], bits: &mut [u8]) -> usize {
    assert!(dst.len() >= std::mem::size_of_val(src) && bits.len() >= src.len().div_ceil(8));
    let mut full = 0;
    let mut nulls = 0;
    #[cfg(target_arch = "x86_64")]
    if (dst.as_ptr() as usize).is_multiple_of(16) {
        use std::arch::x86_64::{
            __m128i, _mm_andnot_si128, _mm_castsi128_ps, _mm_cmpeq_epi32, _mm_loadu_si128,
            _mm_movemask_ps, _mm_set1_epi32, _mm_sfence, _mm_stream_si128, _mm_sub_epi32,
        };
        full = src.len() / 64;
        let d = dst.as_mut_ptr();
        // SAFETY: SSE2 is part of x86_64.
        let (na, one) = unsafe { (_mm_set1_epi32(NA_INTEGER), _mm_set1_epi32(1)) };
        for k in 0..full {
            let mut is_na = 0u64;
            // SAFETY: as in `copy_doubles`: 64 elements from `k * 64` exist in `src`, have room
            // in `dst`, and every fourth of them starts 16-byte aligned there.
            unsafe {
                for j in (0..64).step_by(4) {
                    let at = k * 64 + j;
                    let v = _mm_loadu_si128(src.as_ptr().add(at).cast::<__m128i>());
                    let eq = _mm_cmpeq_epi32(v, na);
                    let out = if KEYS {
                        _mm_andnot_si128(eq, _mm_sub_epi32(v, one))
                    } else {
                        v
                    };
                    _mm_stream_si128(d.add(at * 4).cast::<__m128i>(), out);
                    is_na |= (_mm_movemask_ps(_mm_castsi128_ps(eq)) as u64) << j;
                }
            }
            nulls += is_na.count_ones() as usize;
            put_word(bits, k, !is_na);
        }
        // SAFETY: SSE2; as in `copy_doubles`.
        unsafe { _mm_sfence() };
    }
    let out = |c: i32| match (KEYS, c == NA_INTEGER) {
        (false, _) => c,
        (true, true) => 0,
        (true, false) => c.wrapping_sub(1),
    };
    for (k, c) in src[full * 64..].chunks(64).enumerate() {
        let at = (full * 64 + k * 64) * 4;
        for (j, &x) in c.iter().enumerate() {
            dst[at + 4 * j..at + 4 * j + 4].copy_from_slice(&out(x).to_le_bytes());
        }
        let w = word(c, |x| x != NA_INTEGER);
        nulls += c.len() - w.count_ones() as usize;
        put_word(bits, full + k, w);
    }
    nulls
}

/// [`portable`] for `integer64` (`i64::MIN` is NA).
pub fn copy_integer64(src: &[i64], dst: &mut [u8], bits: &mut [u8]) -> usize {
    portable(src, dst, bits, |x| x != i64::MIN)
}
