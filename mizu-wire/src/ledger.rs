//! The region references a worker holds, written where a survivor can read them.
//!
//! A process killed while holding references (`kill -9`, a worker killed on an execution
//! timeout, a crash) never gives them back: the regions — and the owner's segments around
//! them, which are reused or given back only when no region of theirs is live — stay pinned
//! until the owner exits. A process that [`enable`]s its ledger (pool workers do) records
//! every reference it adopts in a segment of its own (kind `LDG1`); whoever reaps it once it
//! is dead ([`release_dead`]: the pool's monitor, `prune` callers) gives back what the ledger
//! still lists.
//!
//! Never twice: an entry is set after the reference is counted and cleared by whoever gives
//! the reference back — the holder dropping its region, [`close`] when the worker leaves, or
//! the reaper — with a compare-and-swap, and only the winner decrements. A holder killed
//! between two steps leaks one reference (as before there was a ledger), never frees one
//! twice. Two reapers claim the ledger with a compare-and-swap; one of them releases.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once, RwLock, TryLockError};

use mizu_shm::{CacheLine, Layout, Segment, SegmentName, ShmSafe};

use crate::ledger_entry::{Entry, Header};
use crate::store::segment::DataSegment;

/// Segment kind of a ledger.
pub const LEDGER_KIND: u32 = u32::from_le_bytes(*b"LDG1");
/// References a ledger can list (64 bytes each); more are held untracked. A worker holds one
/// per payload it keeps (a data frame's columns share their payload's).
const CAPACITY: usize = 4 * 1024;

// SAFETY: repr(C) atomics (plus an unused pad word); zero is valid.
unsafe impl ShmSafe for Header {}
// SAFETY: repr(C) atomics only; zero is "unused".
unsafe impl ShmSafe for Entry {}
const _: () = assert!(std::mem::size_of::<Entry>() == 64);

struct Ledger {
    seg: Segment,
    /// The recording process (a forked child inherits the mapping, not the references).
    pid: u32,
    free: Mutex<Vec<u32>>,
    /// Live [`Recording`] guards: the ledger closes when the last one drops.
    users: usize,
    /// Which ledger of this process this is: an entry of a closed one (given back then)
    /// must not touch a later one's.
    number: u32,
}

impl Ledger {
    fn create() -> Option<Ledger> {
        let mut l = Layout::new(LEDGER_KIND);
        l.add(std::mem::size_of::<CacheLine<Header>>() as u64, 128)
            .ok()?;
        l.add((CAPACITY * std::mem::size_of::<Entry>()) as u64, 64)
            .ok()?;
        let seg = Segment::create(&l, false).ok()?;
        Some(Ledger {
            seg,
            pid: mizu_shm::current_pid(),
            free: Mutex::new((0..CAPACITY as u32).rev().collect()),
            users: 0,
            number: NUMBER.fetch_add(1, Ordering::Relaxed),
        })
    }

    fn entries(&self) -> &[Entry] {
        entries(&self.seg).expect("created with this layout")
    }
}

fn entries(seg: &Segment) -> Option<&[Entry]> {
    let e = seg.extent(1).ok()?;
    let n = usize::try_from(e.len).ok()? / std::mem::size_of::<Entry>();
    seg.get_slice::<Entry>(e.offset, n).ok()
}

fn header(seg: &Segment) -> Option<&Header> {
    let e = seg.extent(0).ok()?;
    seg.get::<CacheLine<Header>>(e.offset).ok().map(|h| &h.0)
}

/// Ledgers this process has made (see `Ledger::number`).
static NUMBER: AtomicU32 = AtomicU32::new(0);

/// A reference's place in the ledger that recorded it: which ledger, which entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recorded {
    ledger: u32,
    index: u32,
}

/// This process's ledger: `None` until [`enable`], and again after [`close`].
static LEDGER: RwLock<Option<Ledger>> = RwLock::new(None);

/// Starts recording the references this process adopts (a pool worker does, first thing),
/// until the last returned guard drops (then as [`close`]). Without a ledger (it cannot be
/// created) references are simply not recorded.
pub fn enable() -> Recording {
    let mut g = LEDGER.write().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        *g = Ledger::create();
    }
    if let Some(l) = g.as_mut() {
        l.users += 1;
    }
    Recording(())
}

/// [`enable`] for the rest of this process's life (a channel's peer: what it received may
/// outlive the channel): the ledger closes when the process exits normally, from an exit
/// handler; killed, it leaves the ledger for whoever reaps it.
pub fn enable_until_exit() {
    std::mem::forget(enable());
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain function that never unwinds (see `close_at_exit`); the C
        // library keeps the pointer for the life of the process, and the function is static.
        // A failed registration leaves the ledger for `prune`, as for a killed process.
        let _ = unsafe { atexit(close_at_exit) };
    });
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// Runs when the process exits: other threads may still run, so the ledger is closed only if
/// nobody holds its lock (else it is left for `prune`), and nothing unwinds into C.
extern "C" fn close_at_exit() {
    let _ = std::panic::catch_unwind(|| match LEDGER.try_write() {
        Ok(mut g) => close_locked(&mut g),
        Err(TryLockError::Poisoned(p)) => close_locked(&mut p.into_inner()),
        Err(TryLockError::WouldBlock) => {}
    });
}

