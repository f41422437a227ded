//! The runtime's own failure — a worker that cannot store a result (no room in `/dev/shm`) —
//! reaches the collector as `TaskError::Runtime` with its text, not as an executor's error
//! payload (a binding used to decode the text as a payload: R said "unknown tag 0x6d").
//! Alone in its binary: it limits the workers' `/dev/shm` to what other tests' pools would
//! disturb.

mod common;

use mizu_pool::{CollectError, Launcher, Pool, PoolConfig, TaskError};

fn mizu_bytes() -> u64 {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("mizu_"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

#[test]
fn a_result_that_cannot_be_stored_is_a_runtime_failure_with_its_text() {
    // The workers (not this process) see a /dev/shm with 4 MiB left beyond what exists now,
    // less their own start-up segments (set through `env`, read once by each worker): an
    // 8 MB result cannot fit.
    let limit = mizu_bytes() + (4 << 20);
    let pool = Pool::new(
        PoolConfig {
            workers: 1,
            ..Default::default()
        },
        Launcher::new(
            "env",
            vec![format!("MIZU_SHM_BYTES={limit}"), common::WORKER.to_owned()],
        ),
    )
    .unwrap();
    assert!(
        mizu_bytes() + (1 << 20) <= limit,
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
}
