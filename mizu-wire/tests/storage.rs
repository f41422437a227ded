//! Data segments and regions within one process: reference counts, reuse without new
//! segments, re-sending by reference, unlinking when the last holder lets go, bad descriptors.

use std::time::{Duration, Instant};

use mizu_wire::store::ALIGN;
use mizu_wire::{DataPool, Mapper, RegionDesc, WireError};

/// Polls `done` until it holds; the limit only guards against a hang.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "hang guard: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn shm_exists(name: &str) -> bool {
    std::path::Path::new("/dev/shm")
        .join(name.trim_start_matches('/'))
        .exists()
}

#[test]
fn regions_are_aligned_and_hold_their_bytes() {
    let pool = DataPool::new(1 << 16);
    for len in [0usize, 1, 63, 64, 65, 1000] {
        let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let r = pool.store(&data).unwrap();
        assert_eq!(r.bytes(), &data[..]);
        assert_eq!(r.bytes().as_ptr() as usize % ALIGN as usize, 0);
    }
}

#[test]
fn a_shared_region_outlives_the_senders_handle_and_the_last_holder_unlinks() {
    let pool = DataPool::new(1 << 16);
    let mapper = Mapper::new();
    let r = pool.store(b"payload").unwrap();
    let name = r.segment().name().to_string();
    let desc = r.share();
    drop(r); // the sender lets go first
    drop(pool); // ...and detaches from the segment entirely
    assert!(
        shm_exists(&name),
        "a reference is still in flight: the name must stay"
    );
    let got = mapper.adopt(&desc).unwrap();
    assert_eq!(got.bytes(), b"payload");
    drop(got);
    assert!(
        !shm_exists(&name),
        "the last holder unlinks once the owner has detached"
    );
}

#[test]
fn a_region_adopted_twice_is_found_while_either_reference_lives() {
    use std::sync::Arc;
    let pool = DataPool::new(1 << 16);
    let mapper = Mapper::new();
    let sent = pool.store(&[7u8; 4096]).unwrap();
    // Two references in one payload (two columns of one data frame), adopted one by one.
    let first = Arc::new(mapper.adopt(&sent.share()).unwrap());
    let second = Arc::new(mapper.adopt(&sent.share()).unwrap());
    let (b1, b2) = (
        mizu_wire::Region::buffer(&first),
        mizu_wire::Region::buffer(&second),
    );
    assert_eq!(b1.as_ptr(), b2.as_ptr());
    let addr = b1.as_ptr();
    // The later one goes first: the earlier one is still found.
    drop((b2, second));
    let (found, off) = mizu_wire::Region::containing(addr).expect("still held");
    assert!(Arc::ptr_eq(&found, &first));
    assert_eq!(off, 0);
    drop((found, b1, first));
    assert!(mizu_wire::Region::containing(addr).is_none());
}

#[test]
fn resending_passes_the_same_bytes_by_reference() {
    let pool = DataPool::new(1 << 16);
    let mapper = Mapper::new();
    let r = pool.store(&[9u8; 300]).unwrap();
    let first = mapper.adopt(&r.share()).unwrap();
    let again = first.share(); // re-send of a received region
    assert_eq!(
        (again.name.as_str(), again.offset),
        (r.segment().name().as_str(), r.offset())
    );
    let second = mapper.adopt(&again).unwrap();
    assert_eq!(
        second.bytes().as_ptr(),
        first.bytes().as_ptr(),
        "same mapping, same bytes: no copy"
    );
}

#[test]
fn a_drained_segment_is_reused_instead_of_creating_new_ones() {
    let pool = DataPool::new(1 << 16);
    // Reuse, not giving back, is what this test is about: however slowly it runs, no segment
    // is idle long enough to go.
    pool.set_idle_release(Duration::from_secs(3600));
    for _ in 0..10_000 {
        let r = pool.store(&[1u8; 1000]).unwrap();
        drop(r);
    }
    assert_eq!(pool.segments(), 1, "steady traffic reuses one segment");
    // Held regions force new space, released ones make it reusable again.
    let held: Vec<_> = (0..200)
        .map(|_| pool.store(&[2u8; 1000]).unwrap())
        .collect();
    assert!(pool.segments() > 1);
    let n = pool.segments();
    drop(held);
    for _ in 0..1000 {
        pool.store(&[3u8; 1000]).unwrap();
    }
    assert_eq!(
        pool.segments(),
        n,
        "no new segments once space was released"
    );
}

