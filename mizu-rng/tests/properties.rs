//! Properties of the generators and the stream keying.

use mizu_rng::{Philox4x32, Philox4x64, element_stream, element_stream_at, philox4x64_10};
use proptest::prelude::*;
use rand_core::{Rng, SeedableRng};

proptest! {
    #[test]
    fn skip_ahead_by_n_equals_n_sequential_blocks(key in any::<[u64; 2]>(), ctr in any::<[u64; 4]>(), n in 0u64..300, skip in 0usize..4) {
        let mut seq = Philox4x64::new(key, ctr);
        for _ in 0..(n * 4) as usize + skip { seq.next_u64(); }
        // Skip-ahead lands on a block boundary; drop the partial block the same way.
        let mut jump = Philox4x64::new(key, ctr);
        jump.advance([n, 0, 0, 0]);
        if skip > 0 {
            // seq is inside block n+1 after `skip` words: compare from the next block.
            for _ in skip..4 { seq.next_u64(); }
            jump.advance([1, 0, 0, 0]);
        }
        for _ in 0..8 { prop_assert_eq!(seq.next_u64(), jump.next_u64()); }
    }

    #[test]
    fn philox4x32_skip_ahead_matches_sequential(key in any::<[u32; 2]>(), n in 0u128..200) {
        let mut seq = Philox4x32::new(key, [0; 4]);
        for _ in 0..n * 4 { seq.next_u32(); }
        let mut jump = Philox4x32::new(key, [0; 4]);
        jump.advance(n);
        for _ in 0..8 { prop_assert_eq!(seq.next_u32(), jump.next_u32()); }
    }

    #[test]
    fn distinct_elements_give_distinct_streams(seed in any::<u64>(), a in any::<u64>(), b in any::<u64>()) {
        prop_assume!(a != b);
        let (mut x, mut y) = (element_stream(seed, a), element_stream(seed, b));
        let xs: Vec<u64> = (0..4).map(|_| x.next_u64()).collect();
        let ys: Vec<u64> = (0..4).map(|_| y.next_u64()).collect();
        prop_assert_ne!(xs, ys);
    }

    #[test]
    fn distinct_seeds_give_distinct_streams(s in any::<u64>(), t in any::<u64>(), i in any::<u64>()) {
        prop_assume!(s != t);
        prop_assert_ne!(element_stream(s, i).next_u64(), element_stream(t, i).next_u64());
    }

    #[test]
    fn a_map_split_in_two_parts_reproduces_the_whole(seed in any::<u64>(), n in 1u64..64, cut in 0u64..64) {
        let cut = cut.min(n);
        let whole: Vec<f64> = (0..n).map(|i| element_stream(seed, i).next_f64()).collect();
        let mut parts: Vec<f64> = (0..cut).map(|i| element_stream_at(seed, 0, i).next_f64()).collect();
        parts.extend((0..n - cut).map(|i| element_stream_at(seed, cut, i).next_f64()));
        prop_assert_eq!(whole, parts);
    }

    // Bulk fills compute several blocks side by side: with any counter (carries between the
    // blocks of one step included) and any length, they equal single draws, for both types.
    #[test]
    fn fills_equal_single_draws(
        key in any::<[u64; 2]>(),
        low in prop_oneof![any::<u64>(), (u64::MAX - 40)..=u64::MAX],
        high in any::<[u64; 3]>(),
        pre in 0usize..5,
        n in 0usize..150,
    ) {
        let counter = [low, high[0], high[1], high[2]];
        let mut a = Philox4x64::new(key, counter);
        let mut b = a.clone();
        for _ in 0..pre { a.next_u64(); b.next_u64(); }
        let mut raw = vec![0u64; n];
        a.fill_u64(&mut raw);
        let one: Vec<u64> = (0..n).map(|_| b.next_u64()).collect();
        prop_assert_eq!(&raw, &one);
        prop_assert_eq!(a.counter(), b.counter());
        let mut f = vec![0f64; n];
        a.fill_f64(&mut f);
        let one: Vec<u64> = (0..n).map(|_| b.next_f64().to_bits()).collect();
        let bits: Vec<u64> = f.iter().map(|x| x.to_bits()).collect();
        prop_assert_eq!(bits, one);
        prop_assert_eq!(a.next_u64(), b.next_u64());
    }
}

#[test]
fn blocks_are_the_bijection_of_the_incremented_counter() {
    let mut g = Philox4x64::new([3, 4], [u64::MAX, 0, 0, 0]);
    let first: Vec<u64> = (0..4).map(|_| g.next_u64()).collect();
    assert_eq!(
        first,
        philox4x64_10([0, 1, 0, 0], [3, 4]).to_vec(),
        "carry into word 1"
    );
    let mut w = Philox4x64::new([0, 0], [u64::MAX; 4]);
    assert_eq!(
        w.next_u64(),
        philox4x64_10([0; 4], [0; 2])[0],
        "the 256-bit counter wraps"
    );
}

#[test]
fn seedable_rng_and_fill_bytes_follow_the_u64_stream() {
    let mut seed = [0u8; 16];
    seed[..8].copy_from_slice(&42u64.to_le_bytes());
    let mut a = Philox4x64::from_seed(seed);
    let mut b = Philox4x64::new([42, 0], [0; 4]);
    let mut bytes = [0u8; 16];
    a.fill_bytes(&mut bytes);
    assert_eq!(bytes[..8], b.next_u64().to_le_bytes());
    assert_eq!(bytes[8..], b.next_u64().to_le_bytes());
    let mut c = Philox4x32::seed_from_u64(7);
    let mut d = c.clone();
    assert_eq!(
        c.next_u64(),
        u64::from(d.next_u32()) | (u64::from(d.next_u32()) << 32)
    );
}
