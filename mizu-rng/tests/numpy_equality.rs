//! mizu-rng against numpy's Philox, through the committed golden vectors
//! (`tests/data/numpy_philox.txt`, which `cargo xtask test` re-checks against live numpy).

use mizu_rng::{Philox4x64, element_key_counter, element_stream};
use rand_core::Rng;

struct Case {
    name: String,
    key: [u64; 2],
    counter: [u64; 4],
    u64s: Vec<u64>,
    state: [u64; 4],
    f64s: Vec<u64>,
    u32s: Vec<u32>,
    advanced: Vec<u64>,
}

fn hex64(s: &str) -> Vec<u64> {
    s.split_whitespace()
        .map(|w| u64::from_str_radix(w, 16).unwrap())
        .collect()
}

fn cases() -> Vec<Case> {
    let text = include_str!("data/numpy_philox.txt");
    let mut out: Vec<Case> = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (tag, rest) = line.split_once(' ').unwrap();
        if tag == "case" {
            out.push(Case {
                name: rest.to_owned(),
                key: [0; 2],
                counter: [0; 4],
                u64s: vec![],
                state: [0; 4],
                f64s: vec![],
                u32s: vec![],
                advanced: vec![],
            });
            continue;
        }
        let c = out.last_mut().unwrap();
        match tag {
            "key" => c.key = hex64(rest).try_into().unwrap(),
            "counter" => c.counter = hex64(rest).try_into().unwrap(),
            "u64" => c.u64s = hex64(rest),
            "state" => c.state = hex64(rest).try_into().unwrap(),
            "f64" => c.f64s = hex64(rest),
            "u32" => {
                c.u32s = rest
                    .split_whitespace()
                    .map(|w| u32::from_str_radix(w, 16).unwrap())
                    .collect()
            }
            "advance1000" => c.advanced = hex64(rest),
            other => panic!("unknown line tag {other}"),
        }
    }
    assert!(out.len() >= 20, "golden file has {} cases", out.len());
    out
}

#[test]
fn raw_u64_streams_equal_numpy() {
    for c in cases() {
        let mut g = Philox4x64::new(c.key, c.counter);
        let got: Vec<u64> = (0..c.u64s.len()).map(|_| g.next_u64()).collect();
        assert_eq!(got, c.u64s, "{}", c.name);
        assert_eq!(g.counter(), c.state, "{}: counter after the draws", c.name);
    }
}

#[test]
fn bulk_fills_equal_numpy() {
    for c in cases() {
        let mut g = Philox4x64::new(c.key, c.counter);
        let mut raw = vec![0u64; c.u64s.len()];
        g.fill_u64(&mut raw);
        assert_eq!(raw, c.u64s, "{}", c.name);
        let mut g = Philox4x64::new(c.key, c.counter);
        let mut f = vec![0f64; c.f64s.len()];
        // A fill that starts mid-block: one draw by hand, then the rest in bulk.
        f[0] = g.next_f64();
        g.fill_f64(&mut f[1..]);
        let bits: Vec<u64> = f.iter().map(|x| x.to_bits()).collect();
        assert_eq!(bits, c.f64s, "{}", c.name);
    }
}

#[test]
fn doubles_equal_numpy_random() {
    for c in cases() {
        let mut g = Philox4x64::new(c.key, c.counter);
        let got: Vec<u64> = (0..c.f64s.len()).map(|_| g.next_f64().to_bits()).collect();
        assert_eq!(got, c.f64s, "{}", c.name);
        assert!(got.iter().all(|&b| (0.0..1.0).contains(&f64::from_bits(b))));
    }
}

#[test]
fn u32_draws_equal_numpy_integers() {
    for c in cases() {
        let mut g = Philox4x64::new(c.key, c.counter);
        let got: Vec<u32> = (0..c.u32s.len()).map(|_| Rng::next_u32(&mut g)).collect();
        assert_eq!(got, c.u32s, "{}", c.name);
    }
}

#[test]
fn advance_equals_numpy_advance() {
    for c in cases() {
        let mut g = Philox4x64::new(c.key, c.counter);
        g.next_u64(); // buffered output must be discarded by advance, as in numpy
        let mut g2 = Philox4x64::new(c.key, c.counter);
        g2.advance([1000, 0, 0, 0]);
        g.set_counter(g2.counter());
        let got: Vec<u64> = (0..c.advanced.len()).map(|_| g2.next_u64()).collect();
        assert_eq!(got, c.advanced, "{}", c.name);
        let again: Vec<u64> = (0..c.advanced.len()).map(|_| g.next_u64()).collect();
        assert_eq!(again, c.advanced, "{}: set_counter", c.name);
    }
}

#[test]
fn element_streams_are_the_documented_numpy_generators() {
    for c in cases()
        .into_iter()
        .filter(|c| c.name.starts_with("element "))
    {
        // "element seed=S i=I"
        let mut parts = c.name.split_whitespace().skip(1);
        let seed: u64 = parts
            .next()
            .unwrap()
            .trim_start_matches("seed=")
            .parse()
            .unwrap();
        let i: u64 = parts
            .next()
            .unwrap()
            .trim_start_matches("i=")
            .parse()
            .unwrap();
        assert_eq!(
            element_key_counter(seed, i),
            (c.key, c.counter),
            "{}",
            c.name
        );
        let mut g = element_stream(seed, i);
        let got: Vec<u64> = (0..c.u64s.len()).map(|_| g.next_u64()).collect();
        assert_eq!(got, c.u64s, "{}", c.name);
    }
}
