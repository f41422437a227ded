//! Loom model of the parker handshake. Run with `cargo xtask loom`.
#![cfg(mizu_loom)]

use loom::sync::Arc;
use loom::thread;
use mizu_shm::sync::fence;
use mizu_shm::sync::{AtomicU32, Ordering, model};
use mizu_shm::{AimedPark, ParkWord};

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

/// Events 0 and 1 happen in turn, each followed by the waker's fence and an aimed wake; a
/// sleeper aiming at event 1 gets out (whether it parks before, between or after them), and the
/// wake for event 0 alone never had to wake it.
#[test]
fn aimed_park_no_lost_wakeup() {
    model("aimed park: no lost wake-up", None, || {
        let s = Arc::new((AimedPark::new(), AtomicU32::new(0), AtomicU32::new(0)));
        let s2 = s.clone();
        let waker = thread::spawn(move || {
            s2.1.store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            s2.0.wake_fenced(0, false);
            s2.2.store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            s2.0.wake_fenced(1, false);
        });
        let mut poll = || (s.2.load(Ordering::Acquire) == 1).then_some(());
        loop {
            s.0.aim(1);
            if s.0.word().park(&mut poll, None).is_some() {
                break;
            }
        }
        waker.join().unwrap();
    });
}

/// A forced wake (a failure, a death) reaches a sleeper that aims at another event.
#[test]
fn aimed_park_forced_wake() {
    model("aimed park: forced wake", None, || {
        let s = Arc::new((AimedPark::new(), AtomicU32::new(0)));
        let s2 = s.clone();
        let waker = thread::spawn(move || {
            s2.1.store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            s2.0.wake_fenced(5, true);
        });
        let mut poll = || (s.1.load(Ordering::Acquire) == 1).then_some(());
        loop {
            s.0.aim(9);
            if s.0.word().park(&mut poll, None).is_some() {
                break;
            }
        }
        waker.join().unwrap();
    });
}

/// The sleeper waits for event 0, then for event 1, re-aiming in between: whichever order the
/// two wakes and the two aims interleave in, it gets out of both waits.
#[test]
fn aimed_park_reaimed() {
    model("aimed park: re-aimed", Some(3), || {
        let s = Arc::new((AimedPark::new(), AtomicU32::new(0), AtomicU32::new(0)));
        let s2 = s.clone();
        let waker = thread::spawn(move || {
            s2.2.store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            s2.0.wake_fenced(1, false);
            s2.1.store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            s2.0.wake_fenced(0, false);
        });
        for (event, flag) in [(0u32, &s.1), (1, &s.2)] {
            let mut poll = || (flag.load(Ordering::Acquire) == 1).then_some(());
            loop {
                s.0.aim(event);
                if s.0.word().park(&mut poll, None).is_some() {
                    break;
                }
            }
        }
        waker.join().unwrap();
    });
}
