//! Values a small `/dev/shm` has no room for spill to files in the spill directory, both ways
//! between a pool's owner and its workers; `kill -9` of the owner leaves nothing there once the
//! workers notice. In a test binary of its own: the spill directory is read from the
//! environment once per process.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{WORKER, alive, shm_entries_of};

/// Bytes the `mizu_*` objects in `/dev/shm` hold now.
fn mizu_bytes() -> u64 {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("mizu_"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

fn files(dir: &PathBuf) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect()
}

#[test]
fn a_killed_owner_leaves_nothing_in_the_spill_directory() {
    let dir = PathBuf::from(format!("/tmp/mizu-pool-spill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The controller and its workers see a /dev/shm with 24 MiB left: 32 MB each way spills.
    let limit = mizu_bytes() + (24 << 20);
    let mut ctl = Command::new(WORKER)
        .args(["--controller", "32000000"])
        .env("MIZU_SPILL_DIR", &dir)
        .env("MIZU_SHM_BYTES", limit.to_string())
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
    assert_eq!(pids.len(), 2, "controller said {line:?}");
    let spilled = files(&dir);
    assert!(
        spilled.len() >= 2 && spilled.iter().all(|n| n.ends_with('s')),
        "the task and its result spilled: {spilled:?}"
    );
    let ctl_pid = ctl.id();
    ctl.kill().unwrap(); // SIGKILL
    ctl.wait().unwrap();
    // The workers notice, leave, and remove what the owner left (a hang guard, not a bound).
    let deadline = Instant::now() + Duration::from_secs(60);
    while (pids.iter().any(|&p| alive(p)) || !files(&dir).is_empty()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(pids.iter().all(|&p| !alive(p)), "the workers left");
    assert_eq!(files(&dir), Vec::<String>::new(), "nothing left");
    let ours = [ctl_pid, pids[0], pids[1]];
    let deadline = Instant::now() + Duration::from_secs(60);
    while !shm_entries_of(&ours).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        shm_entries_of(&ours),
        Vec::<String>::new(),
        "nor in /dev/shm"
    );
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn an_unusable_spill_setting_is_named_when_dev_shm_is_full() {
    // A spill setting that is no directory turns spilling off; the full-/dev/shm error says
    // why values did not spill, and the owner leaves nothing behind.
    let limit = mizu_bytes() + (24 << 20);
    let ctl = Command::new(WORKER)
        .args(["--controller", "32000000"])
        .env("MIZU_SPILL_DIR", "not/absolute")
        .env("MIZU_SHM_BYTES", limit.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = ctl.id();
    let out = ctl.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("values cannot spill to files instead")
            && err.contains("not/absolute")
            && err.contains("not an absolute path to a directory"),
        "{err}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !shm_entries_of(&[pid]).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(shm_entries_of(&[pid]), Vec::<String>::new(), "nothing left");
}
