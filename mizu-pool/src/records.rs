//! The records in a pool segment that processes coordinate through, and the atomic
//! protocols on them that involve no segment: which worker may spin, who holds a submitter
//! record. They take their atomics from `mizu_shm::sync`, so the loom models in
//! `tests/loom.rs` run exactly this code (see `docs/protocols.md`).

use mizu_queue::StateWord;
use mizu_shm::sync::{AtomicU32, AtomicU64, Ordering, fence};
use mizu_shm::{AimedPark, CacheLine, ParkWord};

/// Worker record states.
pub mod wstate {
    /// Never used.
    pub const EMPTY: u32 = 0;
    /// Launched, not yet joined.
    pub const STARTING: u32 = 1;
    /// Joined and taking tasks.
    pub const READY: u32 = 2;
    /// Leaving (retired or stopping).
    pub const EXITING: u32 = 3;
    /// Gone.
    pub const DEAD: u32 = 4;
    /// Leaving after its task quota (it asked to be replaced).
    pub const RECYCLE: u32 = 5;
    /// Taken by the one process joining as this slot's worker (by CAS from `STARTING`),
    /// which sets up and then stores `READY`.
    pub const JOINING: u32 = 6;

    /// Whether a worker in state `st` is there or on its way (launched or joining).
    pub fn coming(st: u32) -> bool {
        matches!(st, STARTING | JOINING | READY)
    }
}

/// Task ids pack a marker bit, the submitter (11 bits), the slot (20 bits) and the low 32 bits of
/// the slot generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskId {
    /// Submitter index.
    pub submitter: usize,
    /// Slot index.
    pub slot: usize,
    /// Slot generation (full).
    pub generation: u64,
}

impl TaskId {
    /// Packs into a ring word.
    pub fn pack(&self) -> u64 {
        (1 << 63)
            | ((self.submitter as u64) << 52)
            | ((self.slot as u64) << 32)
            | (self.generation & 0xffff_ffff)
    }

    /// Unpacks a ring word (generation: low 32 bits only); `None` for a word no submitter
    /// writes.
    pub fn unpack(w: u64) -> Option<(usize, usize, u32)> {
        (w >> 63 == 1).then_some((
            ((w >> 52) & 0x7ff) as usize,
            ((w >> 32) & 0xf_ffff) as usize,
            w as u32,
        ))
    }
}

/// A worker's `idle` field.
pub mod idle {
    /// Running a task, or between two.
    pub const BUSY: u32 = 0;
    /// Idle and spinning: it sees new work by itself.
    pub const SPINNING: u32 = 1;
    /// Idle without spinning: it parks, and a submitter must wake it.
    pub const SLEEPING: u32 = 2;
}

/// A worker's shared record.
#[repr(C)]
#[derive(Debug, Default)]
pub struct WorkerRec {
    /// See [`wstate`].
    pub state: AtomicU32,
    /// OS pid.
    pub pid: AtomicU32,
    /// Identity nonce.
    pub nonce: AtomicU64,
    /// [`idle`]: submitters prefer idle workers, spinning ones first (they need no wake).
    pub idle: AtomicU32,
    /// The CPU the worker ran on when it last woke, plus one (0: not known yet): a hint the
    /// workers use to keep off each other's CPUs (see `worker::placement`).
    pub cpu: AtomicU32,
    // Submitters read the fields above on every submit; the worker writes the ones below on
    // every task. Separate lines keep those reads from missing.
    _line: [AtomicU64; 5],
    /// The claim record: the task id this worker is claiming or running (0 = none). Written
    /// *before* the claim CAS, so a reaper can tell which task died with the worker.
    pub current: AtomicU64,
    /// CLOCK_MONOTONIC ns when `current` started (for execution timeouts).
    pub started_ns: AtomicU64,
    /// Tasks run.
    pub tasks: AtomicU64,
    /// Tasks taken from other workers' queues.
    pub steals: AtomicU64,
    /// Times this worker slept in the kernel.
    pub parks: AtomicU64,
}
#[cfg(not(mizu_loom))]
const _: () = assert!(std::mem::offset_of!(WorkerRec, current) == 64);

