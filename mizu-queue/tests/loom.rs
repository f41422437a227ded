//! Loom models of every atomic protocol in this crate. Run with `cargo xtask loom`.
#![cfg(mizu_loom)]

use loom::sync::Arc;
use loom::thread;
use mizu_queue::{HeapDeque, HeapRing, SlotState, StateWord, Steal};
use mizu_shm::sync::model;

/// Three messages through two slots, with batched publication (two writes, one publish) and
/// parking on both sides: nothing lost, duplicated or reordered, and no lost wake-up.
#[test]
fn ring_no_loss_no_duplication_order_kept() {
    model("ring no loss no duplication order kept", Some(2), || {
        let ring = Arc::new(HeapRing::new(2, 16));
        let r2 = ring.clone();
        let producer = thread::spawn(move || {
            let r = r2.ring();
            // SAFETY: this thread is the ring's only producer.
            let mut p = unsafe { r.producer() };
            let mut next = 0u8;
            while next < 3 {
                // Write as many as fit, then publish once.
                while next < 3
                    && p.write_with(|b| {
                        b[0] = next;
                        1
                    })
                    .is_ok()
                {
                    next += 1;
                }
                p.publish();
                if next < 3 {
                    let park = r.producer_park();
                    while park
                        .park(&mut || p.poll_space().then_some(()), None)
                        .is_none()
                    {}
                }
            }
            p.close();
        });
        let r = ring.ring();
        // SAFETY: this thread is the ring's only consumer.
        let mut c = unsafe { r.consumer() };
        let mut got = Vec::new();
        loop {
            if let Some(v) = c.try_recv_with(|m| m.to_vec()) {
                got.push(v);
                continue;
            }
            if c.is_drained_and_closed() {
                break;
            }
            // No manual release: the consumer's own release policy must keep the producer going.
            let park = r.consumer_park();
            while park
                .park(&mut || (c.poll() || r.is_closed()).then_some(()), None)
                .is_none()
            {}
        }
        producer.join().unwrap();
        assert_eq!(got, vec![vec![0], vec![1], vec![2]]);
    });
}

/// The owner pushes two items and pops while a thief steals: each item is taken exactly once.
#[test]
fn deque_each_item_once_with_a_concurrent_thief() {
    model(
        "deque each item once with a concurrent thief",
        Some(3),
        || {
            let dq = Arc::new(HeapDeque::new(2));
            let d2 = dq.clone();
            let thief = thread::spawn(move || {
                let d = d2.deque();
                let mut got = Vec::new();
                for _ in 0..2 {
                    match d.steal() {
                        Steal::Success(v) => got.push(v),
                        Steal::Retry | Steal::Empty => {}
                    }
                }
                got
            });
            let d = dq.deque();
            d.push(1).unwrap();
            d.push(2).unwrap();
            let mut mine = Vec::new();
            while let Some(v) = d.pop() {
                mine.push(v);
            }
            let mut all = thief.join().unwrap();
            all.extend(mine);
            // Whatever was not taken is still there for a later steal.
            while let Steal::Success(v) = d.steal() {
                all.push(v);
            }
            all.sort();
            assert_eq!(all, vec![1, 2]);
        },
    );
}

/// The owner drops an item it no longer wants while a thief steals: every other item is taken
/// exactly once, by the thief or from what the owner kept, in order, and the dropped one never.
#[test]
fn deque_retain_keeps_the_rest_once_with_a_concurrent_thief() {
    model(
        "deque retain keeps the rest once with a concurrent thief",
        Some(3),
        || {
            let dq = Arc::new(HeapDeque::new(4));
            let d = dq.deque();
            for v in 1..=3 {
                d.push(v).unwrap();
            }
            let d2 = dq.clone();
            let thief = thread::spawn(move || match d2.deque().steal() {
                Steal::Success(v) => Some(v),
                Steal::Retry | Steal::Empty => None,
            });
            let dropped = d.retain(|v| v != 2);
            let stolen = thief.join().unwrap();
            let mut rest = Vec::new();
            while let Steal::Success(v) = d.steal() {
                rest.push(v);
            }
            assert_eq!(dropped, usize::from(stolen != Some(2)));
            let want: Vec<u64> = [1, 3].into_iter().filter(|&v| Some(v) != stolen).collect();
            assert_eq!(rest, want, "kept items stay in order");
        },
    );
}

