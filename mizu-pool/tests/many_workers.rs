//! A pool with worker slots for a machine of many CPUs — the most a pool can have — in a
//! container's 64 MiB `/dev/shm`, with room for values beside it: the segment's parts grow
//! at most linearly with the workers (`geometry.rs`), where the ring matrix once grew with
//! their square (a pool of 256 worker slots needed 124 MB). Alone in its binary: its pool
//! keeps its shared memory in a directory of its own, and the limit is set for this process
//! (read once) and, through the environment, for its workers.

mod common;

use mizu_pool::{Launcher, Pool, PoolConfig};

#[test]
fn a_pool_for_the_most_cpus_fits_a_64_mib_dev_shm_with_room_for_values() {
    let dir = common::OwnShmDir::new("mizu-many-workers");
    // SAFETY: the only test of this binary sets them before anything reads the environment.
    unsafe {
        std::env::set_var("MIZU_SHM_BYTES", (64u64 << 20).to_string());
        // What this test is about: /dev/shm alone (no spill directory to fall back on).
        std::env::set_var("MIZU_SPILL_DIR", "none");
    }
    mizu_shm::place::configure(mizu_shm::place::Place::new(&dir.0, "mizu_").unwrap()).unwrap();
    let pool = Pool::new(
        PoolConfig {
            workers: 2,
            max_workers: mizu_pool::MAX_WORKERS,
            slots: 4096,
            ..Default::default()
        },
        Launcher::new(
            "env",
            vec![
                format!("MIZU_SHM_DIR={}", dir.0.display()),
                common::WORKER.to_owned(),
            ],
        ),
    )
    .expect("a pool for the most CPUs fits a 64 MiB /dev/shm");
    let mut input = b"sum:".to_vec();
    input.extend(std::iter::repeat_n(1u8, 16 << 20));
    let out = pool.submit(&input).unwrap().result(None).unwrap();
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        (16u64 << 20).to_string(),
        "a 16 MiB value travels beside it"
    );
    // Nested tasks, as many in flight as a worker's record has slots at this size (the test
    // worker submits them all before collecting; the bindings wait for room), and a nested
    // map.
    let out = pool.submit(b"nested:16").unwrap().result(None).unwrap();
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        (0..16u64).sum::<u64>().to_string()
    );
    let out = pool
        .submit(b"nestedmap:1000")
        .unwrap()
        .result(None)
        .unwrap();
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        (0..1000u64).sum::<u64>().to_string()
    );
    drop(pool);
    assert_eq!(
        dir.bytes(),
        0,
        "the stopped pool left nothing in its directory"
    );
}
