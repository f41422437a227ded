//! Loom models of the pool runtime's atomic protocols, run on the very functions the workers,
//! submitters and reapers call (`mizu_pool::claim`, `mizu_pool::records`). Run with
//! `cargo xtask loom`; each model prints how many interleavings it explored.
#![cfg(mizu_loom)]

use loom::sync::Arc;
use loom::thread;
use mizu_pool::claim;
use mizu_pool::records::{
    self, Holder, SubmitterRec, TaskHdr, WorkerSlot, idle, ready_workers, wstate,
};
use mizu_queue::{HeapDeque, SlotState};
use mizu_shm::sync::{Ordering, model};

/// Two ready workers and one task slot holding a `Pending` task of generation 0, as the
/// claim and reaper models share them.
struct Sh {
    workers: Vec<WorkerSlot>,
    task: TaskHdr,
}

impl Sh {
    fn new() -> Arc<Sh> {
        let sh = Sh {
            workers: ready_workers(2),
            task: TaskHdr::default(),
        };
        sh.task
            .state
            .transition(0, SlotState::Free, SlotState::Pending)
            .unwrap();
        Arc::new(sh)
    }

    /// The reaper of worker 0 (runner value `runner`), worker 1 alive, as `reap_worker` runs
    /// it: `claim::reap` over this one slot, whose record word is `word`. Whether it failed
    /// the task.
    fn reap_worker_0(&self, word: u64, runner: u64) -> bool {
        let mut failed = false;
        claim::reap(
            &self.workers,
            0,
            runner,
            records::reason::DIED,
            |w| (w == word).then_some(((), &self.task)),
            [((), &self.task)],
            |r| std::ptr::eq(r, &*self.workers[1].rec),
            thread::yield_now,
            |(), _| failed = true,
        );
        failed
    }
}

/// The claim record (`WorkerRec::current`, written before the claim CAS) lets the reaper of a
/// dead worker fail exactly the task that died with it.
///
/// Worker 0 is killed after each of its steps in turn (0 = before it starts); worker 1
/// claims the same task at the same time and runs to the end; then the reaper of worker 0
/// acts (`claim::reap`, as `reap_worker` runs it). The task runs exactly once, ends final,
/// and is failed as died exactly when worker 0 had claimed it and not finished it.
#[test]
fn claim_record_lets_the_reaper_fail_exactly_what_died() {
    const WORD: u64 = 0x8000_0000_0000_0000; // submitter 0, slot 0, generation 0
    const RUNNER: [u64; 2] = [1 << 32 | 10, 2 << 32 | 11];
    // A worker's claim, run and finish as `try_run` does them, stopping (killed) after
    // `steps` steps. Returns (claimed, finished).
    fn work(sh: &Sh, me: usize, steps: u32) -> (bool, bool) {
        let rec = &sh.workers[me].rec;
        if steps == 0 {
            return (false, false);
        }
        claim::announce(rec, WORD, None, 0);
        if steps == 1 {
            return (false, false);
        }
        let Some(g) = claim::take(rec, &sh.task, WORD, 0) else {
            return (false, false);
        };
        if steps == 2 {
            return (true, false);
        }
        claim::set_runner(&sh.task, RUNNER[me]);
        if steps == 3 {
            return (true, false);
        }
        claim::finish(rec, &sh.task, g, true, 0);
        (true, true)
    }
    for steps in 0..5 {
        model(
            &format!("claim/reaper (killed after {steps} steps)"),
            Some(3),
            move || {
                let sh = Sh::new();
                let sh2 = sh.clone();
                let other = thread::spawn(move || work(&sh2, 1, u32::MAX));
                let (claimed, finished) = work(&sh, 0, steps);
                // Worker 0 is dead from here on; worker 1 lives until it is joined.
                let reaped = sh.reap_worker_0(WORD, RUNNER[0]);
                let (other_ran, _) = other.join().unwrap();
                assert!(!(claimed && other_ran), "the task ran twice");
                assert!(claimed || other_ran, "nobody ran the task");
                assert_eq!(reaped, claimed && !finished, "wrong verdict");
                let want = if reaped {
                    SlotState::Died
                } else {
                    SlotState::Ok
                };
                assert_eq!(sh.task.state.load().1, Some(want));
            },
        );
    }
}

