//! Which CPU a worker runs on: the kernel's choice, corrected when it puts two of the pool's
//! busy workers on one CPU while another has none.
//!
//! Linux places a woken thread near its waker or on the CPU it last ran on. When a caller
//! wakes two workers in a row, both can land on one CPU (the other looked busy at that
//! moment: the caller ran there), and an idle CPU pulls a waiting thread over only when its
//! idle periods are long enough to be worth balancing — a caller that sleeps between results
//! keeps them short. The two workers then take turns on one CPU for milliseconds while the
//! other CPU idles: on 2 CPUs, a map of 20 ms lost 2–12 ms this way (workers' run-queue waits
//! in `/proc/PID/schedstat`, both waiting at once).
//!
//! So a worker woken for work records the CPU it runs on in its record (`cpu`, the CPU + 1; a
//! hint, read and written relaxed), and looks at the other busy workers: when the kernel says
//! one is on its CPU (`/proc/PID/stat`; in pools of more than [`ASK_ALL`] workers it asks only
//! about those recorded there) and a CPU the worker may run on has no busy worker recorded, it
//! moves there (restricted to that CPU, then given back its whole allowance, which leaves it
//! where it is). Two workers on one CPU run one at a time: the first to run finds the other
//! queued there and moves, or else the second finds the first there when it runs. Trusting
//! the records alone moved workers onto each other's real CPUs as often as it separated them;
//! letting only the lower slot move left two workers together whenever the higher one woke
//! first. Nothing is pinned: the kernel stays free to move a worker later, and threads a task
//! starts may run anywhere the worker may.
//!
//! In a stream of tiny tasks (the worker ran tasks of less than 20 µs on average until it
//! parked, and was woken less than 20 ms after its last wake), a CPU where a caller of the
//! pool is running (not waiting) is not free either: a caller submitting a stream of small
//! tasks is what every worker waits for, and two workers sharing the other CPU lose nothing
//! while it has its own (on 2 CPUs, moving a worker onto the caller's CPU at its wakes made a
//! pipelined R stream of 20 000 tasks 1.5x slower). A caller running then may be about to
//! sleep, so a worker that stayed for that reason looks once more at the first task boundary
//! a millisecond later. A map's chunks, or the first wake after a pause, count the caller's
//! CPU as free: the caller of a map runs when the workers wake (it sends each its first chunk,
//! then encodes the rest) and sleeps soon after.

use std::time::{Duration, Instant};

use mizu_shm::sync::Ordering;

use crate::layout::PoolView;
use crate::records::{WorkerSlot, idle};

/// How long after a wake a worker that found its only way off a shared CPU taken by a running
/// caller looks again (at the first task boundary after it).
const RECHECK: Duration = Duration::from_millis(1);

/// A worker that ran tiny tasks and is woken again within this long of its last wake is in a
/// stream of submissions (see [`Placement::woke`]).
const STREAM_GAP: Duration = Duration::from_millis(20);

/// A worker's placement: a look after each wake for work, and at most one look again.
#[derive(Default)]
pub(super) struct Placement {
    /// When the look deferred after the last wake is due.
    recheck: Option<Instant>,
    /// When the worker was last woken for work.
    last_wake: Option<Instant>,
}

impl Placement {
    /// After a wake for work (`tiny`: the worker ran tiny tasks until it parked): see where
    /// this worker runs (see [`look`]). In a stream of tiny tasks (woken again within
    /// [`STREAM_GAP`] after tiny ones), a CPU with a running caller is the caller's; as that
    /// caller may be about to sleep, a worker that stayed for it looks once more at the first
    /// task boundary [`RECHECK`] later. Otherwise (a map's chunks, the first wake of a burst)
    /// the worker moves wherever no other busy worker is.
    pub(super) fn woke(&mut self, v: &PoolView<'_>, slot: usize, tiny: bool) {
        let now = Instant::now();
        let stream = tiny
            && self
                .last_wake
                .is_some_and(|t| now.saturating_duration_since(t) < STREAM_GAP);
        self.last_wake = Some(now);
        self.recheck =
            (look(v, slot, stream) == Look::CallerThere).then(|| Instant::now() + RECHECK);
    }

    /// Between two tasks: the deferred look, when it is due.
    #[inline]
    pub(super) fn between_tasks(&mut self, v: &PoolView<'_>, slot: usize) {
        if let Some(at) = self.recheck
            && Instant::now() >= at
        {
            self.recheck = None;
            look(v, slot, true);
        }
    }
}

