//! Pruning at pool start, in a test binary of its own: every `Pool::new` prunes, so a pool
//! created by a test running in parallel could remove the killed pool's segments before this
//! test looks at them.

use std::process::Command;

mod common;
use common::{shm_entries_of, start_controller, test_pool};

#[test]
fn a_new_pool_removes_what_a_pool_killed_whole_left() {
    let (mut ctl, _token, pids) = start_controller();
    let ctl_pid = ctl.id();
    let signal = |sig: &str, pid: u32| {
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    // Stopped, the controller cannot replace its workers; killed afterwards, it leaves nobody
    // to clean up (no worker survives to notice).
    signal("-STOP", ctl_pid);
    for &p in &pids {
        signal("-KILL", p);
    }
    signal("-KILL", ctl_pid);
    ctl.wait().unwrap();
    let ours = [ctl_pid, pids[0], pids[1]];
    assert!(
        !shm_entries_of(&ours).is_empty(),
        "the killed pool left its segments"
    );
    let p = test_pool(1);
    assert_eq!(
        shm_entries_of(&ours),
        Vec::<String>::new(),
        "the new pool pruned them"
    );
    drop(p);
}
