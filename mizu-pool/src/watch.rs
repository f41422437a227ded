//! Watching for an outcome without sleeping, while a CPU would otherwise sit idle.
//!
//! A thread parked on a futex needs a wake-up once the worker finishes, and in a VM waking an
//! idle CPU costs 20–100 µs — more than a trivial task's whole round trip. A caller waiting for
//! a task of a few milliseconds therefore keeps polling through it instead, but only while the
//! CPU it polls on is one nobody else would use: fewer workers run or spin than the machine
//! has CPUs, and no other thread of this process watches already. It stops at once when a
//! worker takes a CPU back, and after [`WATCH`] at the latest (a longer task makes the
//! wake-up's cost negligible beside it). Nothing watches while nothing is pending: a watch
//! only lasts while its caller waits for an outcome.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::layout::{PoolView, wstate};
use crate::records::{WorkerSlot, idle};

/// The longest a caller watches before it parks.
pub const WATCH: Duration = Duration::from_millis(5);

/// How long a watch goes on without a CPU free before it stops: a worker that wakes from an
/// idle slice, looks for work and parks again takes a CPU for a moment, and a watch ended for
/// that would leave the rest of the wait to a wake-up that costs more than this.
pub const CROWDED: Duration = Duration::from_micros(200);

/// Until when (ns after [`epoch`], 0: nobody) a thread of this process watches: one watcher
/// takes one CPU. A deadline rather than a flag, so that a watch its caller forgets (an event
/// loop closed between two looks) frees the CPU when its time is up.
static WATCHING: AtomicU64 = AtomicU64::new(0);

/// The instant [`WATCHING`] counts from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// How a watch ended without the outcome.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unwatched {
    /// Its time ran out: the task outlasts a watch (the next waits had better park).
    Outlasted,
    /// No CPU was free for it, or another thread watches.
    NoRoom,
}

/// The CPUs this machine runs processes on.
pub(crate) fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| mizu_shm::affinity::available_cpus_all().len().max(1))
}

/// Whether a CPU is free for a watcher: the workers that run tasks or spin leave one. An
/// idle worker that was let spin but has spent its spin and parked (it keeps its claim to
/// spin until it wakes) takes no CPU meanwhile, as submitters also know. Never in a worker
/// process: its own pool counts its CPU as busy, and a pool it made itself does not know
/// about the others.
pub(crate) fn room(v: &PoolView<'_>) -> bool {
    if crate::origin::in_worker_process() {
        return false;
    }
    let active = v
        .workers()
        .iter()
        .filter(|s| {
            s.rec.state.load(Ordering::Relaxed) == wstate::READY
                && match s.rec.idle.load(Ordering::Relaxed) {
                    idle::SLEEPING => false,
                    idle::SPINNING => s.park.sleepers() == 0,
                    _ => true,
                }
        })
        .count();
    active < cpus()
}

/// [`room`] for a watch, which keeps its CPU for milliseconds: also only while the machine's
/// other runnable threads do not outnumber its CPUs (see [`crate::load`]). (A collector's
/// short spin asks only [`room`]: it runs on every collect, and the load costs a clock read.)
/// A watch also stops at once for [`worker_here`].
pub(crate) fn room_to_watch(v: &PoolView<'_>) -> bool {
    room(v) && !crate::load::crowded()
}

/// Whether a busy worker of the pool last said it runs on the CPU this thread runs on: it is
/// queued behind this thread. A worker woken for a map's chunk moves onto its caller's CPU
/// when the other one has a busy worker (the caller is about to sleep, see
/// `worker::placement`); a caller that watched or spun there instead kept the worker it waited
/// for off the CPU until the kernel's time slice ended, while the other CPU idled (on 2 CPUs, a
/// map of two chunks took ~1 ms instead of ~0.03 ms in a third of the maps). Counts as no room
/// at once, not after [`CROWDED`]: the watcher is what keeps that worker waiting.
pub(crate) fn worker_here(v: &PoolView<'_>) -> bool {
    busy_on(v.workers(), rustix::thread::sched_getcpu())
}

/// Whether one of `workers` is busy and recorded on `cpu`.
fn busy_on(workers: &[WorkerSlot], cpu: usize) -> bool {
    let cpu = cpu as u32 + 1;
    workers.iter().any(|s| {
        s.rec.cpu.load(Ordering::Relaxed) == cpu
            && s.rec.state.load(Ordering::Relaxed) == wstate::READY
            && s.rec.idle.load(Ordering::Relaxed) == idle::BUSY
    })
}

