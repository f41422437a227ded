//! What the runtime owns so that no binding has to: a pool's and a task's place in the process
//! that made them (a forked child's copies), a complete stop, a channel peer's end, the store
//! of shared objects. Real processes throughout.

use std::ffi::c_int;
use std::time::Duration;

use mizu_pool::{Channel, PoolError};

mod common;
use common::{WORKER, ready_pool};

const GUARD: Option<Duration> = Some(Duration::from_secs(120));

unsafe extern "C" {
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn _exit(code: c_int) -> !;
}

/// Runs `child` in a forked child of this process; its exit code.
fn in_forked_child(child: impl FnOnce() -> c_int) -> c_int {
    // SAFETY: the child runs `child` and leaves with `_exit`, never returning into the test
    // harness (whose other threads do not exist in the child); glibc makes malloc usable in
    // a child of a threaded parent.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(99);
        // SAFETY: ends the child at once, without running the parent's exit handlers.
        unsafe { _exit(code) };
    }
    let mut status: c_int = 0;
    // SAFETY: `pid` is our child; `status` is a live out-parameter.
    let got = unsafe { waitpid(pid, &mut status, 0) };
    assert_eq!(got, pid);
    assert_eq!(
        status & 0x7f,
        0,
        "the child died of signal {}",
        status & 0x7f
    );
    (status >> 8) & 0xff
}

#[test]
fn a_forked_childs_copies_refuse_use_and_touch_nothing_of_the_parents() {
    let mut pool = ready_pool(2);
    let mut first = pool.submit(b"echo:before").unwrap();
    let pending = pool.submit(b"sleep:300").unwrap();
    let (pool_ref, pending_ref) = (&pool, &pending);
    let code = in_forked_child(|| {
        // SAFETY: the child's own copies of the parent's values, taken out once; the child
        // leaves with `_exit` and never uses or drops the originals.
        let (mut pool, pending) =
            unsafe { (std::ptr::read(pool_ref), std::ptr::read(pending_ref)) };
        let refused = matches!(pool.submit(b"echo:x"), Err(PoolError::Forked))
            && matches!(pool.check_origin(), Err(PoolError::Forked));
        // Dropped here, the copies would stop the parent's workers and free its slots.
        drop(pending);
        pool.stop(Duration::ZERO);
        drop(pool);
        if refused { 0 } else { 1 }
    });
    drop(pending);
    assert_eq!(
        code, 0,
        "the child's use was refused with PoolError::Forked"
    );
    assert_eq!(first.result(GUARD).unwrap().as_slice(), b"before");
    let mut again = pool.submit(b"echo:after").unwrap();
    assert_eq!(
        again.result(GUARD).unwrap().as_slice(),
        b"after",
        "the parent's pool still works after the child dropped its copies"
    );
    assert_eq!(pool.deaths(), 0);
    pool.stop(Duration::from_secs(5));
}

/// The mizu segments of `pids` this process still maps.
fn mapped_segments_of(pids: &[u32]) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| pids.iter().any(|p| l.contains(&format!("/mizu_{p:x}_"))))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_stopped_pool_leaves_no_mapping_of_its_workers_segments() {
    let mut pool = ready_pool(2);
    let workers = pool.launched_pids();
    // Results larger than a task slot live in the workers' data segments and are read in
    // place; once dropped, this process keeps those segments mapped only for reuse.
    for _ in 0..4 {
        let r = pool.submit(b"big:1000000").unwrap().result(GUARD).unwrap();
        assert_eq!(r.len(), 1_000_000);
    }
    assert!(
        !mapped_segments_of(&workers).is_empty(),
        "the results came through the workers' data segments"
    );
    pool.stop(Duration::from_secs(5));
    assert_eq!(
        mapped_segments_of(&workers),
        Vec::<String>::new(),
        "after a stop nothing of the workers' keeps memory of /dev/shm alive here"
    );
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn finishing_a_channel_returns_the_peers_exit_code_or_ends_a_peer_that_stays() {
    let mut ch = Channel::launch(
        WORKER,
        ["--channel-close"],
        64,
        256,
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(ch.recv(GUARD).unwrap().as_slice(), b"bye");
    assert_eq!(ch.finish(Duration::from_secs(120)), Some(0));
    assert!(!ch.has_pending());

    let mut ch =
        Channel::launch(WORKER, ["--channel-hold"], 64, 256, Duration::from_secs(60)).unwrap();
    let pid = ch.child().unwrap().id();
    assert_eq!(ch.recv(GUARD).unwrap().as_slice(), b"hello");
    assert_eq!(
        ch.finish(Duration::from_millis(100)),
        None,
        "a peer that does not exit is killed"
    );
    assert!(!alive(pid), "and reaped");
    let leftovers: Vec<String> = mizu_pool::machine::shm_names()
        .into_iter()
        .filter(|n| n.contains(&format!("_{pid:x}_")))
        .collect();
    assert_eq!(
        leftovers,
        Vec::<String>::new(),
        "what the peer left is removed"
    );
}

#[test]
fn the_share_store_holds_a_copy_until_release_removes_its_names() {
    let src: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let region = mizu_pool::share::copy(&src).unwrap();
    assert_eq!(region.bytes(), &src[..]);
    let name = region.segment().name().to_string();
    let listed = |n: &str| {
        mizu_pool::machine::shm_names()
            .iter()
            .any(|x| n.ends_with(x.as_str()))
    };
    assert!(listed(&name), "{name} is in /dev/shm while shared");
    mizu_pool::share::release();
    assert!(!listed(&name), "release removes the store's names");
    assert_eq!(region.bytes(), &src[..], "views already made still read it");
}
