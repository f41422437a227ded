//! What the tests share: pools of the test worker, and, for the tests that kill a controller,
//! a controller process (the test worker binary in `--controller` mode, with two workers) and
//! the look at what is left behind.
// Each test binary uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The test worker binary.
pub const WORKER: &str = env!("CARGO_BIN_EXE_mizu-pool-testworker");

/// A pool of `workers` test workers, otherwise configured by default.
pub fn test_pool(workers: usize) -> mizu_pool::Pool {
    mizu_pool::Pool::new(
        mizu_pool::PoolConfig {
            workers,
            ..Default::default()
        },
        mizu_pool::Launcher::new(WORKER, Vec::<String>::new()),
    )
    .unwrap()
}

/// [`test_pool`], once all its workers are ready (a test of what the workers do must not
/// count their start).
pub fn ready_pool(workers: usize) -> mizu_pool::Pool {
    let p = test_pool(workers);
    let t0 = std::time::Instant::now();
    while p
        .status()
        .workers
        .iter()
        .filter(|w| w.state == "ready")
        .count()
        < workers
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "hang guard: workers ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    p
}

/// A controller of a two-worker pool: the process, the pool's token and the workers' pids.
pub fn start_controller() -> (Child, String, Vec<u32>) {
    launch_controller(Command::new(WORKER).arg("--controller"))
}

/// [`start_controller`] with the caller's command (the test worker in `--controller` mode,
/// with its own arguments and environment), once the controller has said its pool is up.
pub fn launch_controller(cmd: &mut Command) -> (Child, String, Vec<u32>) {
    let mut ctl = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(ctl.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut it = line.split_whitespace();
    let token = it.next().unwrap().to_owned();
    let pids: Vec<u32> = it.map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "controller said {line:?}");
    (ctl, token, pids)
}

/// Whether process `pid` runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// The `/dev/shm` entries of the processes `pids` (mizu names start with the creator's pid).
pub fn shm_entries_of(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| pids.iter().any(|p| n.starts_with(&format!("mizu_{p:x}_"))))
        .collect()
}

/// A directory of a test's own on the shared-memory file system, for the processes it starts
/// (`MIZU_SHM_DIR`): what is in it is that test's alone, whatever other programs using mizu
/// do meanwhile. Removed when dropped.
pub struct OwnShmDir(pub std::path::PathBuf);

impl OwnShmDir {
    /// `/dev/shm/<name>-<this process's pid>`, made now.
    pub fn new(name: &str) -> Self {
        let dir = std::path::PathBuf::from(format!("/dev/shm/{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        OwnShmDir(dir)
    }

    /// The names of the `mizu_*` objects in it.
    pub fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("mizu_"))
            .collect()
    }

    /// Bytes its `mizu_*` objects hold.
    pub fn bytes(&self) -> u64 {
        self.entries()
            .iter()
            .filter_map(|n| std::fs::metadata(self.0.join(n)).ok())
            .map(|m| m.len())
            .sum()
    }
}

impl Drop for OwnShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