/// What a [`look`] found.
#[derive(PartialEq, Eq)]
enum Look {
    /// The worker runs where it should (possibly after a move).
    Settled,
    /// It shares its CPU with another busy worker, and the only CPU without one has a caller
    /// running on it.
    CallerThere,
}

/// The CPU this worker runs on now, recorded; moved first when it shares that CPU with another
/// busy worker and another allowed CPU has no busy worker (nor, with `callers`, a running
/// caller).
fn look(v: &PoolView<'_>, slot: usize, callers: bool) -> Look {
    let workers = v.workers();
    let here = rustix::thread::sched_getcpu();
    let mut now = here;
    let mut found = Look::Settled;
    if shares_cpu(workers, slot, here, kernel_cpu)
        && let Ok(allowed) = rustix::thread::sched_getaffinity(None)
        && let Some(free) = free_cpu(workers, slot, &allowed)
    {
        if callers && callers_running(v).contains(&free) {
            found = Look::CallerThere;
        } else {
            let mut one = rustix::thread::CpuSet::new();
            one.set(free);
            // (The move happens inside the first call, before it returns; the second keeps
            // the thread where it is, as its CPU is allowed.)
            if rustix::thread::sched_setaffinity(None, &one).is_ok() {
                let _ = rustix::thread::sched_setaffinity(None, &allowed);
                now = rustix::thread::sched_getcpu();
            }
        }
    }
    record(&workers[slot], now);
    found
}

/// Records `cpu` as where the worker runs (written only when it changed: submitters read the
/// record's line on every submit).
fn record(w: &WorkerSlot, cpu: usize) {
    let v = cpu as u32 + 1;
    if w.rec.cpu.load(Ordering::Relaxed) != v {
        w.rec.cpu.store(v, Ordering::Relaxed);
    }
}

/// Pools of up to this many workers ask the kernel about every other busy worker, not only
/// those recorded on the CPU. A worker woken for work that has not run yet still carries the
/// CPU it ran on last time, and the kernel may have queued it behind this one. It would then
/// wait out this worker's time slice, which is milliseconds, unless this one moves. In an R map
/// of 1 ms elements, the second worker started 1–5 ms late in half the maps. Larger pools ask
/// only about recorded matches, since each question reads a `/proc` file.
const ASK_ALL: usize = 8;

/// Whether a busy worker other than `slot` is on `cpu`, as `actual` says when asked by its pid
/// (about each busy worker in a small pool, else about those recorded on `cpu`).
fn shares_cpu(
    workers: &[WorkerSlot],
    slot: usize,
    cpu: usize,
    actual: impl Fn(u32) -> Option<usize>,
) -> bool {
    let small = workers.len() <= ASK_ALL;
    workers.iter().enumerate().any(|(i, w)| {
        i != slot
            && busy(w)
            && (small || w.rec.cpu.load(Ordering::Relaxed) == cpu as u32 + 1)
            && actual(w.rec.pid.load(Ordering::Relaxed)) == Some(cpu)
    })
}

/// The CPU the kernel last ran process `pid` on (field 39 of `/proc/PID/stat`, counted after
/// the command name, which may hold spaces and parentheses).
fn kernel_cpu(pid: u32) -> Option<usize> {
    kernel_state(pid).map(|(cpu, _)| cpu)
}

/// The CPU the kernel last ran process `pid` on and whether it is running (or runnable)
/// there now: fields 39 and 3 of `/proc/PID/stat`.
fn kernel_state(pid: u32) -> Option<(usize, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_ascii_whitespace();
    let running = fields.next()? == "R";
    Some((fields.nth(35)?.parse().ok()?, running))
}

/// The CPUs where a process submitting to the pool (other than its workers, whose nested
/// submissions hold records too) is running now (its main thread, which is what
/// `/proc/PID/stat` describes: a caller submitting from another thread is not seen).
fn callers_running(v: &PoolView<'_>) -> Vec<usize> {
    let workers: Vec<u32> = v
        .workers()
        .iter()
        .map(|w| w.rec.pid.load(Ordering::Relaxed))
        .collect();
    (0..v.params.submitters as usize)
        .map(|s| v.submitter(s).rec.pid())
        .filter(|&pid| pid != 0 && !workers.contains(&pid))
        .filter_map(kernel_state)
        .filter_map(|(cpu, running)| running.then_some(cpu))
        .collect()
}

