//! Which worker a sequential stream of round trips lands on. Alone in its test binary: the
//! tests of `pool.rs` run in parallel, and their pools would compete for the two CPUs this
//! is measured on (a worker preempted mid-stream is not the policy under test).

use std::time::Duration;

mod common;

const GUARD: Option<Duration> = Some(Duration::from_secs(120));

#[test]
fn sequential_round_trips_keep_to_the_worker_that_ran_the_last_task() {
    // The other worker sleeps: handing every other task to it (waking it each time, while the
    // first one cooled down and parked in turn) made a round trip with two workers ~40x slower
    // than with one, with a park for three tasks in four. Which worker runs a task may change
    // (a sleeping worker that wakes for its housekeeping may take over the spinning), but a
    // round trip must not need a worker to be woken.
    let p = common::ready_pool(2);
    let before: Vec<(u64, u64)> = p
        .status()
        .workers
        .iter()
        .map(|w| (w.tasks, w.parks))
        .collect();
    let n = 2000;
    for i in 0..n {
        let mut t = p.submit(format!("echo:{i}").as_bytes()).unwrap();
        assert_eq!(
            t.result(GUARD).unwrap().as_slice(),
            i.to_string().as_bytes()
        );
    }
    let after = p.status().workers;
    let ran: Vec<u64> = after
        .iter()
        .zip(&before)
        .map(|(w, b)| w.tasks - b.0)
        .collect();
    let parks: u64 = after.iter().zip(&before).map(|(w, b)| w.parks - b.1).sum();
    assert_eq!(ran.iter().sum::<u64>(), n);
    assert!(
        parks < n / 4,
        "{parks} parks in {n} round trips (tasks per worker: {ran:?})"
    );
}
