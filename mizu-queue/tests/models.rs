//! Sequential models: every structure against a `VecDeque` (or the transition table), over
//! random operation sequences.

use std::collections::VecDeque;

use mizu_queue::{HeapDeque, HeapRing, SendError, SlotState, StateWord, Steal};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum RingOp {
    Write(Vec<u8>),
    Publish,
    Recv,
    Release,
    SendBatch(Vec<Vec<u8>>),
}

fn ring_op() -> impl Strategy<Value = RingOp> {
    let msg = proptest::collection::vec(any::<u8>(), 0..=56);
    prop_oneof![
        3 => msg.clone().prop_map(RingOp::Write),
        1 => Just(RingOp::Publish),
        3 => Just(RingOp::Recv),
        1 => Just(RingOp::Release),
        1 => proptest::collection::vec(msg, 0..6).prop_map(RingOp::SendBatch),
    ]
}

proptest! {
    #[test]
    fn ring_matches_a_vecdeque(cap_log in 0u32..4, ops in proptest::collection::vec(ring_op(), 1..200)) {
        let cap = 1u64 << cap_log;
        let mut heap = HeapRing::new(cap, 64);
        let (mut p, mut c) = heap.split();
        let release_every = (cap / 4).max(1) as usize;
        // Model: written-unpublished, published-unread, read-unreleased count.
        let (mut pending, mut visible) = (VecDeque::new(), VecDeque::<Vec<u8>>::new());
        let mut unreleased = 0usize;
        let room = |pending: &VecDeque<Vec<u8>>, visible: &VecDeque<Vec<u8>>, unreleased: usize| {
            pending.len() + visible.len() + unreleased < cap as usize
        };
        for op in ops {
            match op {
                RingOp::Write(m) => {
                    let r = p.write_with(|b| { b[..m.len()].copy_from_slice(&m); m.len() });
                    if room(&pending, &visible, unreleased) {
                        prop_assert!(r.is_ok());
                        pending.push_back(m);
                    } else {
                        prop_assert_eq!(r, Err(SendError::Full));
                    }
                }
                RingOp::Publish => {
                    p.publish();
                    visible.extend(pending.drain(..));
                }
                RingOp::SendBatch(ms) => {
                    let n = p.send_batch(ms.iter().map(|m| &m[..])).unwrap();
                    let mut expect = 0;
                    for m in ms {
                        if !room(&pending, &visible, unreleased) { break; }
                        pending.push_back(m);
                        expect += 1;
                    }
                    prop_assert_eq!(n, expect);
                    visible.extend(pending.drain(..));
                }
                RingOp::Recv => {
                    let got = c.try_recv_with(|m| m.to_vec());
                    prop_assert_eq!(&got, &visible.pop_front());
                    if got.is_some() {
                        unreleased += 1;
                        if unreleased >= release_every { unreleased = 0; }
                    }
                }
                RingOp::Release => {
                    c.release();
                    unreleased = 0;
                }
            }
        }
    }

    #[test]
    fn deque_matches_a_vecdeque(cap_log in 0u32..4, ops in proptest::collection::vec(0u8..3, 1..300)) {
        let cap = 1usize << cap_log;
        let heap = HeapDeque::new(cap as u64);
        let d = heap.deque();
        let mut model = VecDeque::new();
        let mut next = 0u64;
        for op in ops {
            match op {
                0 => {
                    let r = d.push(next);
                    if model.len() < cap { prop_assert!(r.is_ok()); model.push_back(next); }
                    else { prop_assert_eq!(r, Err(next)); }
                    next += 1;
                }
                1 => prop_assert_eq!(d.pop(), model.pop_back()),
                _ => {
                    let want = model.pop_front().map_or(Steal::Empty, Steal::Success);
                    prop_assert_eq!(d.steal(), want);
                }
            }
            prop_assert_eq!(d.len(), model.len());
        }
    }

    #[test]
    fn slot_state_follows_its_table(steps in proptest::collection::vec((0u8..8, 0u8..8, any::<bool>()), 1..100)) {
        use SlotState::*;
        let all = [Free, Pending, Running, Ok, Err, Cancelled, Died, Collected];
        let w = StateWord::new();
        let (mut generation, mut state) = (0u64, Free);
        for (to, from, stale) in steps {
            let (from, to) = (all[from as usize], all[to as usize]);
            if from == Collected && to == Free {
                let r = w.free(generation);
                if state == Collected { generation = r.unwrap(); state = Free; } else { prop_assert!(r.is_err()); }
                continue;
            }
            let g = if stale { generation.wrapping_sub(1) } else { generation };
            let r = w.transition(g, from, to);
            let ok = !stale && from == state && from.allows(to);
            prop_assert_eq!(r.is_ok(), ok, "{:?}->{:?} in {:?} stale={}", from, to, state, stale);
            if ok { state = to; }
            prop_assert_eq!(w.load(), (generation, Some(state)));
        }
    }
}

#[test]
fn oversized_messages_are_refused_not_truncated() {
    let mut heap = HeapRing::new(4, 32);
    let (mut p, mut c) = heap.split();
    assert_eq!(p.ring().max_payload(), 24);
    assert_eq!(
        p.try_send(&[0; 25]),
        Err(SendError::TooLarge { len: 25, max: 24 })
    );
    assert!(p.try_send(&[1; 24]).is_ok());
    assert_eq!(c.try_recv_with(|m| m.len()), Some(24));
}

#[test]
fn closed_is_reported_only_after_the_ring_drains() {
    let mut heap = HeapRing::new(4, 32);
    let (mut p, mut c) = heap.split();
    p.try_send(b"a").unwrap();
    p.write_with(|b| {
        b[0] = b'b';
        1
    })
    .unwrap();
    p.close(); // publishes the pending write
    assert!(!c.is_drained_and_closed());
    assert_eq!(c.try_recv_with(|m| m.to_vec()), Some(b"a".to_vec()));
    assert_eq!(c.try_recv_with(|m| m.to_vec()), Some(b"b".to_vec()));
    assert!(c.is_drained_and_closed());
}