/// The reaper's verdict and what it does concern one task. Worker 0 dies after each of its
/// claim steps in turn (inside `claim` too: between its record and its CAS); worker 1 claims
/// the same task, finishes it, collects and frees the slot as its submitter would, and runs
/// the slot's next task. The reaper of worker 0 runs meanwhile (`claim::reap`: its verdict,
/// then every `Running` task naming worker 0 as its runner). The next task is never touched:
/// it ends `Ok`. (Before the verdict looked at the slot again after its look at the records,
/// the reaper wrote the runner field of whatever task the slot then held, and its second pass
/// failed that live worker's task.)
#[test]
fn reaper_leaves_alone_the_task_a_slot_went_on_to() {
    const WORD: [u64; 2] = [0x8000_0000_0000_0000, 0x8000_0000_0000_0001];
    const RUNNER: [u64; 2] = [1 << 32 | 10, 2 << 32 | 11];
    for steps in 0..4 {
        model(
            &format!("reaper/slot reuse (killed after {steps} steps)"),
            Some(3),
            move || {
                let sh = Sh::new();
                let sh2 = sh.clone();
                let other = thread::spawn(move || {
                    let (rec, task) = (&sh2.workers[1].rec, &sh2.task);
                    let g = claim::claim(rec, task, WORD[0], None, 0)?;
                    claim::set_runner(task, RUNNER[1]);
                    claim::finish(rec, task, g, true, 0);
                    // Its submitter collects it and submits the slot's next task.
                    let next = task.state.collect_and_free(g, SlotState::Ok).unwrap();
                    task.reason.store(0, Ordering::Relaxed);
                    task.runner.store(0, Ordering::Relaxed);
                    task.state
                        .transition(next, SlotState::Free, SlotState::Pending)
                        .unwrap();
                    let g = claim::claim(rec, task, WORD[1], None, 0).unwrap();
                    claim::set_runner(task, RUNNER[1]);
                    claim::finish(rec, task, g, true, 0);
                    Some(g)
                });
                // Worker 0: its claim record, the claim CAS, its runner field.
                let rec = &sh.workers[0].rec;
                if steps >= 1 {
                    claim::announce(rec, WORD[0], None, 0);
                }
                let claimed = steps >= 2 && claim::take(rec, &sh.task, WORD[0], 0).is_some();
                if claimed && steps >= 3 {
                    claim::set_runner(&sh.task, RUNNER[0]);
                }
                // Worker 0 is dead from here on.
                sh.reap_worker_0(WORD[0], RUNNER[0]);
                let next = other.join().unwrap();
                assert_eq!(next.is_some(), !claimed, "the task ran once");
                if let Some(g) = next {
                    assert_eq!(sh.task.state.load(), (g, Some(SlotState::Ok)));
                } else {
                    assert_eq!(sh.task.state.load(), (0, Some(SlotState::Died)));
                    assert_eq!(sh.task.runner.load(Ordering::Relaxed), RUNNER[0]);
                    assert_eq!(
                        sh.task.reason.load(Ordering::Relaxed),
                        records::reason::DIED
                    );
                }
            },
        );
    }
}

/// Two processes join one worker slot at once (a launcher that started the worker twice):
/// exactly one gets it; a failed join gives it back for the next.
#[test]
fn one_of_two_joiners_gets_the_slot() {
    model("worker join", Some(3), || {
        let ws = Arc::new(WorkerSlot::default());
        ws.rec.state.store(wstate::STARTING, Ordering::Relaxed);
        let w2 = ws.clone();
        let t = thread::spawn(move || records::join(&w2.rec));
        let mine = records::join(&ws.rec);
        let theirs = t.join().unwrap();
        assert!(mine ^ theirs, "joined twice, or by nobody");
        records::unjoin(&ws.rec);
        assert!(records::join(&ws.rec), "given back");
    });
}

/// A submitter's cancel races a worker's claim (the production `claim::claim` and
/// `claim::cancel`): exactly one wins, the slot shows the winner's state, and a worker that
/// lost leaves no claim record.
#[test]
fn cancel_vs_claim_exactly_one_wins() {
    const WORD: u64 = 0x8000_0000_0000_0000;
    model("cancel vs claim", Some(3), || {
        let sh = Arc::new((ready_workers(1), TaskHdr::default()));
        sh.1.state
            .transition(0, SlotState::Free, SlotState::Pending)
            .unwrap();
        let sh2 = sh.clone();
        let worker =
            thread::spawn(move || claim::claim(&sh2.0[0].rec, &sh2.1, WORD, None, 0).is_some());
        let cancelled = claim::cancel(&sh.1, 0);
        let claimed = worker.join().unwrap();
        assert!(cancelled ^ claimed);
        let want = if claimed {
            SlotState::Running
        } else {
            SlotState::Cancelled
        };
        assert_eq!(sh.1.state.load(), (0, Some(want)));
        assert_eq!(
            sh.0[0].rec.current.load(Ordering::Relaxed),
            if claimed { WORD } else { 0 }
        );
    });
}

