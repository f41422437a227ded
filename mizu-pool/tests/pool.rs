//! The runtime across real processes: every behaviour of the pool with the Rust test worker.

use std::process::Command;
use std::time::{Duration, Instant};

use mizu_pool::{
    Ahead, CollectError, Launcher, Pool, PoolConfig, PoolError, Task, TaskError, collect_all,
    collect_any, wait_ahead,
};
use mizu_queue::SlotState;

mod common;
use common::{WORKER, alive, shm_entries_of, start_controller};

const GUARD: Option<Duration> = Some(Duration::from_secs(120));

fn pool(cfg: PoolConfig) -> Pool {
    Pool::new(cfg, Launcher::new(WORKER, Vec::<String>::new())).unwrap()
}

fn workers(n: usize) -> PoolConfig {
    PoolConfig {
        workers: n,
        ..Default::default()
    }
}

/// One task per test-worker command, submitted in order.
fn submit_all(p: &Pool, commands: &[&str]) -> Vec<Task> {
    commands
        .iter()
        .map(|c| p.submit(c.as_bytes()).unwrap())
        .collect()
}

fn text(b: &arrow_buffer::Buffer) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "hang guard: {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_task_round_trips_and_many_are_conserved() {
    let p = pool(PoolConfig {
        workers: 2,
        slots: 8192,
        ..Default::default()
    });
    assert_eq!(
        text(&p.submit(b"echo:hello").unwrap().result(GUARD).unwrap()),
        "hello"
    );
    let mut tasks: Vec<_> = (0..5000)
        .map(|i| p.submit(format!("echo:{i}").as_bytes()).unwrap())
        .collect();
    let got = collect_all(&mut tasks, GUARD).unwrap();
    for (i, b) in got.iter().enumerate() {
        assert_eq!(text(b), i.to_string(), "results in input order, none lost");
    }
    let st = p.status();
    assert_eq!(st.submitted, 5001);
    assert_eq!(st.collected, 5001);
    assert_eq!(
        st.workers.iter().map(|w| w.tasks).sum::<u64>(),
        5001,
        "each task ran exactly once"
    );
}

#[test]
fn large_payloads_travel_through_data_segments() {
    let p = pool(workers(1));
    let mut input = b"sum:".to_vec();
    input.extend(std::iter::repeat_n(3u8, 1 << 20));
    assert_eq!(
        text(&p.submit(&input).unwrap().result(GUARD).unwrap()),
        (3u64 << 20).to_string()
    );
    let big = p.submit(b"big:3000000").unwrap().result(GUARD).unwrap();
    assert_eq!(big.len(), 3_000_000);
    assert!(big.iter().all(|&b| b == 7));
}

#[test]
fn payloads_of_a_few_kib_travel_inline_in_wide_slots_and_every_size_arrives_whole() {
    let p = pool(workers(1));
    let msg = |len: usize, seed: usize| {
        let mut m = b"echo:".to_vec();
        m.extend((0..len).map(|i| b'a' + ((i * 7 + seed) % 26) as u8));
        m
    };
    let check = |mut t: Task, m: &[u8]| {
        let got = t.result(GUARD).unwrap();
        assert_eq!(
            got.as_slice(),
            &m[5..],
            "a {}-byte payload came back whole",
            m.len()
        );
    };
    let worker = p.status().workers[0].pid;
    let worker_files = shm_entries_of(&[worker]).len();
    // One at a time, across the narrow and the wide slot sizes (256, 4096): both ways inline.
    for len in (240..=280).chain([1000, 3000]).chain(4080..=4091) {
        let m = msg(len, len);
        check(p.submit(&m).unwrap(), &m);
    }
    assert_eq!(
        p.data_pool().segments(),
        0,
        "inputs of up to 4 KiB went inline"
    );
    assert_eq!(
        shm_entries_of(&[worker]).len(),
        worker_files,
        "outcomes of up to 4 KiB went inline"
    );
    // Past the wide size, and more in flight than there are wide slots: regions take the rest.
    for len in [4092, 5000, 100_000] {
        let m = msg(len, 1);
        check(p.submit(&m).unwrap(), &m);
    }
    assert!(
        p.data_pool().segments() > 0,
        "a payload past 4 KiB went through a region"
    );
    let ms: Vec<Vec<u8>> = (0..200).map(|i| msg(300 + 17 * i, i)).collect();
    let tasks: Vec<Task> = ms.iter().map(|m| p.submit(m).unwrap()).collect();
    for (t, m) in tasks.into_iter().zip(&ms) {
        check(t, m);
    }
    // A worker killed (by itself, `kill -9`) while it runs a task from a wide slot: the task
    // fails, the slot serves again.
    let mut abort = b"abort:".to_vec();
    abort.resize(2000, b' ');
    assert!(matches!(
        p.submit(&abort).unwrap().result(GUARD),
        Err(CollectError::Task(TaskError::WorkerDied { .. }))
    ));
    for len in [300, 2000, 4000] {
        let m = msg(len, 3);
        check(p.submit(&m).unwrap(), &m);
    }
}