/// An allowed CPU no busy worker but this one is recorded on.
fn free_cpu(
    workers: &[WorkerSlot],
    slot: usize,
    allowed: &rustix::thread::CpuSet,
) -> Option<usize> {
    (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .find(|&c| {
            !workers.iter().enumerate().any(|(i, w)| {
                i != slot && busy(w) && w.rec.cpu.load(Ordering::Relaxed) == c as u32 + 1
            })
        })
}

/// A joined worker running tasks (or woken for some).
fn busy(w: &WorkerSlot) -> bool {
    w.rec.state.load(Ordering::Relaxed) == crate::layout::wstate::READY
        && w.rec.idle.load(Ordering::Relaxed) == idle::BUSY
}

#[cfg(all(test, not(mizu_loom)))]
mod tests {
    use super::*;
    use crate::layout::wstate;

    fn workers(recs: &[(u32, u32, u32)]) -> Vec<WorkerSlot> {
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

    #[test]
    fn a_worker_that_wakes_on_a_busy_workers_cpu_moves_to_a_cpu_without_one() {
        let (r, b, s) = (wstate::READY, idle::BUSY, idle::SLEEPING);
        // Slot 0 busy on CPU 0 (recorded as 1), slot 2 on CPU 2; workers' pids 10, 11, 12.
        let w = workers(&[(r, b, 1), (r, b, 2), (r, b, 3)]);
        for (i, x) in w.iter().enumerate() {
            x.rec.pid.store(10 + i as u32, Ordering::Relaxed);
        }
        let truth = |pid: u32| Some((pid - 10) as usize);
        assert!(
            shares_cpu(&w, 1, 0, truth),
            "slot 1 waking on CPU 0 finds slot 0"
        );
        assert!(
            shares_cpu(&w, 0, 1, truth),
            "as slot 0 does slot 1, whatever the slots"
        );
        assert!(!shares_cpu(&w, 1, 1, truth), "nobody else on CPU 1");
        // A record the kernel contradicts (the worker was moved since) is no reason to move.
        assert!(!shares_cpu(&w, 1, 0, |_| Some(5)));
        assert!(!shares_cpu(&w, 1, 0, |_| None));
        // A busy worker queued on this CPU though its record says another (woken, not run
        // yet) is found in a small pool by asking the kernel; in a large one only by record.
        assert!(shares_cpu(&w, 1, 1, |pid| Some(if pid == 12 {
            1
        } else {
            9
        })));
        let many: Vec<_> = (0..=ASK_ALL as u32)
            .map(|i| {
                let x = WorkerSlot::default();
                x.rec.state.store(r, Ordering::Relaxed);
                x.rec.idle.store(b, Ordering::Relaxed);
                x.rec.cpu.store(i + 10, Ordering::Relaxed);
                x.rec.pid.store(100 + i, Ordering::Relaxed);
                x
            })
            .collect();
        assert!(!shares_cpu(&many, 0, 1, |_| Some(1)));
        assert!(
            shares_cpu(&many, 0, 10, |_| Some(10)),
            "recorded on CPU 10 (11)"
        );
        let w = workers(&[(r, b, 1), (r, b, 1), (r, b, 3)]);
        let mut allowed = rustix::thread::CpuSet::new();
        for c in 0..3 {
            allowed.set(c);
        }
        assert_eq!(free_cpu(&w, 1, &allowed), Some(1));
        allowed.unset(1);
        assert_eq!(
            free_cpu(&w, 1, &allowed),
            None,
            "no allowed CPU without a busy worker"
        );
        // A sleeping or departed worker holds no CPU.
        let w = workers(&[(r, s, 1), (wstate::DEAD, b, 1), (r, b, 1)]);
        assert!(!shares_cpu(&w, 2, 0, |_| Some(0)));
        allowed.set(1);
        assert_eq!(
            free_cpu(&w, 2, &allowed),
            Some(0),
            "its own record does not count"
        );
    }

    #[test]
    fn the_kernel_says_where_a_process_ran_last() {
        let cpu = kernel_cpu(std::process::id()).expect("our own /proc/PID/stat");
        assert!(cpu < rustix::thread::CpuSet::MAX_CPU);
        // This thread, held to one CPU, is running there as it asks (the test process's
        // leader may be waiting for it).
        let me = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        let allowed = rustix::thread::sched_getaffinity(None).expect("affinity");
        let here = rustix::thread::sched_getcpu();
        let mut one = rustix::thread::CpuSet::new();
        one.set(here);
        rustix::thread::sched_setaffinity(None, &one).expect("stay on this CPU");
        let seen = kernel_state(me);
        rustix::thread::sched_setaffinity(None, &allowed).expect("allowance back");
        assert_eq!(seen, Some((here, true)));
        assert_eq!(kernel_cpu(u32::MAX), None, "no such process");
    }
}
