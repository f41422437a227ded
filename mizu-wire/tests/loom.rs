//! Loom models of the atomic protocols of data segments (`refs.rs`) and ledgers
//! (`ledger_entry.rs`). Run with `cargo xtask loom`.
//!
//! A segment here is its control line, one region header and one payload word on the heap;
//! the payload is a loom `UnsafeCell`, so a read or write not ordered after another
//! process's access (a reader still reading when the owner reuses the space) fails the model.
#![cfg(mizu_loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use mizu_shm::sync::model;
use mizu_wire::ledger_entry::{Entry, Header};
use mizu_wire::refs::{Control, RegionHeader};

const LEN: u64 = 8;
const NAME: &str = "/mizu_1_2_3_DAT1";

struct Seg {
    ctl: Control,
    h: RegionHeader,
    payload: UnsafeCell<u64>,
    /// Regions the segment counted gone.
    gone: AtomicUsize,
    /// Times a side decided to remove the segment's name.
    unlinks: AtomicUsize,
}

impl Seg {
    /// A segment whose owner published one region holding `value`, with `refs` references.
    fn new(value: u64, refs: u32) -> (Seg, u64) {
        let s = Seg {
            ctl: Control::default(),
            h: RegionHeader::default(),
            payload: UnsafeCell::new(0),
            gone: AtomicUsize::new(0),
            unlinks: AtomicUsize::new(0),
        };
        s.ctl.attach_owner();
        let g = s.allocate(value);
        for _ in 1..refs {
            s.h.add_ref();
        }
        (s, g)
    }

    /// The owner's allocation at the start of a new lap: fill, then publish.
    fn allocate(&self, value: u64) -> u64 {
        let g = self.ctl.new_lap();
        self.payload.with_mut(|p| {
            // SAFETY: a valid pointer from loom; that nobody else touches the payload now is
            // what the model checks (the owner writes only space no live region covers).
            unsafe { *p = value }
        });
        self.h.publish(LEN, g);
        self.ctl.region_added();
        g
    }

    /// The owner reuses the space if no region is live (as `DataPool::alloc` does).
    fn reuse_if_free(&self, value: u64) -> Option<u64> {
        (self.ctl.live() == 0).then(|| self.allocate(value))
    }

    fn release(&self) {
        if self.h.release() {
            self.region_gone();
        }
    }

