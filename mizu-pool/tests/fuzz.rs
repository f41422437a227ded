//! What the pool reads of other processes' bytes, under structure-aware fuzzing: a live pool
//! segment's control block and ring and deque headers (a worker or an attaching submitter opens
//! it), a map's segment as a runner reads it, and runners' results as the map's submitter reads
//! them. Each starts from what the runtime wrote and is mutated (`mizu_shm::fuzzing`); every
//! case must give a usable view or a typed error — never a panic, a hang or a read outside the
//! segment.
//!
//! `cargo test` runs a few hundred cases; `cargo xtask test` 100 000 (`PROPTEST_CASES`),
//! `cargo xtask fuzz --long` ten million.

use std::cell::Cell;

use arrow_buffer::Buffer;
use mizu_pool::fuzzing;
use mizu_shm::fuzzing::{self as mutate, Mutation};
use mizu_shm::{Extent, Segment};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// The bytes of `ext` of `seg`, copied out.
fn read(seg: &Segment, ext: Extent) -> Vec<u8> {
    let mut v = vec![0u8; ext.len as usize];
    // SAFETY: the extent lies inside this process's own mapping (the segment's header says
    // so, validated); nobody else writes it.
    unsafe {
        std::ptr::copy_nonoverlapping(
            seg.as_ptr().add(ext.offset as usize),
            v.as_mut_ptr(),
            v.len(),
        )
    };
    v
}

/// Writes `bytes` over `ext` of `seg`.
fn write(seg: &Segment, ext: Extent, bytes: &[u8]) {
    assert_eq!(bytes.len() as u64, ext.len);
    // SAFETY: as in `read`; no view of the segment is alive while it is rewritten.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            seg.as_ptr().add(ext.offset as usize),
            bytes.len(),
        )
    };
}

/// Runs `case` on `seg` with `parts` mutated together (restored to `seeds` first), and counts
/// what was accepted and refused; both must happen.
fn fuzz_parts(what: &str, seg: &Segment, parts: &[Extent], case: impl Fn(&Segment) -> bool) {
    let seeds: Vec<Vec<u8>> = parts.iter().map(|&e| read(seg, e)).collect();
    let whole: Vec<u8> = seeds.concat();
    let (accepted, refused) = (Cell::new(0u64), Cell::new(0u64));
    let mut runner = TestRunner::new(Config::default());
    runner
        .run(&mutate::in_place(), |m: Mutation| {
            let mut b = whole.clone();
            mutate::mutate_in_place(&mut b, &m);
            let mut at = 0;
            for &e in parts {
                write(seg, e, &b[at..at + e.len as usize]);
                at += e.len as usize;
            }
            if case(seg) {
                accepted.set(accepted.get() + 1);
            } else {
                refused.set(refused.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    for (&e, s) in parts.iter().zip(&seeds) {
        write(seg, e, s);
    }
    eprintln!(
        "fuzz {what}: {} accepted, {} refused",
        accepted.get(),
        refused.get()
    );
    assert!(
        accepted.get() > 0 && refused.get() > 0,
        "accepted {accepted:?}, refused {refused:?}: the mutations do not reach the checks"
    );
}

/// Every ring and deque header of a view `PoolView::new` accepted can be used (today's
/// `ring()` panicked on a bad ring header the view had not checked).
#[test]
fn mutated_pool_headers_never_panic() {
    mutate::private_place();
    let seg = fuzzing::pool_segment();
    fuzzing::open_pool(&seg).unwrap();
    fuzz_parts("pool headers", &seg, &fuzzing::pool_headers(&seg), |s| {
        fuzzing::open_pool(s).is_ok()
    });
    fuzzing::open_pool(&seg).unwrap();
}

/// A map's control block and input offsets, mutated, as a runner reads them: the elements
/// run or the segment is refused, and no runner loops for ever.
#[test]
fn mutated_map_segments_never_panic() {
    mutate::private_place();
    let inputs: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; usize::from(i % 7)]).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    for elem in [0, 8] {
        let seg = fuzzing::map_segment(&refs, elem);
        let parts = [seg.extent(0).unwrap(), seg.extent(1).unwrap()];
        let seed: Vec<Vec<u8>> = parts.iter().map(|&e| read(&seg, e)).collect();
        assert_eq!(fuzzing::run_map(&seg), Ok(40));
        // Back to the map as staged, its cursor at the start.
        for (&e, s) in parts.iter().zip(&seed) {
            write(&seg, e, s);
        }
        fuzz_parts("map segment", &seg, &parts, |s| {
            let r = fuzzing::run_map(s);
            // Room for 40 elements' offsets: none runs twice, whatever the control block says.
            if let Ok(ran) = r {
                assert!(ran <= 40, "{ran} elements ran");
            }
            r.is_ok()
        });
    }
}

/// Runners' results, mutated: read back as results and a smallest failing element, or
/// refused — never an element outside the map or a view past a buffer.
#[test]
fn mutated_runner_results_never_panic() {
    let n = 6;
    let seeds: Vec<Vec<u8>> = vec![
        fuzzing::runner_result(&[(0, true, b"zero"), (2, true, b""), (4, true, b"four!")]),
        fuzzing::runner_result(&[(1, true, b"one"), (3, false, b"boom"), (5, true, b"x")]),
        fuzzing::runner_result(&[(5, false, b"late")]),
    ];
    let buffers: Vec<Buffer> = seeds.iter().map(|s| Buffer::from_vec(s.clone())).collect();
    assert_eq!(
        fuzzing::read_runner_results(&buffers, n, 0),
        Ok((5, Some(3)))
    );
    let mut runner = TestRunner::new(Config::default());
    runner
        .run(
            &(
                proptest::collection::vec((any::<usize>(), mutate::mutation()), 1..4),
                prop_oneof![Just(0usize), Just(8usize)],
            ),
            |(picks, elem)| {
                let results: Vec<Buffer> = picks
                    .iter()
                    .map(|(which, m)| {
                        Buffer::from_vec(mutate::apply(&seeds[which % seeds.len()], m, &seeds))
                    })
                    .collect();
                if let Ok((found, first)) = fuzzing::read_runner_results(&results, n, elem) {
                    prop_assert!(found <= n);
                    prop_assert!(first.is_none_or(|i| i < n));
                }
                Ok(())
            },
        )
        .unwrap();
}