/// Recording goes on while a guard lives; dropping the last one closes the ledger.
#[must_use = "dropping it closes the ledger at once"]
pub struct Recording(());

impl Drop for Recording {
    fn drop(&mut self) {
        let mut g = LEDGER.write().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = g.as_mut() {
            l.users = l.users.saturating_sub(1);
            if l.users == 0 {
                close_locked(&mut g);
            }
        }
    }
}

/// Records a reference to the region at `offset` of segment `name` (of `generation`), just
/// adopted; the entry to clear when it is given back (`None`: not recorded).
pub(crate) fn record(name: &str, offset: u64, generation: u64) -> Option<Recorded> {
    let g = LEDGER.read().unwrap_or_else(|p| p.into_inner());
    let l = g.as_ref().filter(|l| l.pid == mizu_shm::current_pid())?;
    let i = l.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
    l.entries()[i as usize].set(name, offset, generation);
    Some(Recorded {
        ledger: l.number,
        index: i,
    })
}

/// Clears the entry `e` names before its holder gives the reference back: true if the holder is the
/// one to decrement (nobody gave it back on its behalf).
pub(crate) fn take(e: Recorded) -> bool {
    let g = LEDGER.read().unwrap_or_else(|p| p.into_inner());
    let Some(l) = g.as_ref().filter(|l| l.number == e.ledger) else {
        // Its ledger was closed (maybe followed by another), and `close` gave every reference
        // it recorded back.
        return false;
    };
    let i = e.index;
    let won = l.entries()[i as usize].take();
    l.free.lock().unwrap_or_else(|p| p.into_inner()).push(i);
    won
}

/// The process is leaving: gives back every reference still recorded (objects of the leaving
/// process may still hold them, but nobody reads through them once it is gone) and removes
/// the ledger, whatever guards remain. Later adoptions are not recorded.
pub fn close() {
    close_locked(&mut LEDGER.write().unwrap_or_else(|p| p.into_inner()));
}

fn close_locked(g: &mut Option<Ledger>) {
    if let Some(l) = g.take()
        && l.pid == mizu_shm::current_pid()
    {
        give_back(l.entries());
        let _ = l.seg.unlink();
    }
}

/// Gives back what the ledgers of dead processes list — of the processes `pids`, or of any
/// when `None` — and removes those ledgers. Returns how many references were given back.
pub fn release_dead(pids: Option<&[u32]>) -> usize {
    let Ok(place) = mizu_shm::place::current() else {
        return 0;
    };
    let Ok(dir) = std::fs::read_dir(place.dir()) else {
        return 0;
    };
    let mut n = 0;
    for name in dir.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
        let Ok(sn) = SegmentName::parse(&name) else {
            continue;
        };
        let creator = sn.creator();
        if pids.is_some_and(|p| !p.contains(&creator.pid)) || creator.is_alive() {
            continue;
        }
        let Ok(seg) = Segment::open(sn.as_str(), LEDGER_KIND) else {
            continue;
        };
        let (Some(h), Some(es)) = (header(&seg), entries(&seg)) else {
            continue;
        };
        if h.claim() {
            n += give_back(es);
            let _ = seg.unlink();
        }
    }
    n
}

/// Gives back every reference `es` lists that nobody gave back yet.
fn give_back(es: &[Entry]) -> usize {
    let mut n = 0;
    for e in es {
        if !e.take() {
            continue;
        }
        let listed = e.listed();
        let Some(name) = listed.name else {
            continue;
        };
        let (offset, generation) = (listed.offset, listed.generation);
        // A segment that is gone (its owner exited and it was removed) needs nothing.
        if let Ok(seg) = DataSegment::open(&name)
            && seg.release_on_behalf(offset, generation)
        {
            n += 1;
        }
    }
    n
}

/// A ledger segment whose entries a fuzz harness writes (as a killed process might have left
/// them) and a reaper then gives back: the reaper's reading of another process's entries.
/// For the harnesses only (the `test-helpers` feature).
#[cfg(feature = "test-helpers")]
pub struct WrittenLedger(Segment);

#[cfg(feature = "test-helpers")]
impl WrittenLedger {
    /// An empty ledger segment.
    pub fn new() -> Option<Self> {
        Ledger::create().map(|l| WrittenLedger(l.seg))
    }

    /// Writes `raw` over the start of the entries (64 bytes each), then gives back what they
    /// list as a reaper does: how many references were given back.
    pub fn reap(&self, raw: &[u8]) -> usize {
        let Some(e) = self.0.extent(1).ok() else {
            return 0;
        };
        let n = raw.len().min(e.len as usize);
        // SAFETY: the entries extent lies inside this process's own mapping (validated
        // header), and nobody else has the segment's name.
        unsafe {
            std::ptr::copy_nonoverlapping(raw.as_ptr(), self.0.as_ptr().add(e.offset as usize), n)
        };
        entries(&self.0).map_or(0, give_back)
    }
}
