//! Values a small `/dev/shm` has no room for spill to files in the spill directory, both ways
//! between a pool's owner and its workers; `kill -9` of the owner leaves nothing there once the
//! workers notice. In a test binary of its own: the spill directory is read from the
//! environment once per process.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{OwnShmDir, WORKER, alive, launch_controller};

fn files(dir: &PathBuf) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect()
}

/// The test worker as a controller sending and receiving `bytes` bytes, its shared memory in
/// `shm` and limited to 24 MiB beyond what is there now (so that 32 MB each way spills).
fn controller(shm: &OwnShmDir, bytes: &str) -> Command {
    let mut cmd = Command::new(WORKER);
    cmd.args(["--controller", bytes])
        .env("MIZU_SHM_DIR", &shm.0)
        .env("MIZU_SHM_BYTES", (shm.bytes() + (24 << 20)).to_string());
    cmd
}

#[test]
fn a_killed_owner_leaves_nothing_in_the_spill_directory() {
    let dir = PathBuf::from(format!("/tmp/mizu-pool-spill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shm = OwnShmDir::new("mizu-pool-spill");
    let (mut ctl, _token, pids) =
        launch_controller(controller(&shm, "32000000").env("MIZU_SPILL_DIR", &dir));
    let spilled = files(&dir);
    assert!(
        spilled.len() >= 2 && spilled.iter().all(|n| n.ends_with('s')),
        "the task and its result spilled: {spilled:?}"
    );
    ctl.kill().unwrap(); // SIGKILL
    ctl.wait().unwrap();
    // The workers notice, leave, and remove what the owner left (a hang guard, not a bound).
    let deadline = Instant::now() + Duration::from_secs(60);
    while (pids.iter().any(|&p| alive(p)) || !files(&dir).is_empty() || !shm.entries().is_empty())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(pids.iter().all(|&p| !alive(p)), "the workers left");
    assert_eq!(files(&dir), Vec::<String>::new(), "nothing left");
    assert_eq!(shm.entries(), Vec::<String>::new(), "nor in shared memory");
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn an_unusable_spill_setting_is_named_when_dev_shm_is_full() {
    // A spill setting that is no directory turns spilling off; the full-/dev/shm error says
    // why values did not spill, and the owner leaves nothing behind.
    let shm = OwnShmDir::new("mizu-pool-unspilled");
    let out = controller(&shm, "32000000")
        .env("MIZU_SPILL_DIR", "not/absolute")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("values cannot spill to files instead")
            && err.contains("not/absolute")
            && err.contains("not an absolute path to a directory"),
        "{err}"
    );
    // Its workers leave once their controller is gone (a hang guard, not a bound).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !shm.entries().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(shm.entries(), Vec::<String>::new(), "nothing left");
}
