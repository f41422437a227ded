//! One worker per slot: two processes launched for the same slot at once (a launcher that
//! starts the worker twice) race to join it; exactly one wins, the other gets an error and
//! leaves, and the pool serves through the winner.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
use common::WORKER;

/// The exit status and error text of the joiner `name`, once it has left. (`echo $? >file`
/// creates the file before it writes the status: a status is there once its line ends.)
fn left(dir: &Path, name: &str) -> Option<(String, String)> {
    let rc = std::fs::read_to_string(dir.join(format!("{name}.rc"))).ok()?;
    if !rc.ends_with('\n') {
        return None;
    }
    let err = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
    Some((rc.trim().to_owned(), err))
}

#[test]
fn two_joiners_of_one_slot_one_wins_the_other_is_told() {
    let dir = PathBuf::from(format!("/tmp/mizu-join-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // `$0` is the worker, `$1 $2` the token and slot the pool appends. Both wait at a gate
    // (a FIFO) and are let through together, to join at the same moment.
    let script = format!(
        r#"mkfifo {d}/gate
for j in a b; do (MIZU_TEST_JOIN_GATE={d}/gate "$0" "$1" "$2" 2>{d}/$j.err; echo $? >{d}/$j.rc) & done
sleep 0.3; : >{d}/gate; wait"#,
        d = dir.display()
    );
    let mut pool = mizu_pool::Pool::new(
        mizu_pool::PoolConfig {
            workers: 1,
            ..Default::default()
        },
        mizu_pool::Launcher::new("/bin/sh", ["-c", script.as_str(), WORKER]),
    )
    .unwrap();
    // The loser leaves at once (a hang guard, not a bound: both serving never ends).
    let deadline = Instant::now() + Duration::from_secs(60);
    let lost = loop {
        if let Some(l) = left(&dir, "a").or_else(|| left(&dir, "b")) {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "hang guard: neither joiner was refused"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(lost.0, "1", "the loser failed: {lost:?}");
    assert!(lost.1.contains("is not waiting for a worker"), "{lost:?}");
    for i in 0..50 {
        let mut t = pool.submit(format!("echo:{i}").as_bytes()).unwrap();
        assert_eq!(
            t.result(Some(Duration::from_secs(60))).unwrap().as_slice(),
            i.to_string().as_bytes()
        );
    }
    let winner = &pool.status().workers[0];
    assert_eq!(winner.state, "ready");
    assert!(winner.tasks >= 50);
    pool.stop(Duration::from_secs(10));
    std::fs::remove_dir_all(&dir).unwrap();
}