#[test]
fn a_payload_larger_than_a_segment_gets_its_own() {
    let pool = DataPool::new(4096);
    let r = pool.store(&vec![5u8; 100_000]).unwrap();
    assert_eq!(r.len(), 100_000);
    assert!(r.bytes().iter().all(|&b| b == 5));
}

#[test]
fn bad_descriptors_are_refused_clearly() {
    let pool = DataPool::new(1 << 16);
    let mapper = Mapper::new();
    let r = pool.store(b"0123456789").unwrap();
    let good = r.share();
    let cases = [
        (
            RegionDesc {
                name: "nonsense".into(),
                ..good.clone()
            },
            "invalid segment name",
        ),
        (
            RegionDesc {
                name: "/mizu_1_0123456789abcdef01234567".into(),
                ..good.clone()
            },
            "does not exist",
        ),
        (
            RegionDesc {
                offset: good.offset + 8,
                ..good.clone()
            },
            "misaligned",
        ),
        (
            RegionDesc {
                len: u64::MAX,
                ..good.clone()
            },
            "overflows",
        ),
        (
            RegionDesc {
                offset: 1 << 40,
                ..good.clone()
            },
            "outside",
        ),
        (
            RegionDesc {
                len: 11,
                ..good.clone()
            },
            "stale",
        ),
        (
            RegionDesc {
                generation: good.generation + 1,
                ..good.clone()
            },
            "stale",
        ),
        (
            RegionDesc {
                offset: good.offset + 4096,
                ..good.clone()
            },
            "no region header",
        ),
    ];
    for (d, want) in cases {
        let e = mapper.adopt(&d).expect_err(want);
        let msg = e.to_string();
        assert!(msg.contains(want), "{want:?} not in {msg:?}");
        assert!(matches!(e, WireError::BadRegion { .. } | WireError::Shm(_)));
    }
    // A segment of another kind is not a data segment.
    let mut l = mizu_shm::Layout::new(7);
    l.add(64, 64).unwrap();
    let other = mizu_shm::Segment::create(&l, false).unwrap();
    let e = mapper
        .adopt(&RegionDesc {
            name: other.token().into(),
            ..good.clone()
        })
        .unwrap_err();
    assert!(e.to_string().contains("layout kind"), "{e}");
    assert_eq!(mapper.adopt(&good).unwrap().bytes(), b"0123456789");
}

#[test]
fn a_buffer_leads_back_to_its_region_while_it_lives() {
    let pool = DataPool::new(1 << 16);
    let mapper = Mapper::new();
    let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    let sent = pool.store(&data).unwrap();
    let region = std::sync::Arc::new(mapper.adopt(&sent.share()).unwrap());
    let buf = mizu_wire::Region::buffer(&region);
    let part = buf.slice_with_length(1000, 500);
    let (found, off) = mizu_wire::Region::containing(part.as_ptr()).expect("registered");
    assert!(std::sync::Arc::ptr_eq(&found, &region));
    assert_eq!(off, 1000);
    assert!(found.still_named());
    // one past the end is not inside
    let end = buf.as_ptr().wrapping_add(buf.len());
    assert!(
        mizu_wire::Region::containing(end)
            .is_none_or(|(r, _)| !std::sync::Arc::ptr_eq(&r, &region))
    );
    let addr = part.as_ptr();
    drop((found, part, buf, region));
    assert!(mizu_wire::Region::containing(addr).is_none());
}

