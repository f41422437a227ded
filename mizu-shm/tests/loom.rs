//! Loom model of the parker handshake. Run with `cargo xtask loom`.
#![cfg(mizu_loom)]

use loom::sync::Arc;
use loom::thread;
use mizu_shm::ParkWord;
use mizu_shm::sync::{AtomicU32, Ordering, model};

/// A waiter that parks until a flag is set never sleeps through the waker's wake_all: if the
/// handshake lost a wake-up, the loom futex emulation would block forever (a loom deadlock).
#[test]
fn parker_no_lost_wakeup() {
    model("parker: no lost wake-up", None, || {
        let s = Arc::new((ParkWord::new(), AtomicU32::new(0)));
        let s2 = s.clone();
        let waker = thread::spawn(move || {
            s2.1.store(1, Ordering::Release);
            s2.0.wake_all();
        });
        let mut poll = || (s.1.load(Ordering::Acquire) == 1).then_some(());
        while s.0.park(&mut poll, None).is_none() {}
        waker.join().unwrap();
    });
}

/// Two waiters, one waker: both get out.
#[test]
fn parker_wakes_every_sleeper() {
    model("parker: every sleeper woken", Some(3), || {
        let s = Arc::new((ParkWord::new(), AtomicU32::new(0)));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || {
                    let mut poll = || (s.1.load(Ordering::Acquire) == 1).then_some(());
                    while s.0.park(&mut poll, None).is_none() {}
                })
            })
            .collect();
        s.1.store(1, Ordering::Release);
        s.0.wake_all();
        for w in waiters {
            w.join().unwrap();
        }
    });
}