/// Two thieves and the owner race for the last item: exactly one gets it.
#[test]
fn deque_last_item_goes_to_exactly_one() {
    model("deque last item goes to exactly one", Some(3), || {
        let dq = Arc::new(HeapDeque::new(2));
        dq.deque().push(7).unwrap();
        let thieves: Vec<_> = (0..2)
            .map(|_| {
                let d = dq.clone();
                thread::spawn(move || match d.deque().steal() {
                    Steal::Success(v) => Some(v),
                    _ => None,
                })
            })
            .collect();
        let mut winners: Vec<u64> = dq.deque().pop().into_iter().collect();
        for t in thieves {
            winners.extend(t.join().unwrap());
        }
        assert_eq!(winners, vec![7]);
    });
}

/// A worker finishing races the reaper declaring it dead: one outcome, never both.
#[test]
fn slot_finish_vs_reaper_one_outcome() {
    model("slot finish vs reaper one outcome", Some(3), || {
        let w = Arc::new(StateWord::new());
        w.transition(0, SlotState::Free, SlotState::Pending)
            .unwrap();
        w.transition(0, SlotState::Pending, SlotState::Running)
            .unwrap();
        let w2 = w.clone();
        let reaper = thread::spawn(move || {
            w2.transition(0, SlotState::Running, SlotState::Died)
                .is_ok()
        });
        let finished = w.transition(0, SlotState::Running, SlotState::Ok).is_ok();
        let died = reaper.join().unwrap();
        assert!(finished ^ died);
    });
}

/// A stale handle (old generation) cannot collect a slot that was freed and reused.
#[test]
fn slot_generation_stops_stale_handles() {
    model("slot generation stops stale handles", Some(3), || {
        let w = Arc::new(StateWord::new());
        for (a, b) in [
            (SlotState::Free, SlotState::Pending),
            (SlotState::Pending, SlotState::Running),
            (SlotState::Running, SlotState::Ok),
        ] {
            w.transition(0, a, b).unwrap();
        }
        let w2 = w.clone();
        let stale = thread::spawn(move || {
            w2.transition(0, SlotState::Ok, SlotState::Collected)
                .is_ok()
        });
        let mine = w.transition(0, SlotState::Ok, SlotState::Collected).is_ok();
        let stale_won = stale.join().unwrap();
        assert!(mine ^ stale_won, "exactly one collector");
        let g = w.free(0).unwrap();
        assert_eq!(g, 1);
        w.transition(1, SlotState::Free, SlotState::Pending)
            .unwrap();
        assert!(
            w.transition(0, SlotState::Pending, SlotState::Cancelled)
                .is_err()
        );
    });
}

/// A submitter drops its handle while the worker finishes the task: the slot is reclaimed
/// by exactly one of them — never by both (double free), never by neither (leak).
#[test]
fn slot_abandon_vs_finish_frees_exactly_once() {
    use mizu_queue::{abandon, after_finish};
    use mizu_shm::sync::AtomicU32;
    model("slot abandon vs finish frees exactly once", Some(3), || {
        let w = Arc::new((StateWord::new(), AtomicU32::new(0)));
        w.0.transition(0, SlotState::Free, SlotState::Pending)
            .unwrap();
        w.0.transition(0, SlotState::Pending, SlotState::Running)
            .unwrap();
        let w2 = w.clone();
        let worker = thread::spawn(move || {
            w2.0.transition(0, SlotState::Running, SlotState::Ok)
                .unwrap();
            after_finish(&w2.0, &w2.1, 0).is_some()
        });
        let submitter = abandon(&w.0, &w.1, 0).is_some();
        let by_worker = worker.join().unwrap();
        assert!(
            submitter ^ by_worker,
            "submitter {submitter}, worker {by_worker}"
        );
    });
}

/// Two guests join a duplex at once while the host looks for its guest: exactly one joins, and
/// the host sees either no guest or the whole identity of the one that joined (never a mix of
/// the two). Before joining was a claim, both could join.
#[test]
fn duplex_guest_joins_once() {
    use mizu_queue::peer::PeerSlot;
    model("duplex guest joins once", Some(3), || {
        let slot = Arc::new(PeerSlot::default());
        let guests: Vec<_> = [(10u32, 100u64), (11, 110)]
            .into_iter()
            .map(|(pid, nonce)| {
                let slot = slot.clone();
                thread::spawn(move || slot.claim(pid, nonce).then_some(pid))
            })
            .collect();
        if let Some((pid, nonce)) = slot.get() {
            assert_eq!(u64::from(pid) * 10, nonce, "a torn identity");
        }
        let won: Vec<u32> = guests
            .into_iter()
            .filter_map(|g| g.join().unwrap())
            .collect();
        assert_eq!(won.len(), 1, "guests joined: {won:?}");
        assert_eq!(slot.get().map(|(p, _)| p), Some(won[0]));
    });
}