/// One worker slot: record plus the word it parks on, on separate lines.
#[repr(C)]
#[derive(Debug, Default)]
pub struct WorkerSlot {
    /// The record.
    pub rec: CacheLine<WorkerRec>,
    /// Woken by submitters.
    pub park: CacheLine<ParkWord>,
}
#[cfg(not(mizu_loom))]
// SAFETY: repr(C) atomics and ParkWords; zero is valid.
unsafe impl mizu_shm::ShmSafe for WorkerSlot {}

/// A submitter's shared record.
#[repr(C)]
#[derive(Debug, Default)]
pub struct SubmitterRec {
    /// Who holds the record: [`SubmitterRec::take`] and friends. The holder's (or taker's)
    /// pid in the high 32 bits, a count of takings, two state bits.
    pub state: AtomicU64,
    /// The holder's identity nonce (written before the state names it the holder).
    pub nonce: AtomicU64,
    /// Tasks submitted.
    pub submitted: AtomicU64,
    /// Tasks collected.
    pub collected: AtomicU64,
    /// Non-zero while the holder stages a batch whose queue writes it has not published yet
    /// (a hint): a worker walking the task slots leaves those tasks to the queues, which hand
    /// them out in the order they were submitted (the slots would not).
    pub staging: AtomicU64,
}

/// One submitter slot: record plus the words its collectors park on.
#[repr(C)]
#[derive(Debug, Default)]
pub struct SubmitterSlot {
    /// The record.
    pub rec: CacheLine<SubmitterRec>,
    /// Woken by workers when any task of this submitter finishes.
    pub park: CacheLine<ParkWord>,
    /// Where one collector at a time waits for one task (its slot the aim): woken by that
    /// task's outcome, by any failure, and by deaths, cancels and the pool stopping — not by
    /// every other outcome (see `collect`).
    pub aimed: CacheLine<AimedPark>,
}
#[cfg(not(mizu_loom))]
// SAFETY: as above.
unsafe impl mizu_shm::ShmSafe for SubmitterSlot {}

impl SubmitterSlot {
    /// Wakes the collectors of a task of this submitter that just became final in slot `slot`
    /// (`failed`: with anything but a result) — after one fence, the parked waiters for any
    /// outcome and the aimed one if it waits for this task or `failed`.
    #[inline]
    pub fn wake_for(&self, slot: usize, failed: bool) {
        fence(Ordering::SeqCst);
        self.park.wake_all_fenced();
        self.aimed.wake_fenced(slot as u32, failed);
    }

    /// Collectors of this submitter asleep now, aimed or not.
    pub fn sleepers(&self) -> u32 {
        self.park.sleepers() + self.aimed.word().sleepers()
    }

    /// Wakes every collector of this submitter, aimed or not (a death, a cancel, the pool
    /// stopping: events a waiter must see whatever it waits for).
    pub fn wake_every(&self) {
        self.park.wake_all();
        self.aimed.wake();
    }
}

/// Why a task ended in `Died`.
pub mod reason {
    /// The worker process died.
    pub const DIED: u32 = 1;
    /// Killed for exceeding the execution timeout.
    pub const TIMEOUT: u32 = 2;
    /// The pool stopped.
    pub const STOPPED: u32 = 3;
    /// With `Err`: the runtime's own failure (the payload is UTF-8 text), not the executor's.
    pub const RUNTIME: u32 = 4;
}

/// How a task slot's data area is filled.
pub mod data_kind {
    /// `len` raw bytes.
    pub const INLINE: u32 = 1;
    /// A mizu-wire region frame of `len` bytes whose region holds the raw bytes.
    pub const REGION: u32 = 2;
}