#[test]
fn a_failing_task_reports_its_error_and_the_pool_goes_on() {
    let p = pool(workers(1));
    let e = p.submit(b"fail:boom").unwrap().result(GUARD).unwrap_err();
    assert_eq!(e, CollectError::Task(TaskError::Failed(b"boom".to_vec())));
    assert_eq!(text(&p.call(b"echo:after").unwrap()), "after");
}

#[test]
fn kill_9_of_a_worker_mid_task_fails_that_task_and_the_pool_replaces_the_worker() {
    let p = pool(workers(1));
    let mut t = p.submit(b"sleep:100000").unwrap();
    wait_until("the task starts", || t.state() == Some(SlotState::Running));
    let victim = p.status().workers[0].pid;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(victim as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    match t.result(GUARD) {
        Err(CollectError::Task(TaskError::WorkerDied { slot: 0, pid })) => assert_eq!(pid, victim),
        other => panic!("expected WorkerDied, got {other:?}"),
    }
    wait_until("a replacement joins", || {
        p.status().workers[0].state == "ready" && p.status().workers[0].pid != victim
    });
    assert_eq!(p.status().respawns, 1);
    assert_eq!(p.deaths(), 1, "a killed worker is a death");
    assert_eq!(text(&p.call(b"echo:still here").unwrap()), "still here");
}

#[test]
fn a_worker_killed_while_asleep_leaves_no_sleeper_behind() {
    // A worker killed while parked never takes back its announcement; its replacement, busy
    // with a task, must not count as asleep (wakers would make needless wake syscalls and
    // submitters would pass it over).
    let p = pool(workers(1));
    wait_until("the worker sleeps", || p.status().workers[0].asleep);
    let victim = p.status().workers[0].pid;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(victim as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    wait_until("a replacement joins", || {
        p.status().workers[0].state == "ready" && p.status().workers[0].pid != victim
    });
    let mut t = p.submit(b"sleep:2000").unwrap();
    wait_until("the task starts", || t.state() == Some(SlotState::Running));
    assert!(
        !p.status().workers[0].asleep,
        "a busy worker counted as asleep"
    );
    assert_eq!(text(&t.result(GUARD).unwrap()), "slept");
}

#[test]
fn a_worker_that_kills_itself_fails_only_its_task() {
    let p = pool(workers(2));
    let mut others: Vec<_> = (0..200)
        .map(|i| p.submit(format!("echo:{i}").as_bytes()).unwrap())
        .collect();
    let e = p.submit(b"abort").unwrap().result(GUARD).unwrap_err();
    assert!(
        matches!(e, CollectError::Task(TaskError::WorkerDied { .. })),
        "{e:?}"
    );
    let got = collect_all(&mut others, GUARD).unwrap();
    assert_eq!(
        got.len(),
        200,
        "queued work of the dead worker was taken over"
    );
}

#[test]
fn a_worker_killed_holding_large_inputs_gives_them_back() {
    // The worker adopts each input (a region of ours, past the slot size) and holds it while
    // the task runs; killed then, it never releases it. The monitor gives back what the dead
    // worker's ledger lists, or our segments stay pinned until this process exits.
    let p = pool(workers(1));
    let payload = |cmd: &str| {
        let mut b = cmd.as_bytes().to_vec();
        b.resize(1 << 20, b' ');
        b
    };
    // Held and released normally: the ledger entry is cleared, nothing is given back twice.
    let ok = p.submit(&payload("input:")).unwrap().result(GUARD).unwrap();
    assert_eq!(text(&ok), (1 << 20).to_string());
    wait_until("the worker released its input", || {
        p.data_pool().live_regions() == 0
    });
    // A region of ours that we keep holding: its count must survive the reaping below.
    let mine = p.data_pool().store(&[3u8; 100_000]).unwrap();
    for kill in ["abort:", "abort:"] {
        let e = p.submit(&payload(kill)).unwrap().result(GUARD).unwrap_err();
        assert!(
            matches!(e, CollectError::Task(TaskError::WorkerDied { .. })),
            "{e:?}"
        );
    }
    wait_until("the dead workers' inputs are given back", || {
        p.data_pool().live_regions() == 1
    });
    assert_eq!(mine.bytes(), &[3u8; 100_000][..]);
    drop(mine);
    assert_eq!(p.data_pool().live_regions(), 0);
    // The replacement serves large inputs as before.
    let ok = p.submit(&payload("input:")).unwrap().result(GUARD).unwrap();
    assert_eq!(text(&ok), (1 << 20).to_string());
}

#[test]
fn a_task_over_the_execution_timeout_fails_and_its_worker_is_replaced() {
    let p = pool(PoolConfig {
        workers: 1,
        exec_timeout: Some(Duration::from_millis(200)),
        ..Default::default()
    });
    let e = p
        .submit(b"sleep:100000")
        .unwrap()
        .result(GUARD)
        .unwrap_err();
    assert!(
        matches!(
            e,
            CollectError::Task(TaskError::ExecTimeout { slot: 0, .. })
        ),
        "{e:?}"
    );
    assert_eq!(text(&p.call(b"echo:ok").unwrap()), "ok");
    assert_eq!(
        p.deaths(),
        0,
        "a worker killed for the timeout is not a death"
    );
}

#[test]
fn queued_tasks_can_be_cancelled_running_ones_cannot() {
    let p = pool(workers(1));
    let mut busy = p.submit(b"sleep:300").unwrap();
    wait_until("busy", || busy.state() == Some(SlotState::Running));
    let mut queued = p.submit(b"echo:never").unwrap();
    assert!(queued.cancel());
    assert!(!busy.cancel(), "a running task is not interrupted");
    assert_eq!(
        queued.result(GUARD),
        Err(CollectError::Task(TaskError::Cancelled))
    );
    assert_eq!(text(&busy.result(GUARD).unwrap()), "slept");
}

#[test]
fn a_queued_task_is_cancelled_by_id_while_another_thread_waits_for_it() {
    let p = pool(workers(1));
    let mut busy = p.submit(b"sleep:300").unwrap();
    wait_until("busy", || busy.state() == Some(SlotState::Running));
    let mut queued = p.submit(b"echo:never").unwrap();
    let id = queued.id();
    std::thread::scope(|s| {
        let waiter = s.spawn(move || queued.result(GUARD));
        assert!(p.cancel_packed(id.pack()), "queued: cancelled by id");
        assert_eq!(
            waiter.join().unwrap(),
            Err(CollectError::Task(TaskError::Cancelled))
        );
    });
    assert!(
        !p.cancel_packed(id.pack()),
        "already cancelled and collected"
    );
    assert!(
        !p.cancel_packed(busy.id().pack()),
        "a running task is not interrupted"
    );
    let nowhere = mizu_pool::TaskId {
        submitter: 1 << 10,
        slot: 0,
        generation: 0,
    };
    assert!(
        !p.cancel_packed(nowhere.pack()),
        "an id naming no slot of the pool"
    );
    let past = mizu_pool::TaskId {
        slot: 1 << 19,
        ..busy.id()
    };
    assert!(!p.cancel_packed(past.pack()));
    assert!(!p.cancel_packed(0), "no id");
    assert_eq!(text(&busy.result(GUARD).unwrap()), "slept");
    assert_eq!(text(&p.call(b"echo:again").unwrap()), "again");
}

#[test]
fn a_task_queued_behind_a_long_one_is_taken_by_a_worker_that_goes_idle() {
    // Both workers busy: the third task waits in one of their rings. When the short task's
    // worker goes idle, it runs the third task (from its own ring, or else by scanning the
    // slots, since one of the two outstanding tasks is claimed by nobody) long before the
    // long task ends.
    let mut p = pool(workers(2));
    let long = p.submit(b"sleep:60000").unwrap();
    let short = p.submit(b"sleep:100").unwrap();
    wait_until("both run", || {
        long.state() == Some(SlotState::Running) && short.state() == Some(SlotState::Running)
    });
    let mut queued = p.submit(b"echo:behind").unwrap();
    assert_eq!(text(&queued.result(GUARD).unwrap()), "behind");
    assert_eq!(long.state(), Some(SlotState::Running));
    p.stop(Duration::ZERO);
}

#[test]
fn tasks_submitted_back_to_back_to_sleeping_workers_go_one_to_each() {
    // Both workers parked: the first task wakes one of them. The second must not join the
    // first in the ring of a worker still waking up (it would wait there until the other
    // worker stole it, an idle slice later): it goes to the other sleeping worker.
    let mut p = pool(workers(2));
    for round in 0..5 {
        // Long enough for the workers to spend their spin and park (not asserted: a worker
        // still spinning is found by an earlier pass of the same routing).
        std::thread::sleep(Duration::from_millis(20));
        let before = p.status();
        let mut tasks = vec![
            p.submit(b"sleep:50").unwrap(),
            p.submit(b"sleep:50").unwrap(),
        ];
        collect_all(&mut tasks, GUARD).unwrap();
        let after = p.status();
        for (b, a) in before.workers.iter().zip(&after.workers) {
            assert_eq!(
                a.tasks - b.tasks,
                1,
                "round {round}: one task each: {after:?}"
            );
            assert_eq!(a.steals, b.steals, "round {round}: none stolen: {after:?}");
        }
    }
    p.stop(Duration::ZERO);
}

#[test]
fn a_collect_timeout_leaves_the_handle_valid() {
    let p = pool(workers(1));
    let mut t = p.submit(b"sleep:300").unwrap();
    assert_eq!(
        t.result(Some(Duration::from_millis(10))),
        Err(CollectError::Timeout)
    );
    assert_eq!(text(&t.result(GUARD).unwrap()), "slept");
    assert_eq!(t.result(GUARD), Err(CollectError::AlreadyCollected));
}

#[test]
fn collect_any_returns_the_first_finished() {
    let p = pool(workers(2));
    let tasks = vec![
        p.submit(b"sleep:2000").unwrap(),
        p.submit(b"echo:fast").unwrap(),
    ];
    assert_eq!(collect_any(&tasks, GUARD), Some(1));
}

#[test]
fn waiting_ahead_returns_once_the_task_halfway_along_is_final() {
    let p = pool(workers(1));
    let mut tasks = submit_all(
        &p,
        &["sleep:100", "sleep:100", "echo:a", "sleep:100", "echo:b"],
    );
    let refs: Vec<_> = tasks.iter().collect();
    assert!(wait_ahead(&refs, GUARD));
    // One worker runs them in order: everything up to the one halfway along is final.
    assert!(tasks[..=2].iter().all(|t| t.is_done()));
    let got: Vec<_> = collect_all(&mut tasks, GUARD)
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(got, ["slept", "slept", "a", "slept", "b"]);
    let none: Vec<&mizu_pool::Task> = Vec::new();
    assert!(wait_ahead(&none, GUARD), "nothing to wait for");
}

#[test]
fn waiting_ahead_returns_at_once_only_when_the_next_task_is_final_as_it_starts() {
    let p = pool(workers(1));
    let tasks = submit_all(&p, &["echo:a", "sleep:100000", "echo:b"]);
    assert!(mizu_pool::wait_until(&tasks[0], GUARD, || tasks[0].is_done().then_some(())).is_some());
    let refs: Vec<_> = tasks.iter().collect();
    // The one halfway along sleeps: only the first being final as it starts ends this wait.
    let mut ahead = Ahead::new(false);
    assert!(ahead.wait(&refs, Some(Duration::from_millis(100))));
    assert!(!tasks[1].is_done());
    // A wait that found its next task not final goes on waiting ahead through its next
    // slices (here it started on the rest and then sees the whole list).
    let mut ahead = Ahead::new(false);
    let rest = &refs[1..];
    assert!(!ahead.wait(rest, Some(Duration::from_millis(10))));
    assert!(!ahead.wait(&refs, Some(Duration::from_millis(10))));
    assert!(!wait_ahead(&refs, Some(Duration::from_millis(10))));
}

#[test]
fn a_stream_waits_ahead_only_for_a_while_and_a_map_for_the_task_halfway_along() {
    let p = pool(workers(1));
    let tasks = submit_all(&p, &["sleep:300", "sleep:5000", "echo:x"]);
    let refs: Vec<_> = tasks.iter().collect();
    // Needing every result, it sleeps past the first task's outcome, for the second.
    assert!(!Ahead::new(false).wait(&refs, Some(Duration::from_millis(1000))));
    // Streaming, it hands on the first one once `PATIENCE` has passed.
    let mut stream = Ahead::new(true);
    assert!((0..4000).any(|_| stream.wait(&refs, Some(Duration::from_millis(30)))));
    assert!(tasks[0].is_done());
    assert!(
        !tasks[1].is_done(),
        "a stream does not wait for the task halfway along"
    );
}

#[test]
fn a_stream_in_any_order_ends_its_wait_at_any_final_task() {
    let p = pool(workers(2));
    let tasks = submit_all(&p, &["sleep:5000", "echo:a", "sleep:5000"]);
    let refs: Vec<_> = tasks.iter().collect();
    let mut any = Ahead::any_order();
    assert!((0..4000).any(|_| any.wait(&refs, Some(Duration::from_millis(30)))));
    assert!(tasks[1].is_done());
    assert!(!tasks[0].is_done(), "it did not wait for the first");
}

#[test]
fn waiting_ahead_stops_at_a_failure_before_the_task_it_waits_for() {
    let p = pool(workers(1));
    let tasks = submit_all(&p, &["sleep:200", "fail:boom", "sleep:100000", "echo:x"]);
    let refs: Vec<_> = tasks.iter().collect();
    assert!(wait_ahead(&refs, GUARD));
    assert_eq!(tasks[1].state(), Some(SlotState::Err));
    assert!(
        !tasks[2].is_done(),
        "the failure ended the wait, not the task halfway along"
    );
}

#[test]
fn threads_waiting_for_tasks_of_one_submitter_each_get_theirs() {
    let p = pool(workers(1));
    let mut tasks = submit_all(&p, &["sleep:300", "echo:second", "sleep:200"]);
    // One waiter parks aimed at its task, the others where every outcome wakes them.
    let got: Vec<String> = std::thread::scope(|s| {
        let waiters: Vec<_> = tasks
            .iter_mut()
            .map(|t| s.spawn(move || text(&t.result(GUARD).unwrap())))
            .collect();
        waiters.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(got, ["slept", "second", "slept"]);
}

#[test]
fn a_waiter_watching_its_own_flag_is_woken_for_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let p = pool(workers(1));
    let running = p.submit(b"sleep:100000").unwrap();
    wait_until("the task starts", || {
        running.state() == Some(SlotState::Running)
    });
    let flag = AtomicBool::new(false);
    let wakeup = running.wakeup();
    let got = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            mizu_pool::wait_until(&running, GUARD, || {
                if flag.load(Ordering::SeqCst) {
                    Some("flag")
                } else {
                    running.is_done().then_some("task")
                }
            })
        });
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, Ordering::SeqCst);
        wakeup.wake();
        waiter.join().unwrap()
    });
    assert_eq!(got, Some("flag"));
    assert_eq!(running.state(), Some(SlotState::Running));
}