#[test]
fn writers_fill_an_output_region_each_through_a_reference_of_its_own() {
    let pool = DataPool::new(1 << 16);
    let mapper = Mapper::new();
    let mut m = pool.alloc(64).unwrap();
    m.bytes_mut().fill(0);
    let r = m.commit();
    let name = r.segment().name().to_string();
    // Two writers, each with a range of its own and a counted reference (adopted from a
    // descriptor that carries one, through another mapping of the segment, as in another
    // process); `describe` names the region for them to check.
    for (at, byte) in [(0usize, 1u8), (32, 2)] {
        let w = mapper.adopt(&r.share()).unwrap();
        assert_eq!(w.describe(), r.describe());
        // SAFETY: nobody else touches this range, and it is read only below.
        unsafe { w.write_at(at, &[byte; 32]).unwrap() };
    }
    assert_eq!(&r.bytes()[..32], &[1u8; 32][..]);
    assert_eq!(&r.bytes()[32..], &[2u8; 32][..]);
    let w = mapper.adopt(&r.share()).unwrap();
    // SAFETY: the write is refused before it touches anything.
    let e = unsafe { w.write_at(40, &[0u8; 32]) }.unwrap_err();
    assert!(e.to_string().contains("outside the region"), "{e}");
    // The holder lets go while a writer still holds its reference: the space is not reused
    // under the writer, and the last of them frees the region.
    drop(r);
    let other = pool.store(&[9u8; 64]).unwrap();
    assert_eq!(&w.bytes()[..1], &[1]);
    drop((w, other));
    drop(pool);
    assert!(!shm_exists(&name), "the last holder unlinks");
}

#[test]
fn idle_segments_are_given_back_and_busy_ones_are_kept() {
    let pool = DataPool::new(1 << 16);
    pool.set_idle_release(Duration::from_millis(100));
    // A region still held, and a one-off payload larger than a segment (its own segment).
    let held = pool.store(&[2u8; 1000]).unwrap();
    let held_name = held.segment().name().to_string();
    let big = pool.store(&vec![1u8; 1 << 20]).unwrap();
    let big_name = big.segment().name().to_string();
    assert_ne!(big_name, held_name);
    drop(big);
    assert!(shm_exists(&big_name));
    eventually("the idle segment is unlinked", || !shm_exists(&big_name));
    assert_eq!(pool.segments(), 1, "the segment with a live region stays");
    assert!(shm_exists(&held_name));
    assert_eq!(held.bytes(), &[2u8; 1000][..]);
    // Allocating after a trim works, in the kept segment or a new one.
    let again = pool.store(&[3u8; 500]).unwrap();
    assert_eq!(again.bytes(), &[3u8; 500][..]);
    drop((held, again));
    eventually("every segment goes once idle", || pool.segments() == 0);
    assert!(!shm_exists(&held_name));
    let after = pool.store(&[4u8; 100]).unwrap();
    assert_eq!(after.bytes(), &[4u8; 100][..]);
}

#[test]
fn a_receivers_kept_mappings_go_after_a_pause_but_views_stay_readable() {
    let pool = DataPool::new(1 << 16);
    let mapper = Mapper::new();
    let sent = pool.store(&[5u8; 4096]).unwrap();
    let view = mapper.adopt(&sent.share()).unwrap();
    assert_eq!(mapper.kept(), 1);
    eventually("the unused mapping is let go", || mapper.kept() == 0);
    // The adopted region keeps its own mapping.
    assert_eq!(view.bytes(), &[5u8; 4096][..]);
    let again = mapper.adopt(&sent.share()).unwrap();
    assert_eq!(
        again.bytes().as_ptr(),
        view.bytes().as_ptr(),
        "found, not reopened"
    );
}

#[test]
fn ordinary_segments_stay_while_sends_go_on() {
    let pool = DataPool::new(1 << 16);
    pool.set_idle_release(Duration::from_millis(500));
    // Two ordinary segments; then traffic that needs only one of them for several release
    // periods (and janitor ticks): the other is idle but kept, as traffic may need it again.
    let held: Vec<_> = (0..100)
        .map(|_| pool.store(&[1u8; 1000]).unwrap())
        .collect();
    assert_eq!(pool.segments(), 2);
    drop(held);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(2500) {
        let r = pool.store(&[2u8; 1000]).unwrap();
        assert_eq!(
            pool.segments(),
            2,
            "a segment was given back while sends went on"
        );
        drop(r);
        std::thread::sleep(Duration::from_millis(1));
    }
    eventually("a pause gives both back", || pool.segments() == 0);
}

#[test]
fn a_region_sees_its_segment_lose_its_name() {
    let pool = DataPool::new(1 << 16);
    let mapper = Mapper::new();
    let sent = pool.store(b"0123456789").unwrap();
    // The same segment through a second handle of this process (a result sent back, say).
    let back = mapper.adopt(&sent.share()).unwrap();
    for _ in 0..2 {
        // (The second time, from what the first saw.)
        assert!(sent.still_named() && back.still_named());
    }
    pool.unlink_all();
    assert!(!sent.still_named());
    assert!(!back.still_named());
}
