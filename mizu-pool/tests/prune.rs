//! Pruning at pool start, in a test binary of its own: every `Pool::new` prunes, so a pool
//! created by a test running in parallel could remove the killed pool's segments before this
//! test looks at them.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use mizu_pool::{Launcher, Pool, PoolConfig};

const WORKER: &str = env!("CARGO_BIN_EXE_mizu-pool-testworker");

#[test]
fn a_new_pool_removes_what_a_pool_killed_whole_left() {
    let mut ctl = Command::new(WORKER)
        .arg("--controller")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(ctl.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pids: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .map(|p| p.parse().unwrap())
        .collect();
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
    let left = || -> Vec<String> {
        std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| {
                [ctl_pid]
                    .iter()
                    .chain(&pids)
                    .any(|p| n.starts_with(&format!("mizu_{p:x}_")))
            })
            .collect()
    };
    assert!(!left().is_empty(), "the killed pool left its segments");
    let p = Pool::new(
        PoolConfig {
            workers: 1,
            ..Default::default()
        },
        Launcher::new(WORKER, Vec::<String>::new()),
    )
    .unwrap();
    assert_eq!(left(), Vec::<String>::new(), "the new pool pruned them");
    drop(p);
}