#[test]
fn nested_tasks_never_deadlock_even_with_one_worker() {
    let p = pool(workers(1));
    assert_eq!(
        text(&p.submit(b"nested:50").unwrap().result(GUARD).unwrap()),
        (0..50).sum::<u64>().to_string()
    );
    let p2 = pool(workers(2));
    let mut ts: Vec<_> = (0..8).map(|_| p2.submit(b"nested:20").unwrap()).collect();
    for b in collect_all(&mut ts, GUARD).unwrap() {
        assert_eq!(text(&b), "190");
    }
}

#[test]
fn an_idle_worker_steals_nested_tasks_from_the_deque_of_the_worker_that_submitted_them() {
    // The submitting task waits without helping: only a steal from its deque can run them.
    let p = pool(workers(2));
    let out = text(&p.submit(b"nestedwait:20").unwrap().result(GUARD).unwrap());
    let st = p.status();
    let by_pid = |pid: u32| st.workers.iter().find(|w| w.pid == pid).unwrap();
    let runners: Vec<u32> = out.split(',').map(|s| s.parse().unwrap()).collect();
    assert_eq!(runners.len(), 20);
    let thief = by_pid(runners[0]);
    assert!(runners.iter().all(|&r| r == thief.pid), "{runners:?}");
    assert!(thief.steals >= 20, "{st:?}");
    // The submitting worker's nested slots are all free again.
    let nested = st.submitters.iter().filter(|s| s.index > 0);
    assert!(
        nested
            .clone()
            .all(|s| s.queued + s.running + s.finished == 0),
        "{st:?}"
    );
}