/// A task slot's header (its data area is a separate granule). Two lines: the collector spins
/// on the first (`state`), the worker writes the second (`runner`, `kind`, `len`) while it
/// works, so those writes do not have to pull the line away from a spinning reader.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct TaskHdr {
    /// The slot state machine (state + generation).
    pub state: StateWord,
    /// [`reason`] for `Died`.
    pub reason: AtomicU32,
    /// Set by a submitter that dropped the handle while the task ran: whoever sees the task
    /// final and this set frees the slot.
    pub abandoned: AtomicU32,
    _pad0: [AtomicU64; 6],
    /// Worker slot << 32 | pid of the runner.
    pub runner: AtomicU64,
    /// [`data_kind`] of the data area.
    pub kind: AtomicU32,
    /// Bytes used in the data area.
    pub len: AtomicU32,
    _pad1: [AtomicU64; 6],
}
#[cfg(not(mizu_loom))]
// SAFETY: atomics only; zero is (generation 0, Free).
unsafe impl mizu_shm::ShmSafe for TaskHdr {}
#[cfg(not(mizu_loom))]
const _: () = assert!(std::mem::size_of::<TaskHdr>() == 128);

/// Worker `me` runs out of work: decides whether it may spin and says so in its `idle` field
/// ([`idle::SPINNING`] or [`idle::SLEEPING`]). Workers that spin or run tasks are kept below
/// `max_active` (the CPUs less one for whoever submits), or spinning idlers would slow down
/// the busy ones.
///
/// There is no shared count: each worker's own field is the whole truth, so a worker killed at
/// any step leaves nothing to repair (a dead worker is not `READY` and counts for nobody).
/// A worker that finds room claims it, then (after a SeqCst fence) looks again: of two
/// workers claiming at once at least one sees the other's claim, so they never overshoot
/// (both may back off, which costs a wake-up later, never a CPU). One that finds no room says
/// it sleeps straight away: submitters prefer spinning workers, and one that only looked like
/// it would get tasks it then has to be woken for.
pub fn go_idle(workers: &[WorkerSlot], me: usize, max_active: u32) -> bool {
    let rec = &workers[me].rec;
    let room = || {
        let active = workers
            .iter()
            .enumerate()
            .filter(|&(w, s)| {
                w != me
                    && s.rec.state.load(Ordering::SeqCst) == wstate::READY
                    && s.rec.idle.load(Ordering::SeqCst) != idle::SLEEPING
            })
            .count();
        (active as u64) < u64::from(max_active)
    };
    if room() {
        rec.idle.store(idle::SPINNING, Ordering::SeqCst);
        // Orders the claim before the second look, as in the parking protocol (SeqCst stores
        // and loads alone would do in C++'s model; the fence also makes loom check it).
        fence(Ordering::SeqCst);
        if room() {
            return true;
        }
    }
    rec.idle.store(idle::SLEEPING, Ordering::SeqCst);
    false
}

/// Wakes a worker that was given work (a task in its ring or a deque it looks at), and marks
/// it busy at once if it was parked or about to park: it is runnable from now, but until it
/// gets a CPU it cannot say so itself, and a caller that saw it still asleep would watch on
/// the CPU it needs (see [`crate::watch`]) or hand it the next task of a stream too. True
/// when it had to be woken. A worker that spins is left alone (it sees the work by itself, and
/// writing its record would cost the round trip a cache line).
pub fn wake_for_work(slot: &WorkerSlot) -> bool {
    let woke = slot.park.wake_all();
    let was = slot.rec.idle.load(Ordering::Relaxed);
    if woke || was == idle::SLEEPING {
        // It may have stored another state meanwhile (it looks at its queues before parking,
        // so nothing is lost either way): only the one read is replaced.
        let _ =
            slot.rec
                .idle
                .compare_exchange(was, idle::BUSY, Ordering::Relaxed, Ordering::Relaxed);
    }
    woke
}