    fn region_gone(&self) {
        self.gone.fetch_add(1, Ordering::Relaxed);
        if self.ctl.region_gone() {
            assert_eq!(self.ctl.live(), 0);
            self.unlinks.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn read(&self) -> u64 {
        self.payload.with(|p| {
            // SAFETY: a valid pointer from loom; that no write races this read (made under a
            // counted reference) is what the model checks.
            unsafe { *p }
        })
    }
}

/// A receiver reads the region under the reference it adopted and releases it while the
/// owner drops its own and reuses the space as soon as nothing is live: the reads always
/// happen before the reuse, and the segment counts the region gone once.
#[test]
fn the_owner_reuses_space_only_after_the_readers_are_done() {
    model(
        "the owner reuses space only after the readers are done",
        Some(3),
        || {
            let (s, g) = Seg::new(7, 2);
            let s = Arc::new(s);
            let s2 = s.clone();
            let reader = thread::spawn(move || {
                // Adopting checks the descriptor against the header: the reference counted for
                // it keeps the region.
                assert!(s2.h.matches(LEN, g) && s2.h.refs() > 0);
                assert_eq!(s2.read(), 7);
                s2.release();
            });
            s.release();
            let reused = s.reuse_if_free(9);
            reader.join().unwrap();
            assert_eq!(s.gone.load(Ordering::Relaxed), 1);
            match reused {
                Some(g2) => {
                    assert!(g2 > g && s.h.matches(LEN, g2) && !s.h.matches(LEN, g));
                    assert_eq!((s.h.refs(), s.ctl.live(), s.read()), (1, 1, 9));
                }
                None => assert_eq!((s.h.refs(), s.ctl.live()), (0, 0)),
            }
        },
    );
}

/// A reaper of a dead holder's ledger (`ledger::release_dead`): claims it, then gives back
/// the entry's reference if nobody did. Returns (claimed, references given back).
fn reap(s: &Seg, ledger: &Header, e: &Entry, g: u64) -> (usize, usize) {
    if !ledger.claim() {
        return (0, 0);
    }
    if !e.take() {
        return (1, 0);
    }
    let l = e.listed();
    assert_eq!(
        (l.name.as_deref(), l.offset, l.generation),
        (Some(NAME), 64, g)
    );
    match s.h.release_on_behalf(l.generation) {
        Some(last) => {
            if last {
                s.region_gone();
            }
            (1, 1)
        }
        None => (1, 0),
    }
}

/// A holder records the reference it adopted in its ledger and later gives it back, while a
/// reaper (which, for a killed holder, runs between any two of its steps) gives back what the
/// ledger lists: the reference is given back exactly once, and the reaper reads the entry
/// the holder wrote.
#[test]
fn a_holder_and_a_reaper_give_a_reference_back_once() {
    model(
        "a holder and a reaper give a reference back once",
        Some(3),
        || {
            let (s, g) = Seg::new(7, 2);
            let s = Arc::new(s);
            let (ledger, entry) = (Arc::new(Header::default()), Arc::new(Entry::default()));
            let given = Arc::new(AtomicUsize::new(0));
            let (s2, e2, given2) = (s.clone(), entry.clone(), given.clone());
            let holder = thread::spawn(move || {
                e2.set(NAME, 64, g);
                if e2.take() {
                    given2.fetch_add(1, Ordering::Relaxed);
                    s2.release();
                }
            });
            let (s3, e3, given3) = (s.clone(), entry.clone(), given.clone());
            let reaper = thread::spawn(move || {
                let (_, n) = reap(&s3, &ledger, &e3, g);
                given3.fetch_add(n, Ordering::Relaxed);
            });
            s.release(); // the sender's reference
            holder.join().unwrap();
            reaper.join().unwrap();
            assert_eq!(given.load(Ordering::Relaxed), 1);
            assert_eq!((s.h.refs(), s.ctl.live()), (0, 0));
            assert_eq!(s.gone.load(Ordering::Relaxed), 1);
        },
    );
}

/// Two reapers find the same dead holder's ledger: exactly one claims it (and walks and
/// removes it) and the reference goes back once.
#[test]
fn two_reapers_give_a_dead_holders_reference_back_once() {
    model(
        "two reapers give a dead holders reference back once",
        Some(3),
        || {
            let (s, g) = Seg::new(7, 2);
            let s = Arc::new(s);
            let (ledger, entry) = (Arc::new(Header::default()), Arc::new(Entry::default()));
            entry.set(NAME, 64, g);
            let spawn = |s: Arc<Seg>, ledger: Arc<Header>, e: Arc<Entry>| {
                thread::spawn(move || reap(&s, &ledger, &e, g))
            };
            let a = spawn(s.clone(), ledger.clone(), entry.clone());
            let b = spawn(s.clone(), ledger, entry);
            let (a, b) = (a.join().unwrap(), b.join().unwrap());
            assert_eq!(
                (a.0 + b.0, a.1 + b.1),
                (1, 1),
                "one claim, one reference given back"
            );
            assert_eq!((s.h.refs(), s.ctl.live()), (1, 1));
            s.release();
            assert_eq!(s.gone.load(Ordering::Relaxed), 1);
        },
    );
}

/// The owner detaches while the last reader releases: whichever comes last sees both, so the
/// segment's name is removed at least once — and never while a region is live.
#[test]
fn the_name_goes_once_the_owner_detached_and_the_last_region_is_released() {
    model(
        "the name goes once the owner detached and the last region is released",
        Some(3),
        || {
            let (s, _) = Seg::new(7, 2);
            let s = Arc::new(s);
            let s2 = s.clone();
            let reader = thread::spawn(move || s2.release());
            s.release();
            if s.ctl.detach_owner() {
                assert_eq!(s.ctl.live(), 0);
                s.unlinks.fetch_add(1, Ordering::Relaxed);
            }
            reader.join().unwrap();
            assert!(s.unlinks.load(Ordering::Relaxed) >= 1);
            assert_eq!(s.gone.load(Ordering::Relaxed), 1);
        },
    );
}
