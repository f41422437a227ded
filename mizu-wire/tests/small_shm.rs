//! A small `/dev/shm` (a container's default is 64 MiB), emulated with `MIZU_SHM_BYTES`: data
//! segments scale down with it, an allocation that finds it full gets the room this process
//! and others keep only for reuse, and one that cannot fit fails clearly. One test in its own
//! binary: the limit is read once per process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use mizu_wire::DataPool;
use mizu_wire::store::ROOM_WAIT;

const PEER: &str = env!("CARGO_BIN_EXE_mizu-wire-peer");
const MIB: u64 = 1 << 20;

/// Bytes the `mizu_*` objects in /dev/shm hold now (the limit counts them all).
fn mizu_bytes() -> u64 {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("mizu_"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

fn size_of(name: &str) -> Option<u64> {
    std::fs::metadata(format!("/dev/shm/{}", name.trim_start_matches('/')))
        .ok()
        .map(|m| m.len())
}

#[test]
fn a_small_dev_shm_is_shared_out_and_a_full_one_fails_clearly() {
    let limit = mizu_bytes() + 48 * MIB;
    // SAFETY: the only test of this binary sets them before anything reads the environment.
    // (Spilling off: this is about making room in /dev/shm, and failing when there is none.)
    unsafe {
        std::env::set_var("MIZU_SHM_BYTES", limit.to_string());
        std::env::set_var("MIZU_SPILL_DIR", "none");
    }

    // Segments scale with /dev/shm: a 16 MiB pool segment would be a third of it.
    let pool = DataPool::new(16 * MIB);
    pool.set_idle_release(std::time::Duration::from_secs(3600));
    let small = pool.store(&[1u8; 1000]).unwrap();
    let seg = size_of(small.segment().name().as_str()).unwrap();
    assert!(seg <= limit / 32 + MIB / 8, "segment of {seg} bytes");

    // Another process keeps 20 MiB idle for reuse (its janitor would keep them 2 s).
    let mut peer = Command::new(PEER)
        .args(["keep-idle", &(20 * MIB).to_string()])
        .env("MIZU_SHM_BYTES", limit.to_string())
        .env("MIZU_SPILL_DIR", "none")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(peer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let theirs = line.trim().to_owned();
    assert!(size_of(&theirs).is_some_and(|s| s >= 20 * MIB));

    // Ours: 16 MiB held, then 20 more: only the other process's idle segment makes room.
    let a = pool.store(&vec![2u8; (16 * MIB) as usize]).unwrap();
    let b = pool.store(&vec![3u8; (20 * MIB) as usize]).unwrap();
    assert!(b.bytes().iter().all(|&x| x == 3));
    assert_eq!(
        size_of(&theirs),
        None,
        "the idle segment of the other process went"
    );

    // Our own 16 MiB, let go and kept idle for reuse, make room for 24 more.
    drop(a);
    let c = pool.store(&vec![4u8; (24 * MIB) as usize]).unwrap();
    assert!(c.bytes().iter().all(|&x| x == 4));

    // What cannot fit fails after the wait for room, saying what to do.
    let t0 = Instant::now();
    let Err(e) = pool.alloc((40 * MIB) as usize) else {
        panic!("40 MiB fitted in what was left of 48");
    };
    assert!(e.is_no_space(), "{e}");
    assert!(t0.elapsed() >= ROOM_WAIT);
    let msg = e.to_string();
    assert!(
        msg.contains("no room in /dev/shm") && msg.contains("--shm-size"),
        "{msg}"
    );
    // ...and the pool goes on working.
    assert_eq!(pool.store(b"still").unwrap().bytes(), b"still");

    drop(peer.stdin.take());
    assert!(peer.wait().unwrap().success());
    drop((small, b, c));
}