/// Tells up to `n` idle workers (other than `me`) that work was pushed where they look for it
/// by themselves (a worker's deque): spinning ones see it, sleeping ones are woken.
///
/// The fence orders the push before the reads of `idle` and of the park word, as
/// [`ParkWord::wake_all`]'s does: without it, the reads could see a worker as busy from before
/// it went idle while that worker, having gone idle, still sees the deque empty — and it
/// would sleep until its park slice ends.
pub fn announce(workers: &[WorkerSlot], me: Option<usize>, mut n: usize) {
    if n == 0 {
        return;
    }
    fence(Ordering::SeqCst);
    for (w, slot) in workers.iter().enumerate() {
        if n == 0 {
            return;
        }
        let rec = &slot.rec;
        if Some(w) == me || rec.state.load(Ordering::Acquire) != wstate::READY {
            continue;
        }
        match rec.idle.load(Ordering::Acquire) {
            idle::BUSY => {}
            idle::SPINNING if slot.park.sleepers() == 0 => n -= 1,
            _ => {
                wake_for_work(slot);
                n -= 1;
            }
        }
    }
}

/// A submitter record's state word: the holder's pid (high 32 bits), a count of takings, and
/// the state (low two bits).
mod held {
    pub const FREE: u64 = 0;
    pub const HELD: u64 = 1;
    /// Taken by [`super::SubmitterRec::take`], the taker (its pid in the word) not yet
    /// recorded with its nonce.
    pub const TAKING: u64 = 2;
    pub const MASK: u64 = 3;
    /// One taking in the count (bits 2..32).
    pub const ONE: u64 = MASK + 1;
    pub const COUNT: u64 = 0xffff_ffff & !MASK;

    pub fn word(pid: u32, count_bits: u64, state: u64) -> u64 {
        (u64::from(pid) << 32) | (count_bits & COUNT) | state
    }

    pub fn pid(word: u64) -> u32 {
        (word >> 32) as u32
    }
}

/// Whom a [`SubmitterRec::take`] asks about: the holder (pid and nonce), or a taker that died
/// or lives between its taking and its [`SubmitterRec::hold`] (pid only: its nonce is not
/// written yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A holder recorded with [`SubmitterRec::hold`].
    Held(u32, u64),
    /// A taker not yet recorded.
    Taking(u32),
}