/// A stopping pool cancels a pending task while a worker claims it: the `STOPPED` label stays
/// only on a task the stop cancelled, never on one a worker claimed and finished.
#[test]
fn stop_labels_only_what_it_cancelled() {
    const WORD: u64 = 0x8000_0000_0000_0000;
    model("stop vs claim", Some(3), || {
        let sh = Arc::new((ready_workers(1), TaskHdr::default()));
        sh.1.state
            .transition(0, SlotState::Free, SlotState::Pending)
            .unwrap();
        let sh2 = sh.clone();
        let worker = thread::spawn(move || {
            let (rec, task) = (&sh2.0[0].rec, &sh2.1);
            let g = claim::claim(rec, task, WORD, None, 0)?;
            claim::finish(rec, task, g, false, 0);
            Some(g)
        });
        let stopped = claim::stop_pending(&sh.1, 0);
        let ran = worker.join().unwrap();
        assert!(stopped ^ ran.is_some());
        let reason = sh.1.reason.load(Ordering::Relaxed);
        if stopped {
            assert_eq!(sh.1.state.load(), (0, Some(SlotState::Cancelled)));
            assert_eq!(reason, records::reason::STOPPED);
        } else {
            assert_eq!(sh.1.state.load(), (0, Some(SlotState::Err)));
            assert_eq!(reason, 0, "a task that ran got the stop's label");
        }
    });
}

/// The timeout monitor measures the task a worker runs from its own start, also while the
/// worker helps with another task inside the first one's nested collect: the monitor never
/// sees the helped task's start time beside a record, and the outer task stays timed after
/// the helped one finishes. (Before, the helped task's claim replaced the start time and its
/// finish cleared the record: the outer task's timeout stopped counting.)
#[test]
fn the_timeout_monitor_keeps_timing_a_task_that_helps() {
    const OUTER: u64 = 0x8000_0000_0000_0000;
    const NESTED: u64 = 0x8000_0001_0000_0000; // slot 1, generation 0
    model("timeout monitor vs nested help", Some(3), || {
        let sh = Arc::new((ready_workers(1), TaskHdr::default(), TaskHdr::default()));
        for t in [&sh.1, &sh.2] {
            t.state
                .transition(0, SlotState::Free, SlotState::Pending)
                .unwrap();
        }
        let sh2 = sh.clone();
        let worker = thread::spawn(move || {
            let (rec, outer, nested) = (&sh2.0[0].rec, &sh2.1, &sh2.2);
            let g = claim::claim(rec, outer, OUTER, Some(100), 0).unwrap();
            let h = claim::claim(rec, nested, NESTED, Some(200), OUTER).unwrap();
            claim::finish(rec, nested, h, true, OUTER);
            assert_eq!(
                claim::running_since(rec),
                Some(100),
                "the outer task is untimed"
            );
            claim::finish(rec, outer, g, true, 0);
        });
        for _ in 0..2 {
            let seen = claim::running_since(&sh.0[0].rec);
            assert!(matches!(seen, None | Some(100)), "timed from {seen:?}");
        }
        worker.join().unwrap();
        assert_eq!(claim::running_since(&sh.0[0].rec), None);
    });
}