#[test]
fn nested_tasks_of_a_killed_worker_are_cancelled_and_their_slots_freed() {
    let p = pool(workers(1));
    let e = p
        .submit(b"nestedabort:30")
        .unwrap()
        .result(GUARD)
        .unwrap_err();
    assert!(
        matches!(e, CollectError::Task(TaskError::WorkerDied { .. })),
        "{e:?}"
    );
    // Nobody can collect them any more: none may hold its slot (or run, once its worker's
    // replacement is there).
    wait_until("the dead worker's nested slots are free", || {
        p.status()
            .submitters
            .iter()
            .all(|s| s.queued + s.running + s.finished == 0)
    });
    assert_eq!(text(&p.call(b"echo:served").unwrap()), "served");
    assert_eq!(p.status().respawns, 1);
}

#[test]
fn dropping_uncollected_handles_frees_their_slots() {
    let p = pool(PoolConfig {
        workers: 1,
        slots: 8,
        ..Default::default()
    });
    for i in 0..200 {
        let t0 = Instant::now();
        loop {
            match p.submit(format!("echo:{i}").as_bytes()) {
                Ok(t) => {
                    drop(t);
                    break;
                }
                Err(PoolError::SlotsExhausted(8)) => {
                    assert!(
                        t0.elapsed() < Duration::from_secs(60),
                        "slots never came back"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    // Every slot is reusable again.
    wait_until("all slots free", || {
        let ts: Vec<_> = (0..8).filter_map(|_| p.submit(b"echo:x").ok()).collect();
        ts.len() == 8
    });
}

#[test]
fn exhausted_slots_and_full_queues_are_clear_errors() {
    let p = pool(PoolConfig {
        workers: 1,
        slots: 4,
        ring_capacity: 2,
        ..Default::default()
    });
    let mut busy = p.submit(b"sleep:500").unwrap();
    wait_until("busy", || busy.state() == Some(SlotState::Running));
    let a = p.submit(b"echo:a").unwrap();
    let b = p.submit(b"echo:b").unwrap();
    // The one worker's queue (capacity 2) is full: submission waits, then times out.
    let e = p
        .submit_timeout(b"echo:c", Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(e, PoolError::SubmitTimeout(_)), "{e}");
    let c = p
        .submit_timeout(b"echo:c", Duration::from_secs(60))
        .unwrap();
    let e = p.submit(b"echo:d").unwrap_err();
    assert!(matches!(e, PoolError::SlotsExhausted(4)), "{e}");
    let mut all = vec![a, b, c];
    assert_eq!(collect_all(&mut all, GUARD).unwrap().len(), 3);
    assert_eq!(text(&busy.result(GUARD).unwrap()), "slept");
}

#[test]
fn stop_cancels_queued_fails_running_and_wakes_collectors() {
    let mut p = pool(workers(1));
    let mut running = p.submit(b"sleep:100000").unwrap();
    wait_until("running", || running.state() == Some(SlotState::Running));
    let mut queued = p.submit(b"echo:x").unwrap();
    let token = p.token().to_owned();
    let t0 = Instant::now();
    p.stop(Duration::from_millis(200));
    assert!(t0.elapsed() < Duration::from_secs(30), "stop is bounded");
    assert_eq!(
        queued.result(GUARD),
        Err(CollectError::Task(TaskError::Stopped))
    );
    assert_eq!(
        running.result(GUARD),
        Err(CollectError::Task(TaskError::Stopped))
    );
    assert!(matches!(p.submit(b"echo:y"), Err(PoolError::Stopped)));
    assert!(
        !std::path::Path::new("/dev/shm").join(&token[1..]).exists(),
        "teardown unlinks the pool"
    );
}

#[test]
fn workers_can_be_retired_and_spawned() {
    let p = pool(PoolConfig {
        workers: 2,
        max_workers: 3,
        ..Default::default()
    });
    assert!(p.retire_worker(1));
    wait_until("retired", || {
        p.status()
            .workers
            .iter()
            .any(|w| w.slot == 1 && w.state == "dead")
    });
    assert_eq!(p.status().respawns, 0, "a retired worker is not replaced");
    let slot = p.spawn_worker().unwrap();
    assert!(slot == 1 || slot == 2);
    let mut ts: Vec<_> = (0..100)
        .map(|i| p.submit(format!("echo:{i}").as_bytes()).unwrap())
        .collect();
    assert_eq!(collect_all(&mut ts, GUARD).unwrap().len(), 100);
}

#[test]
fn an_on_demand_pool_reuses_an_idle_worker_and_starts_more_for_work_in_flight() {
    let p = pool(PoolConfig {
        workers: 1,
        max_workers: 3,
        on_demand: true,
        ..Default::default()
    });
    let started = |p: &Pool| {
        p.status()
            .workers
            .iter()
            .filter(|w| w.state == "ready" || w.state == "starting")
            .count()
    };
    // One task at a time: the idle worker serves each.
    for i in 0..5 {
        let mut t = p.submit(format!("echo:{i}").as_bytes()).unwrap();
        assert_eq!(&t.result(GUARD).unwrap()[..], format!("{i}").as_bytes());
    }
    assert_eq!(started(&p), 1);
    // Four in flight at once: every slot starts (a starting worker shows its process).
    let mut ts: Vec<_> = (0..4).map(|_| p.submit(b"sleep:200").unwrap()).collect();
    assert_eq!(started(&p), 3);
    assert!(p.status().workers.iter().all(|w| w.pid != 0));
    assert_eq!(collect_all(&mut ts, GUARD).unwrap().len(), 4);
    wait_until("all joined", || {
        p.status()
            .workers
            .iter()
            .filter(|w| w.state == "ready")
            .count()
            == 3
    });
    // A submission that failed before its queue counts too (as ProcessPoolExecutor's do).
    let q = pool(PoolConfig {
        workers: 1,
        max_workers: 2,
        on_demand: true,
        ..Default::default()
    });
    q.submission_failed();
    assert_eq!(
        started(&q),
        1,
        "one unqueued submission: the idle worker would take it"
    );
    q.submission_failed();
    assert_eq!(started(&q), 2);
}

#[test]
fn bad_configurations_and_launchers_are_clear_errors() {
    for cfg in [
        PoolConfig {
            workers: 0,
            ..Default::default()
        },
        PoolConfig {
            slots: 0,
            ..Default::default()
        },
        PoolConfig {
            slot_bytes: 100,
            ..Default::default()
        },
        PoolConfig {
            wide_bytes: 128,
            ..Default::default()
        },
        PoolConfig {
            wide_bytes: 4100,
            ..Default::default()
        },
        PoolConfig {
            ring_capacity: 3,
            ..Default::default()
        },
    ] {
        let e = Pool::new(cfg, Launcher::new(WORKER, Vec::<String>::new()))
            .err()
            .expect("invalid config");
        assert!(matches!(e, PoolError::Config(_)), "{e}");
    }
    let e = Pool::new(
        workers(1),
        Launcher::new("/nonexistent/worker", Vec::<String>::new()),
    )
    .err()
    .unwrap();
    assert!(matches!(e, PoolError::Launch { .. }), "{e}");
    let e = Pool::new(
        workers(1),
        Launcher::new("/bin/false", Vec::<String>::new()),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("exited before joining"), "{e}");
    // A worker given a bad token exits with a clear error.
    let out = Command::new(WORKER)
        .args(["not-a-token", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid segment name"));
}

#[test]
fn waiting_for_workers_to_start_can_be_interrupted() {
    // A "worker" that never joins (it sleeps): the wait ends when the caller says so, long
    // before the start timeout, and the process started is gone.
    let pidfile = std::env::temp_dir().join(format!("mizu-start-{}", std::process::id()));
    let mut asked = 0;
    let t0 = Instant::now();
    let e = Pool::new_interruptible(
        PoolConfig {
            workers: 1,
            start_timeout: Duration::from_secs(600),
            ..Default::default()
        },
        Launcher::new(
            "/bin/sh",
            [
                "-c",
                "echo $$ > \"$0\"; exec sleep 600",
                pidfile.to_str().unwrap(),
            ],
        ),
        &mut || {
            asked += 1;
            asked < 3 || !pidfile.exists()
        },
    )
    .err()
    .expect("interrupted");
    assert!(matches!(e, PoolError::Interrupted), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(120), "hang guard");
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = std::fs::remove_file(&pidfile);
    wait_until("the starting worker is gone", || !alive(pid));
}

#[test]
fn killing_the_controller_makes_workers_exit_and_leaves_nothing() {
    let (mut ctl, _token, pids) = start_controller();
    let ctl_pid = ctl.id();
    ctl.kill().unwrap();
    ctl.wait().unwrap();
    wait_until("workers exit after the controller died", || {
        pids.iter().all(|&p| !alive(p))
    });
    assert_eq!(
        shm_entries_of(&[ctl_pid, pids[0], pids[1]]),
        Vec::<String>::new(),
        "the surviving workers pruned everything"
    );
}

#[test]
fn workers_busy_in_long_tasks_leave_soon_after_the_controller_dies() {
    let (mut ctl, token, pids) = start_controller();
    // Both workers start a ten-minute task (submitted by this process, attached by token).
    let sub = mizu_pool::Submitter::attach(&token).unwrap();
    let tasks: Vec<_> = (0..2)
        .map(|_| sub.submit(b"sleep:600000").unwrap())
        .collect();
    wait_until("both workers run a task", || {
        tasks.iter().all(|t| t.state() == Some(SlotState::Running))
    });
    let ctl_pid = ctl.id();
    ctl.kill().unwrap();
    ctl.wait().unwrap();
    // The hang guard (120 s) is far below the tasks' ten minutes.
    wait_until("busy workers leave after the controller died", || {
        pids.iter().all(|&p| !alive(p))
    });
    drop(tasks);
    drop(sub);
    assert_eq!(
        shm_entries_of(&[ctl_pid, pids[0], pids[1]]),
        Vec::<String>::new(),
        "the leaving workers removed everything"
    );
}

#[test]
fn a_map_returns_results_in_input_order_for_any_chunking() {
    use mizu_pool::{MapOptions, MapOutput};
    let p = pool(workers(2));
    let inputs: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("echo:{i}").into_bytes())
        .collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
    for chunk in [None, Some(1), Some(7), Some(100_000)] {
        let MapOutput::List(out) = p
            .map(
                &refs,
                &MapOptions {
                    chunk,
                    ..Default::default()
                },
            )
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(out.len(), 10_000);
        for (i, b) in out.iter().enumerate() {
            assert_eq!(text(b), i.to_string(), "chunk {chunk:?}");
        }
    }
    let MapOutput::List(empty) = p.map(&[], &MapOptions::default()).unwrap() else {
        panic!()
    };
    assert!(empty.is_empty());
}

#[test]
fn a_typed_map_writes_straight_into_one_buffer() {
    use mizu_pool::{MapOptions, MapOutput};
    let p = pool(workers(2));
    let inputs: Vec<Vec<u8>> = (0..1000u32)
        .map(|i| [b"echo:".as_slice(), &(i * 3).to_le_bytes()].concat())
        .collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
    let MapOutput::Typed(buf) = p
        .map(
            &refs,
            &MapOptions {
                typed_output: Some(4),
                ..Default::default()
            },
        )
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(buf.len(), 4000);
    for i in 0..1000usize {
        assert_eq!(
            u32::from_le_bytes(buf[i * 4..i * 4 + 4].try_into().unwrap()),
            i as u32 * 3
        );
    }
    // A result of the wrong width is an error naming the element.
    let bad: Vec<&[u8]> = vec![b"echo:abcd", b"echo:toolong"];
    let e = p
        .map(
            &bad,
            &MapOptions {
                typed_output: Some(4),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(e, mizu_pool::MapError::Element { index: 1, .. }),
        "{e}"
    );
}

#[test]
fn the_first_failure_stops_the_map_and_names_its_index() {
    use mizu_pool::MapOptions;
    let p = pool(workers(2));
    let mut inputs: Vec<Vec<u8>> = (0..5000)
        .map(|i| format!("echo:{i}").into_bytes())
        .collect();
    inputs[1234] = b"fail:no".to_vec();
    inputs[4000] = b"fail:later".to_vec();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
    match p.map(
        &refs,
        &MapOptions {
            chunk: Some(50),
            ..Default::default()
        },
    ) {
        Err(mizu_pool::MapError::Element { index, error }) => {
            assert_eq!(index, 1234, "the smallest failing index");
            assert_eq!(error, TaskError::Failed(b"no".to_vec()));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(text(&p.call(b"echo:after").unwrap()), "after");
}

#[test]
fn a_map_stops_when_asked_and_the_pool_goes_on() {
    use mizu_pool::MapOptions;
    let p = pool(workers(2));
    let inputs: Vec<Vec<u8>> = (0..2000).map(|_| b"sleep:5".to_vec()).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
    let mut polls = 0;
    let r = p.map_until(
        &refs,
        &MapOptions {
            chunk: Some(1),
            ..Default::default()
        },
        &mut || {
            polls += 1;
            polls > 3
        },
    );
    assert!(matches!(r, Err(mizu_pool::MapError::Stopped)), "{r:?}");
    assert_eq!(text(&p.call(b"echo:after").unwrap()), "after");
}

#[test]
fn nested_maps_never_deadlock_even_with_one_worker() {
    let p = pool(workers(1));
    assert_eq!(
        text(&p.call(b"nestedmap:100").unwrap()),
        (0..100).sum::<u64>().to_string()
    );
}

#[test]
fn batches_are_published_once_and_survive_full_queues() {
    // A batch far larger than the queue capacity: the submitter must publish what it wrote
    // before it waits for space, or the worker could never drain it.
    let p = pool(PoolConfig {
        workers: 1,
        ring_capacity: 4,
        slots: 4096,
        ..Default::default()
    });
    let inputs: Vec<Vec<u8>> = (0..3000)
        .map(|i| format!("echo:{i}").into_bytes())
        .collect();
    let mut ts = p.submit_batch(inputs.iter().map(|v| &v[..])).unwrap();
    let out = collect_all(&mut ts, GUARD).unwrap();
    assert!(
        out.iter()
            .enumerate()
            .all(|(i, b)| text(b) == i.to_string())
    );
}

#[test]
fn a_one_worker_pool_runs_tasks_in_the_order_they_were_submitted() {
    // Large batches, each staged while the idle worker's slices end: a worker that took
    // tasks by walking the task slots (as one takes tasks queued for another) would run them
    // in slot order, not in the order they were submitted.
    let p = pool(PoolConfig {
        workers: 1,
        slots: 4096,
        ..Default::default()
    });
    let mut last = None;
    for round in 0..300 {
        let inputs = vec![b"count".to_vec(); 3000];
        let mut ts = p.submit_batch(inputs.iter().map(|v| &v[..])).unwrap();
        let order: Vec<u64> = collect_all(&mut ts, GUARD)
            .unwrap()
            .iter()
            .map(|b| text(b).parse().unwrap())
            .collect();
        for (i, w) in order.windows(2).enumerate() {
            assert!(
                w[0] < w[1],
                "round {round}: task {} ran before task {i}",
                i + 1
            );
        }
        assert!(
            last < order.first().copied(),
            "round {round} ran before the last"
        );
        last = order.last().copied();
        // Idle long enough for the worker to sleep in slices before the next batch.
        std::thread::sleep(Duration::from_micros(1500 + 500 * (round % 5)));
    }
}

#[test]
fn racing_cancels_never_lose_or_double_run_a_task() {
    // Two workers claim while this thread cancels every other task as fast as it can: every
    // task ends exactly one way — it ran (its result is right) or it was cancelled.
    let p = pool(PoolConfig {
        workers: 2,
        slots: 8192,
        ..Default::default()
    });
    let mut should_run = 0u64;
    for round in 0..5 {
        let mut ts: Vec<_> = (0..2000)
            .map(|i| p.submit(format!("echo:{i}").as_bytes()).unwrap())
            .collect();
        let cancelled: Vec<bool> = ts
            .iter()
            .enumerate()
            .map(|(i, t)| i % 2 == 0 && t.cancel())
            .collect();
        should_run += cancelled.iter().filter(|c| !**c).count() as u64;
        for (i, t) in ts.iter_mut().enumerate() {
            match t.result(GUARD) {
                Ok(b) => {
                    assert!(
                        !cancelled[i],
                        "round {round}: task {i} was cancelled yet ran"
                    );
                    assert_eq!(text(&b), i.to_string());
                }
                Err(CollectError::Task(TaskError::Cancelled)) => {
                    assert!(cancelled[i], "round {round}: task {i}")
                }
                Err(e) => panic!("round {round}: task {i}: {e:?}"),
            }
        }
    }
    let ran: u64 = p.status().workers.iter().map(|w| w.tasks).sum();
    assert_eq!(
        ran, should_run,
        "the workers ran exactly the tasks that were not cancelled"
    );
}

#[test]
fn a_recycled_worker_leaves_after_its_task_and_is_replaced() {
    let p = pool(workers(1));
    let first = text(&p.submit(b"recycle").unwrap().result(GUARD).unwrap());
    let mut next = String::new();
    wait_until("a replacement worker", || {
        next = text(&p.submit(b"pid").unwrap().result(GUARD).unwrap());
        next != first
    });
    assert_eq!(p.status().respawns, 1);
    assert_eq!(p.deaths(), 0, "a recycled worker is not a death");
    assert_eq!(
        text(&p.submit(b"echo:on").unwrap().result(GUARD).unwrap()),
        "on"
    );
}

#[test]
fn results_and_payloads_written_in_place_travel_whole() {
    let p = pool(workers(1));
    for n in [0usize, 100, 5000, 3 << 20] {
        let b = p
            .submit(format!("reply:{n}").as_bytes())
            .unwrap()
            .result(GUARD)
            .unwrap();
        assert_eq!(b.len(), n);
        assert!(b.iter().all(|&x| x == 9));
    }
    // A payload that fills itself in place: the worker sees exactly its bytes.
    let big: Vec<u8> = b"input:"
        .iter()
        .copied()
        .chain(vec![1u8; 1 << 20])
        .collect();
    let mut t = p.submit_with(&big, None).unwrap();
    assert_eq!(text(&t.result(GUARD).unwrap()), big.len().to_string());
}

#[test]
fn a_partial_batch_returns_what_was_submitted_with_the_error() {
    let p = pool(PoolConfig {
        workers: 1,
        slots: 4,
        ..Default::default()
    });
    let payloads: Vec<Vec<u8>> = (0..10).map(|i| format!("echo:{i}").into_bytes()).collect();
    let (mut tasks, res) =
        p.submit_batch_with(payloads.iter().map(|v| v as &dyn mizu_pool::Fill), None);
    assert_eq!(tasks.len(), 4);
    assert!(matches!(res, Err(PoolError::SlotsExhausted(4))), "{res:?}");
    let got: Vec<String> = collect_all(&mut tasks, GUARD)
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(got, ["0", "1", "2", "3"]);
}