/// The right to watch until `end`; gives it back when dropped (also when `poll` unwinds).
pub(crate) struct Token {
    until: u64,
    pub(crate) end: Instant,
}

impl Token {
    pub(crate) fn take(limit: Duration) -> Option<Token> {
        let base = epoch();
        let now = Instant::now();
        let at = |t: Instant| (t - base).as_nanos() as u64;
        let held = WATCHING.load(Ordering::Relaxed);
        if held > at(now) {
            return None;
        }
        let end = now + limit;
        let until = at(end).max(1);
        WATCHING
            .compare_exchange(held, until, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        Some(Token { until, end })
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        // Not ours any more if our time ran out and another thread took it since.
        let _ = WATCHING.compare_exchange(self.until, 0, Ordering::Release, Ordering::Relaxed);
    }
}

/// Polls `poll` for at most `limit` while a CPU is free for it (see the module docs).
pub(crate) fn watch<T>(
    v: &PoolView<'_>,
    limit: Duration,
    mut poll: impl FnMut() -> Option<T>,
) -> Result<T, Unwatched> {
    if limit.is_zero() || !room_to_watch(v) || worker_here(v) {
        return Err(Unwatched::NoRoom);
    }
    let Some(token) = Token::take(limit) else {
        return Err(Unwatched::NoRoom);
    };
    let end = token.end;
    let crowding = Crowding::default();
    let mut n = 0u32;
    loop {
        if let Some(found) = poll() {
            return Ok(found);
        }
        std::hint::spin_loop();
        n = n.wrapping_add(1);
        // The clock and the workers' records cost more than a poll: read them every 256.
        if n.is_multiple_of(256) {
            let now = Instant::now();
            if now >= end {
                return Err(Unwatched::Outlasted);
            }
            if worker_here(v) || !crowding.go_on(room_to_watch(v), now) {
                return Err(Unwatched::NoRoom);
            }
            // Another thread of this machine that wants to run gets the CPU now and then.
            if n.is_multiple_of(1 << 14) {
                std::thread::yield_now();
            }
        }
    }
}

/// Whether a watch goes on without a free CPU: for [`CROWDED`].
#[derive(Debug, Default)]
pub(crate) struct Crowding {
    /// Since when the caller has looked without a CPU free, if it has.
    since: Cell<Option<Instant>>,
}

impl Crowding {
    /// A look at `now` that found a CPU free (`room`) or not: whether to go on.
    pub(crate) fn go_on(&self, room: bool, now: Instant) -> bool {
        if room {
            self.since.set(None);
            return true;
        }
        let since = self.since.get().unwrap_or(now);
        self.since.set(Some(since));
        now - since < CROWDED
    }
}

#[cfg(all(test, not(mizu_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_busy_worker_recorded_on_the_cpu_is_queued_there_an_idle_or_departed_one_is_not() {
        // (state, idle, recorded CPU + 1) per worker.
        let slots = crate::records::slots_with;
        let (r, b, s, sp) = (wstate::READY, idle::BUSY, idle::SLEEPING, idle::SPINNING);
        assert!(busy_on(&slots(&[(r, b, 2), (r, b, 1)]), 0));
        assert!(busy_on(&slots(&[(r, b, 2), (r, b, 1)]), 1));
        assert!(!busy_on(&slots(&[(r, b, 2), (r, b, 1)]), 2));
        // Asleep, spinning (not handed work), leaving, or never recorded: not queued there.
        assert!(!busy_on(&slots(&[(r, s, 1), (r, sp, 1)]), 0));
        assert!(!busy_on(&slots(&[(wstate::EXITING, b, 1)]), 0));
        assert!(!busy_on(&slots(&[(r, b, 0)]), 0));
    }

    #[test]
    fn a_moment_without_a_free_cpu_goes_on_a_longer_one_does_not() {
        let c = Crowding::default();
        let t0 = Instant::now();
        let nearly = CROWDED - Duration::from_micros(1);
        assert!(c.go_on(true, t0));
        // Crowded for less than `CROWDED`: it goes on; a free CPU starts the count again.
        assert!(c.go_on(false, t0));
        assert!(c.go_on(false, t0 + nearly));
        assert!(c.go_on(true, t0 + nearly));
        let t1 = t0 + CROWDED;
        assert!(c.go_on(false, t1));
        assert!(c.go_on(false, t1 + nearly));
        // Crowded for `CROWDED`: it stops.
        assert!(!c.go_on(false, t1 + CROWDED));
    }
}
