//! Entry points for the pool's fuzz harnesses (`tests/fuzz.rs`) into the code that reads what
//! other processes wrote: a pool segment's control block and ring and deque headers (checked by
//! `PoolView::new`), a map's segment as a runner reads it, and runners' results as the
//! submitter reads them. For the harnesses only (the `test-helpers` feature).

use arrow_buffer::Buffer;
use mizu_shm::{Extent, Segment};

use crate::error::Result;
use crate::layout::{self, Params, PoolView};
use crate::map_segment::{self, MapInputs};

/// A new pool segment of two workers and four submitters, nobody attached.
pub fn pool_segment() -> Segment {
    layout::create(Params {
        max_workers: 2,
        submitters: 4,
        slots: 4,
        nested_slots: 2,
        slot_bytes: 128,
        wide_slots: 2,
        wide_bytes: 256,
        ring_capacity: 4,
        nested_ring_capacity: 2,
        nested_ring_span: 1,
        nested_wide_slots: 1,
        deque_capacity: 4,
        ..Params::default()
    })
    .expect("a pool segment")
}

/// The parts of a pool segment an opener reads before it trusts anything: the control block
/// (parameters), the ring headers and the deque headers.
pub fn pool_headers(seg: &Segment) -> Vec<Extent> {
    [0, 5, 7]
        .iter()
        .map(|&i| seg.extent(i).expect("a pool segment's extents"))
        .collect()
}

/// Opens `seg` as a worker or submitter does. When the view validates, every ring, deque
/// and task header it offers must be usable: a failure there panics (the harness's finding).
pub fn open_pool(seg: &Segment) -> Result<()> {
    let v = PoolView::new(seg)?;
    let p = v.params;
    for s in 0..p.submitters as usize {
        for w in 0..p.max_workers as usize {
            if !v.has_ring(s, w) {
                assert!(v.ring(s, w).is_err(), "no ring where the row has none");
                continue;
            }
            let r = v.ring(s, w).expect("a ring of a validated pool");
            let want = if (1..=p.max_workers as usize).contains(&s) {
                p.nested_ring_capacity
            } else {
                p.ring_capacity
            };
            assert_eq!(r.capacity(), u64::from(want));
        }
        for k in 0..v.slots_of(s) {
            v.task(s, k).state.load();
            v.data(s, k);
        }
        v.submitter(s).rec.is_held();
    }
    for w in 0..p.max_workers as usize {
        v.deque(w).expect("a deque of a validated pool");
        v.worker(w);
    }
    Ok(())
}

/// A map segment staging `inputs`, results of `elem` bytes written in place (0: returned),
/// shared by two runners.
pub fn map_segment(inputs: &[&[u8]], elem: usize) -> Segment {
    map_segment::stage(inputs, 0, elem, 2).expect("a map segment")
}

/// Runs the map in `seg` as a runner does, with an executor that returns each input
/// (resized to the typed result's size): the elements run, or why the segment was refused.
pub fn run_map(seg: &Segment) -> std::result::Result<u64, String> {
    let map = MapInputs::open(seg)?;
    let ctl = map.control();
    let mut ran = 0;
    while let Some(chunk) = ctl.next_chunk() {
        for i in chunk {
            if !ctl.may_run(i) {
                return Ok(ran);
            }
            let mut input = map.input(i)?;
            if map.elem() > 0 {
                input.resize(map.elem(), 0);
                map.write_output(i, &input)?;
            }
            ran += 1;
        }
    }
    Ok(ran)
}

/// A runner's result listing `entries` (element, ok, bytes).
pub fn runner_result(entries: &[(u64, bool, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(i, ok, b) in entries {
        map_segment::push_result(&mut out, i, ok, b);
    }
    out
}

/// Reads runners' `results` of a map of `n` elements as the submitter does: the results found
/// and the smallest failing element, or why they were refused.
pub fn read_runner_results(
    results: &[Buffer],
    n: usize,
    elem: usize,
) -> std::result::Result<(usize, Option<usize>), String> {
    let r = map_segment::read_results(results, n, elem)?;
    Ok((
        r.values.iter().flatten().count(),
        r.first_error.map(|(i, _)| i),
    ))
}
