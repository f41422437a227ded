//! Loops over whole vectors that turn R's representation into Arrow's (logical to bits, days
//! and seconds to date32 and microseconds), compiled twice — for the baseline x86-64 CPU and
//! with AVX2, picked at run time: the saturating float-to-integer conversions and the bit
//! packing do not vectorize with the baseline's SSE2 (2–4 ns an element here), and do with
//! AVX2.

use crate::ntcopy::is_na_real;

/// `NA_integer_`.
const NA_INTEGER: i32 = i32::MIN;

/// Runs `$body` (a call of an `#[inline(always)]` function) compiled with AVX2 when the CPU
/// has it.
macro_rules! dispatch {
    ($name:ident, $body:ident, ($($arg:ident: $t:ty),*) -> $ret:ty) => {
        #[doc = concat!("[`", stringify!($body), "`], with AVX2 when the CPU has it.")]
        pub fn $name($($arg: $t),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn wide($($arg: $t),*) -> $ret {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2 (checked just above).
                    return unsafe { wide($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

/// Bits of a logical vector: `values` (TRUE) and `valid` (not NA), 64 elements to a word;
/// the number of NAs.
#[inline(always)]
fn logical_bits_body(v: &[i32], values: &mut [u64], valid: &mut [u64]) -> usize {
    let mut nulls = 0;
    for ((c, t), ok) in v.chunks(64).zip(values.iter_mut()).zip(valid.iter_mut()) {
        let (mut tw, mut vw) = (0u64, 0u64);
        for (j, &x) in c.iter().enumerate() {
            tw |= u64::from((x != 0) & (x != NA_INTEGER)) << j;
            vw |= u64::from(x != NA_INTEGER) << j;
        }
        nulls += c.len() - vw.count_ones() as usize;
        (*t, *ok) = (tw, vw);
    }
    nulls
}
dispatch!(logical_bits, logical_bits_body, (v: &[i32], values: &mut [u64], valid: &mut [u64]) -> usize);

/// Days (doubles) as `i32` into `out`; whether every one converted exactly (whole days in
/// range, or `NA_real_`, which becomes 0 under a null).
#[inline(always)]
fn days_body(d: &[f64], out: &mut [i32]) -> bool {
    let mut exact = true;
    for (o, &v) in out.iter_mut().zip(d) {
        // In range (NaN is not): a plain conversion, which vectorizes (`as` saturates, which
        // does not). A day that converts back to the same bits is exact.
        let k = if v.abs() < 2147483648.0 {
            // SAFETY: finite and inside i32's range once truncated (checked).
            unsafe { v.to_int_unchecked::<i32>() }
        } else {
            0
        };
        exact &= (f64::from(k).to_bits() == v.to_bits()) | is_na_real(v);
        *o = k;
    }
    exact
}
dispatch!(days, days_body, (d: &[f64], out: &mut [i32]) -> bool);

/// Seconds (doubles) as whole microseconds into `out`; whether every one converted exactly
/// (converts back to the same double, or is `NA_real_`).
#[inline(always)]
fn micros_body(s: &[f64], out: &mut [i64]) -> bool {
    let mut exact = true;
    for (o, &v) in out.iter_mut().zip(s) {
        let m = v * 1e6;
        // Half away from zero; the check below catches any value this rounds otherwise.
        let m = (m + 0.5f64.copysign(m)).trunc();
        let fits = m.abs() < 9.223_372_036_854_775e18;
        exact &= (((m / 1e6).to_bits() == v.to_bits()) & fits) | is_na_real(v);
        *o = if fits {
            // SAFETY: a whole number inside i64's range (checked).
            unsafe { m.to_int_unchecked::<i64>() }
        } else {
            0
        };
    }
    exact
}
dispatch!(micros, micros_body, (s: &[f64], out: &mut [i64]) -> bool);

/// Whether any element of `v` is a NaN (R's NA among them).
#[inline(always)]
fn any_nan_body(v: &[f64]) -> bool {
    v.iter().fold(false, |a, &x| a | x.is_nan())
}
dispatch!(any_nan, any_nan_body, (v: &[f64]) -> bool);

/// Whether any element of `v` is `NA_integer_`.
#[inline(always)]
fn any_na_int_body(v: &[i32]) -> bool {
    v.iter().fold(false, |a, &x| a | (x == NA_INTEGER))
}
dispatch!(any_na_int, any_na_int_body, (v: &[i32]) -> bool);