/// Processes 10 and 11 try to take `rec` at once (judging holders by `alive`), and the winner
/// records itself: how many won.
fn race_for(rec: &Arc<SubmitterRec>, alive: fn(Holder) -> bool) -> u32 {
    let wins = Arc::new(loom::sync::atomic::AtomicU32::new(0));
    let spawn = |pid: u32| {
        let (rec, wins) = (rec.clone(), wins.clone());
        thread::spawn(move || {
            if rec.take(pid, alive) {
                rec.hold(pid, 2);
                wins.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let a = spawn(10);
    let b = spawn(11);
    a.join().unwrap();
    b.join().unwrap();
    wins.load(Ordering::Relaxed)
}

/// Two processes attaching at once both find a submitter record whose holder died: exactly one
/// takes it over. (Before the state word counted takings, the one that judged the dead holder
/// first could still win after the other had taken the record and recorded itself, leaving two
/// producers on single-producer rings.)
#[test]
fn dead_submitter_record_is_taken_over_once() {
    const DEAD_PID: u32 = 5;
    model("submitter record takeover", Some(3), || {
        let rec = Arc::new(SubmitterRec::default());
        rec.hold(DEAD_PID, 1);
        let alive: fn(Holder) -> bool = |h| h != Holder::Held(DEAD_PID, 1);
        assert_eq!(race_for(&rec, alive), 1, "taken over twice");
        assert!(rec.is_held());
    });
}

/// A record given back is taken again; a held record of a live process is not.
#[test]
fn live_submitter_record_is_not_taken() {
    model("submitter record release", Some(3), || {
        let rec = Arc::new(SubmitterRec::default());
        rec.hold(7, 1);
        let r2 = rec.clone();
        let t = thread::spawn(move || r2.take(8, |_| true));
        let took = t.join().unwrap();
        assert!(!took, "a live holder's record was taken");
        rec.release();
        assert!(rec.take(8, |_| true));
    });
}

/// A process killed between taking a submitter record and recording itself as its holder: two
/// later processes find it being taken by a process that no longer runs, and exactly one of
/// them takes it over; while the taker still runs, nobody does. (Before the taker's pid went
/// into the state word with its taking, such a record stayed "being taken" for ever.)
#[test]
fn a_record_whose_taker_died_is_taken_over_once() {
    const TAKER: u32 = 5;
    model("submitter record, taker killed", Some(3), || {
        let rec = Arc::new(SubmitterRec::default());
        assert!(rec.take(TAKER, |_| true));
        // The taker runs: its record is not taken from it.
        assert!(!rec.take(9, |_| true));
        // The taker is killed here, before `hold`.
        let alive: fn(Holder) -> bool = |h| h != Holder::Taking(TAKER);
        assert_eq!(race_for(&rec, alive), 1, "taken over twice or never");
        assert!(matches!(rec.pid(), 10 | 11));
    });
}

/// Two sleeping workers wake at once (for their housekeeping) and go idle again with room for
/// one active worker: both find room, both claim it, and never both spin.
#[test]
fn idle_workers_never_overshoot_the_spinner_bound() {
    model("idle spinner bound", Some(3), || {
        let workers = Arc::new(ready_workers(2));
        for w in workers.iter() {
            w.rec.idle.store(idle::SLEEPING, Ordering::Relaxed);
        }
        let w2 = workers.clone();
        let t = thread::spawn(move || records::go_idle(&w2, 1, 1));
        let a = records::go_idle(&workers, 0, 1);
        let b = t.join().unwrap();
        assert!(!(a && b), "two spinners with room for one");
        for (w, spins) in [a, b].into_iter().enumerate() {
            let want = if spins {
                idle::SPINNING
            } else {
                idle::SLEEPING
            };
            assert_eq!(workers[w].rec.idle.load(Ordering::Relaxed), want);
        }
    });
}

/// A nested task pushed onto a worker's deque and announced reaches an idle worker that went to
/// sleep at the same moment: no lost wake-up (loom reports one as a deadlock, its futex
/// emulation ignoring park timeouts).
#[test]
fn announced_nested_task_wakes_an_idle_worker() {
    model("nested announce vs idle worker", Some(2), || {
        let workers = Arc::new(ready_workers(2));
        workers[0].rec.idle.store(idle::BUSY, Ordering::Relaxed);
        let deque = Arc::new(HeapDeque::new(4));
        let (w2, d2) = (workers.clone(), deque.clone());
        // Worker 1 runs out of work and waits for a stealable task (as its wait loop does,
        // minus the spin: a spin ends in the same park).
        let idler = thread::spawn(move || {
            records::go_idle(&w2, 1, 2);
            let mut poll = || (!d2.deque().is_empty()).then_some(());
            while w2[1].park.park(&mut poll, None).is_none() {}
            w2[1].rec.idle.store(idle::BUSY, Ordering::Relaxed);
        });
        // Worker 0 submits a nested task to its own deque and announces it.
        deque.deque().push(7).unwrap();
        records::announce(&workers, Some(0), 1);
        idler.join().unwrap();
    });
}

/// Two runners share a map of five elements through the cursor (adaptive chunks), with and
/// without a failing element: no element runs twice, and every element up to the failure (all
/// of them without one) runs.
#[test]
fn map_handout_runs_each_element_once() {
    use mizu_pool::handout::MapControl;
    const N: u64 = 5;
    for failing in [None, Some(1)] {
        model(
            &format!("map hand-out (failing {failing:?})"),
            Some(2),
            move || {
                let ctl = Arc::new(MapControl::new(N, 0, 0, 2));
                let run = move |ctl: &MapControl| {
                    let mut ran = Vec::new();
                    'chunks: while let Some(chunk) = ctl.next_chunk() {
                        for i in chunk {
                            if !ctl.may_run(i) {
                                break 'chunks;
                            }
                            ran.push(i);
                            if Some(i) == failing {
                                ctl.fail(i);
                                break 'chunks;
                            }
                        }
                    }
                    ran
                };
                let c2 = ctl.clone();
                let other = thread::spawn(move || run(&c2));
                let mut ran = run(&ctl);
                ran.extend(other.join().unwrap());
                ran.sort_unstable();
                let unique = ran.len();
                ran.dedup();
                assert_eq!(unique, ran.len(), "an element ran twice: {ran:?}");
                let must = failing.map_or(N, |f| f + 1);
                assert!(
                    (0..must).all(|i| ran.contains(&i)),
                    "an element before the failure did not run: {ran:?}"
                );
            },
        );
    }
}
