//! The segment header's validation under structure-aware fuzzing: a live segment's header is
//! mutated in place (its checksum recomputed half of the time, so the mutation reaches the
//! extent checks behind it) and the segment opened by name. Every header must give a segment
//! whose extents lie inside it, ascending, or a typed error — never a panic or a view outside
//! the mapping.
//!
//! `cargo test` runs a few hundred cases; `cargo xtask test` 100 000 (`PROPTEST_CASES`),
//! `cargo xtask fuzz --long` ten million.

use mizu_shm::fuzzing::{self, Mutation};
use mizu_shm::header::{HEADER_RESERVED, MAX_EXTENTS};
use mizu_shm::{Layout, Segment, SegmentHeader};
use proptest::test_runner::{Config, TestRunner};

const KIND: u32 = u32::from_le_bytes(*b"FUZ1");
const HEADER: usize = std::mem::size_of::<SegmentHeader>();

/// Reads a header out of `bytes` (at least [`HEADER`] long) as `Segment::open` does.
fn header_of(bytes: &[u8]) -> SegmentHeader {
    assert!(bytes.len() >= HEADER);
    // SAFETY: the header is plain integers (every bit pattern is a value) and `bytes` holds
    // at least its size; the read is unaligned-safe.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const SegmentHeader) }
}

/// `h`'s bytes.
fn bytes_of(h: &SegmentHeader) -> Vec<u8> {
    // SAFETY: a repr(C) struct of integers without padding: its bytes are initialised.
    unsafe { std::slice::from_raw_parts(h as *const SegmentHeader as *const u8, HEADER) }.to_vec()
}

/// The mutated header bytes, its checksum recomputed when `reseal`.
fn mutated(seed: &[u8], m: &Mutation, reseal: bool) -> Vec<u8> {
    let mut b = seed.to_vec();
    fuzzing::mutate_in_place(&mut b, m);
    if reseal {
        let mut h = header_of(&b);
        h.checksum = h.compute_checksum();
        b = bytes_of(&h);
    }
    b
}

/// What an accepted header must promise: extents aligned, ascending, after the header, inside
/// the segment.
fn check_accepted(h: &SegmentHeader, size: u64) {
    let mut end = HEADER_RESERVED;
    for e in h.extents() {
        assert!(e.offset >= end && e.offset.is_multiple_of(64), "{h:?}");
        end = e.offset + e.len;
        assert!(end <= size, "{h:?}");
    }
}

#[test]
fn mutated_headers_of_a_live_segment_never_panic() {
    fuzzing::private_place();
    let mut layout = Layout::new(KIND);
    for len in [64, 1000, 4096, 8] {
        layout.add(len, 64).unwrap();
    }
    let seg = Segment::create(&layout, false).unwrap();
    let seed = bytes_of(seg.header());
    let (accepted, refused) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let mut runner = TestRunner::new(Config::default());
    runner
        .run(
            &(fuzzing::in_place(), proptest::bool::ANY),
            |(m, reseal)| {
                let b = mutated(&seed, &m, reseal);
                // SAFETY: the first HEADER bytes of this process's own mapping, which nobody
                // else has opened; other threads of this test binary do not open it either.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), seg.as_ptr(), HEADER) };
                match Segment::open(seg.token(), KIND) {
                    Ok(other) => {
                        accepted.set(accepted.get() + 1);
                        check_accepted(other.header(), other.len());
                        for i in 0..other.header().extents().len() {
                            let e = other.extent(i).unwrap();
                            if e.len >= 8 {
                                other
                                    .get::<mizu_shm::sync::AtomicU64>(e.offset)
                                    .unwrap()
                                    .load(std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                        assert!(other.extent(MAX_EXTENTS).is_err());
                    }
                    Err(e) => {
                        refused.set(refused.get() + 1);
                        assert!(!e.to_string().is_empty());
                    }
                }
                Ok(())
            },
        )
        .unwrap();
    // SAFETY: as above: the original header back, so the segment is dropped as created.
    unsafe { std::ptr::copy_nonoverlapping(seed.as_ptr(), seg.as_ptr(), HEADER) };
    Segment::open(seg.token(), KIND).unwrap();
    // Mutations both get through (the checks behind the checksum ran) and are refused.
    assert!(
        accepted.get() > 0 && refused.get() > 0,
        "{accepted:?} {refused:?}"
    );
}

#[test]
fn mutated_headers_against_any_size_never_panic() {
    fuzzing::private_place();
    let mut layout = Layout::new(KIND);
    layout.add(640, 64).unwrap();
    layout.add(64, 128).unwrap();
    let h = SegmentHeader::new(
        KIND,
        layout.total_size(),
        mizu_shm::ProcessId::new(1, 2),
        layout.extents(),
    );
    let seed = bytes_of(&h);
    h.validate(layout.total_size(), KIND).unwrap();
    let mut runner = TestRunner::new(Config::default());
    runner
        .run(
            &(
                fuzzing::in_place(),
                proptest::bool::ANY,
                proptest::num::u64::ANY,
            ),
            |(m, reseal, size)| {
                let h = header_of(&mutated(&seed, &m, reseal));
                for size in [size, layout.total_size(), h.total_size] {
                    if h.validate(size, KIND).is_ok() {
                        check_accepted(&h, size);
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}
