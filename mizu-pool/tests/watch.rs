//! A caller waiting for a running task watches for its outcome (polls without sleeping) while
//! a CPU is free for it, and sleeps otherwise: when every CPU runs a worker, or the worker it
//! waits for is queued behind it. Alone in its test binary: one thread per process
//! watches at a time, and the tests of `pool.rs` run in parallel.

use std::time::{Duration, Instant};

use mizu_pool::Pool;
use rustix::process::Pid;
use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

mod common;
use common::ready_pool as pool;

const GUARD: Option<Duration> = Some(Duration::from_secs(120));

fn run(p: &Pool, cmd: &str) {
    let mut t = p.submit(cmd.as_bytes()).unwrap();
    t.result(GUARD).unwrap();
}

fn waits(p: &Pool) -> (u64, u64) {
    let s = p.status();
    (s.watched, s.parks)
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Restricts this thread (None) or process `pid` to `cpus`.
fn pin(pid: Option<u32>, cpus: &CpuSet) {
    let pid = pid.map(|p| Pid::from_raw(p as i32).unwrap());
    sched_setaffinity(pid, cpus).unwrap();
}

/// The CPUs this thread may run on, and the first two of them as sets of one.
fn two_cpus() -> (CpuSet, CpuSet, CpuSet) {
    let all = sched_getaffinity(None).unwrap();
    let mut ones = (0..CpuSet::MAX_CPU).filter(|&c| all.is_set(c)).map(|c| {
        let mut one = CpuSet::new();
        one.set(c);
        one
    });
    let a = ones.next().unwrap();
    let b = ones.next().unwrap();
    (all, a, b)
}

#[test]
fn a_caller_watches_while_a_cpu_is_free_and_sleeps_otherwise() {
    // One worker running a task leaves a CPU for the caller (on a machine with two or more).
    // Where the kernel puts them is its choice, and it can keep a caller and the worker it
    // wakes on one CPU, the worker queued behind the caller: then the caller rightly sleeps
    // (below). So the caller and the worker are held on CPUs of their own here.
    let p = pool(1);
    let worker = p.status().workers[0].pid;
    let two = (cpus() >= 2).then(two_cpus);
    if let Some((_, a, b)) = &two {
        pin(None, a);
        pin(Some(worker), b);
    }
    let (w0, _) = waits(&p);
    for _ in 0..10 {
        run(&p, "sleep:1");
    }
    let (w1, p1) = waits(&p);
    if two.is_some() {
        // A watch lasts 5 ms: only a machine stalled for longer makes one sleep.
        assert!(w1 - w0 >= 5, "watched {} of 10 waits", w1 - w0);
    } else {
        assert_eq!(w1, w0);
    }

    // A task that outlasts a whole watch: the next wait sleeps straight away ...
    run(&p, "sleep:30");
    let (w2, p2) = waits(&p);
    assert_eq!(w2, w1, "a 30 ms task is not seen while watching");
    assert!(p2 > p1, "the wait for it slept");
    run(&p, "sleep:1");
    let (w3, p3) = waits(&p);
    assert_eq!(
        w3, w2,
        "after a task outlasted a watch, the next wait sleeps"
    );
    assert!(p3 > p2);
    // ... and one that comes sooner than a watch lasts has the next ones watch again.
    for _ in 0..10 {
        run(&p, "sleep:1");
    }
    let (w4, p4) = waits(&p);
    if two.is_some() {
        assert!(w4 > w3, "short tasks are watched for again");
    }

    // The worker on the caller's CPU: woken for a task, it is queued behind the caller, which
    // sleeps at once to give it the CPU rather than watch there.
    if let Some((all, a, _)) = &two {
        pin(Some(worker), a);
        // Each task finds the worker asleep (its idle spin spent), so that the submit wakes it
        // and marks it busy: a worker still spinning is not marked, and could be caught by a
        // watch once it runs. (The first task after the move: a worker woken from sleep
        // records the CPU it runs on.)
        let settle = || std::thread::sleep(Duration::from_millis(5));
        settle();
        run(&p, "sleep:1");
        let (w5, p5) = waits(&p);
        for _ in 0..10 {
            settle();
            run(&p, "sleep:1");
        }
        let (w6, p6) = waits(&p);
        assert_eq!(w6, w5, "no watch with the worker queued behind the caller");
        assert!(p6 >= p5 + 10, "each wait slept: {} of 10", p6 - p5);
        assert!(p5 > p4);
        pin(Some(worker), all);
        pin(None, all);
    }
    drop(p);

    // Every CPU runs a worker: the caller sleeps.
    let n = cpus();
    let p = pool(n);
    let (w0, p0) = waits(&p);
    let first = p.submit(b"sleep:100").unwrap();
    let rest: Vec<_> = (1..n).map(|_| p.submit(b"sleep:1000").unwrap()).collect();
    let t0 = Instant::now();
    while p.status().workers.iter().filter(|w| w.busy).count() < n {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "hang guard: workers busy"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut first = first;
    first.result(GUARD).unwrap();
    let (w1, p1) = waits(&p);
    assert_eq!(w1, w0, "no watch while every CPU runs a worker");
    assert!(p1 > p0);
    for mut t in rest {
        t.result(GUARD).unwrap();
    }
}
