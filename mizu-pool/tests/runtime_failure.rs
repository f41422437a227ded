//! The runtime's own failure — a worker that cannot store a result (no room in `/dev/shm`) —
//! reaches the collector as `TaskError::Runtime` with its text, not as an executor's error
//! payload (a binding used to decode the text as a payload: R said "unknown tag 0x6d").
//! Alone in its binary: its pool keeps its shared memory in a directory of its own (set for
//! this process before it touches shared memory, and for the workers through their
//! environment), so that the room its workers are left counts only this test's segments,
//! whatever other programs using mizu do meanwhile.

mod common;

use mizu_pool::{CollectError, Launcher, Pool, PoolConfig, TaskError};

#[test]
fn a_result_that_cannot_be_stored_is_a_runtime_failure_with_its_text() {
    let dir = common::OwnShmDir::new("mizu-runtime-failure");
    mizu_shm::place::configure(mizu_shm::place::Place::new(&dir.0, "mizu_").unwrap()).unwrap();
    // The workers (not this process) see a /dev/shm with 4 MiB left beyond what this test
    // holds now, less their own start-up segments (set through `env`, read once by each
    // worker): an 8 MB result cannot fit.
    let limit = dir.bytes() + (4 << 20);
    let pool = Pool::new(
        PoolConfig {
            workers: 1,
            ..Default::default()
        },
        Launcher::new(
            "env",
            vec![
                format!("MIZU_SHM_DIR={}", dir.0.display()),
                format!("MIZU_SHM_BYTES={limit}"),
                // What this test is about: no room anywhere (no spill directory).
                "MIZU_SPILL_DIR=none".to_owned(),
                common::WORKER.to_owned(),
            ],
        ),
    )
    .unwrap();
    assert!(
        dir.bytes() + (1 << 20) <= limit,
        "the start-up used the room"
    );
    let r = pool.submit(b"big:8000000").unwrap().result(None);
    match r {
        Err(CollectError::Task(TaskError::Runtime(m))) => {
            assert!(
                m.contains("cannot store the result") && m.contains("no room in /dev/shm"),
                "{m}"
            );
        }
        Err(CollectError::Task(TaskError::Failed(b))) => panic!(
            "an executor's error payload, not a runtime failure: {:?}",
            String::from_utf8_lossy(&b)
        ),
        other => panic!("expected a runtime failure, got {other:?}"),
    }
    // The worker goes on serving.
    let ok = pool.submit(b"echo:still").unwrap().result(None).unwrap();
    assert_eq!(ok.as_slice(), b"still");
    drop(pool);
    assert_eq!(
        dir.bytes(),
        0,
        "the stopped pool left nothing in its directory"
    );
}