impl SubmitterRec {
    /// Takes the record for process `me` if it is free, its holder is dead, or the process
    /// taking it died before recording itself (`alive` says). At most one of several
    /// processes racing for it wins.
    ///
    /// Every taking bumps the count in the state word and the winner's one CAS expects the word
    /// it judged: a process that judged an old holder dead cannot win after another process
    /// took the record over and recorded itself (the state bits alone would look the same).
    /// The taker's pid goes into the same CAS, so a taker killed before [`SubmitterRec::hold`]
    /// leaves a record the next taker can judge; a taker's pid reused by an unrelated live
    /// process keeps the record until that process exits (never gives it to two).
    pub fn take(&self, me: u32, alive: impl Fn(Holder) -> bool) -> bool {
        let cur = self.state.load(Ordering::Acquire);
        let pid = held::pid(cur);
        let free = match cur & held::MASK {
            held::FREE => true,
            held::HELD => !alive(Holder::Held(pid, self.nonce.load(Ordering::Relaxed))),
            held::TAKING => !alive(Holder::Taking(pid)),
            _ => false,
        };
        let next = held::word(me, cur.wrapping_add(held::ONE), held::TAKING);
        free && self
            .state
            .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Records `(pid, nonce)` as the holder (after [`SubmitterRec::take`], or for a record the
    /// process holds by its role: the controller's, a worker's own).
    pub fn hold(&self, pid: u32, nonce: u64) {
        self.nonce.store(nonce, Ordering::Relaxed);
        let cur = self.state.load(Ordering::Relaxed);
        self.state
            .store(held::word(pid, cur, held::HELD), Ordering::Release);
    }

    /// Gives the record back.
    pub fn release(&self) {
        let cur = self.state.load(Ordering::Relaxed);
        self.state
            .store(held::word(0, cur, held::FREE), Ordering::Release);
    }

    /// Whether someone holds (or is taking) the record.
    pub fn is_held(&self) -> bool {
        self.state.load(Ordering::Relaxed) & held::MASK != held::FREE
    }

    /// The holder's (or taker's) pid; 0 when free.
    pub fn pid(&self) -> u32 {
        held::pid(self.state.load(Ordering::Relaxed))
    }
}

/// Takes the worker slot whose record is `rec` for the one process joining it
/// (`STARTING` → `JOINING`); false when it is not waiting for a worker (another joiner took
/// it, or no worker was launched for it).
pub fn join(rec: &WorkerRec) -> bool {
    rec.state
        .compare_exchange(
            wstate::STARTING,
            wstate::JOINING,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
}

/// Gives back a slot [`join`] took, for the worker launched for it, when the join fails.
pub fn unjoin(rec: &WorkerRec) {
    let _ = rec.state.compare_exchange(
        wstate::JOINING,
        wstate::STARTING,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
}

/// `n` worker slots whose workers have joined and are busy, for the models and tests of these
/// protocols.
#[cfg(any(test, mizu_loom))]
pub fn ready_workers(n: usize) -> Vec<WorkerSlot> {
    (0..n)
        .map(|_| {
            let w = WorkerSlot::default();
            w.rec.state.store(wstate::READY, Ordering::Relaxed);
            w
        })
        .collect()
}

/// Worker slots with the records `(state, idle, recorded CPU + 1)`, for tests of what reads
/// them.
#[cfg(all(test, not(mizu_loom)))]
pub(crate) fn slots_with(recs: &[(u32, u32, u32)]) -> Vec<WorkerSlot> {
    recs.iter()
        .map(|&(state, idle, cpu)| {
            let w = WorkerSlot::default();
            w.rec.state.store(state, Ordering::Relaxed);
            w.rec.idle.store(idle, Ordering::Relaxed);
            w.rec.cpu.store(cpu, Ordering::Relaxed);
            w
        })
        .collect()
}

#[cfg(all(test, not(mizu_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_worker_killed_while_spinning_leaves_nothing_to_repair() {
        let ws = ready_workers(3);
        for w in &ws {
            w.rec.idle.store(idle::SLEEPING, Ordering::Relaxed);
        }
        assert!(go_idle(&ws, 0, 1));
        assert!(!go_idle(&ws, 1, 1), "one spinner fills a bound of one");
        // Worker 0 is killed while spinning: its record says so, nobody resets `idle`.
        ws[0].rec.state.store(wstate::DEAD, Ordering::Relaxed);
        assert!(go_idle(&ws, 2, 1), "a dead spinner still counted");
    }

    #[test]
    fn busy_workers_count_against_the_bound_and_sleepers_do_not() {
        let ws = ready_workers(3);
        ws[1].rec.idle.store(idle::SLEEPING, Ordering::Relaxed);
        // Worker 2 is busy (idle = BUSY): with room for two, worker 0 may spin.
        assert!(go_idle(&ws, 0, 2));
        assert!(!go_idle(&ws, 1, 2));
        assert_eq!(ws[1].rec.idle.load(Ordering::Relaxed), idle::SLEEPING);
    }

    #[test]
    fn a_submitter_record_counts_its_takings() {
        let r = SubmitterRec::default();
        assert!(!r.is_held());
        assert!(r.take(9, |_| true));
        assert!(r.is_held());
        assert_eq!(r.pid(), 9);
        assert!(!r.take(8, |_| true), "taken while a live process takes it");
        r.hold(1, 2);
        assert!(!r.take(8, |_| true), "taken from a live holder");
        assert!(
            r.take(8, |h| h != Holder::Held(1, 2)),
            "dead holder kept it"
        );
        r.hold(3, 4);
        r.release();
        assert!(!r.is_held());
        assert_eq!(r.pid(), 0);
        assert_eq!(
            (r.state.load(Ordering::Relaxed) & held::COUNT) >> 2,
            2,
            "two takings counted"
        );
    }

    #[test]
    fn a_taker_killed_before_it_holds_leaves_the_record_to_the_next() {
        let r = SubmitterRec::default();
        assert!(r.take(7, |_| true));
        // Process 7 dies here, before `hold`.
        assert!(r.take(8, |h| h != Holder::Taking(7)), "stuck being taken");
        r.hold(8, 1);
        assert_eq!(r.pid(), 8);
    }
}
