//! The discard hook: a payload nobody reads is shown to the binding once, before it is
//! dropped (so references written inside it can be given back), and a payload that was read
//! is never shown. Its own test binary: the hook is per process.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use mizu_pool::{CollectError, TaskError};
use mizu_queue::SlotState;

mod common;
use common::test_pool;

const GUARD: Option<Duration> = Some(Duration::from_secs(120));

static SEEN: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

fn hook(b: &[u8]) {
    SEEN.lock().unwrap().push(b.to_vec());
}

fn seen(p: &[u8]) -> usize {
    SEEN.lock()
        .unwrap()
        .iter()
        .filter(|s| s.as_slice() == p)
        .count()
}

#[test]
fn discarded_payloads_are_shown_to_the_hook_once_and_read_ones_never() {
    assert!(mizu_pool::set_discard_hook(hook));
    assert!(!mizu_pool::set_discard_hook(hook), "the first hook stays");
    let p = test_pool(1);
    let small = b"echo:cancelled".to_vec(); // inline in its slot
    let big = [b"echo:".as_slice(), &[b'x'; 1000]].concat(); // in a data region
    let kept = b"echo:kept".to_vec();
    let mut k = p.submit(&kept).unwrap();
    assert_eq!(k.result(GUARD).unwrap().as_slice(), b"kept");
    let mut busy = p.submit(b"sleep:300").unwrap();
    let t0 = Instant::now();
    while busy.state() != Some(SlotState::Running) {
        assert!(t0.elapsed() < Duration::from_secs(120), "hang guard");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut a = p.submit(&small).unwrap();
    let mut b = p.submit(&big).unwrap();
    assert!(a.cancel() && b.cancel());
    for t in [&mut a, &mut b] {
        assert_eq!(
            t.result(GUARD),
            Err(CollectError::Task(TaskError::Cancelled))
        );
    }
    assert_eq!(busy.result(GUARD).unwrap().as_slice(), b"slept");
    assert_eq!(seen(&small), 1);
    assert_eq!(seen(&big), 1);
    // Read payloads (the worker took `kept`, we took its result) are never shown.
    assert_eq!(seen(&kept), 0);
    assert_eq!(seen(b"kept"), 0);
    assert_eq!(seen(b"slept"), 0);
}
