//! Which CPU a worker runs on: the kernel's choice, corrected when it puts two of the pool's
//! busy workers, or a worker and the caller waiting for it, on one CPU while another has
//! neither.
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
//! A caller queued behind the worker counts as another busy worker: a worker woken onto the
//! CPU of the caller that woke it often takes that CPU at once (the caller is preempted, and
//! runnable), while the other CPU idles; the caller, which has the map's other chunks to
//! send, then waits for the worker's time slice (a map of 1 ms elements started its second
//! worker 1.5–6 ms late this way). The worker moves to a CPU with neither a busy worker nor a
//! running caller.
//!
//! The caller helps from its side ([`hand_over`]): a worker woken while every CPU was busy can
//! also be queued behind another worker, which looked already and found no one; it cannot look
//! until it runs. A caller about to sleep after waking workers moves such a worker to its own
//! CPU.
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
/// busy worker or a caller queued behind it, and another allowed CPU has no busy worker (nor a
/// running caller, with `callers` or when moving off a caller's CPU).
fn look(v: &PoolView<'_>, slot: usize, callers: bool) -> Look {
    let workers = v.workers();
    let here = rustix::thread::sched_getcpu();
    let mut now = here;
    let mut found = Look::Settled;
    // Where callers run, read once, when needed.
    let mut running = None;
    let mut caller_on = |cpu: usize| {
        running
            .get_or_insert_with(|| callers_running(v))
            .contains(&cpu)
    };
    // (An allowance of one CPU leaves nothing to choose; it may also be a caller's move of
    // this worker in progress, which must not become the allowance given back: see
    // [`hand_over`].)
    if let Ok(allowed) = rustix::thread::sched_getaffinity(None)
        && allowed.count() > 1
        && let Some(free) = free_cpu(workers, slot, here, &allowed)
    {
        let with_worker = shares_cpu(workers, slot, here, kernel_cpu);
        // A caller "running" on this CPU while this worker runs here is queued behind it.
        let with_caller = !with_worker && caller_on(here);
        if with_worker && callers && caller_on(free) {
            found = Look::CallerThere;
        } else if with_caller && caller_on(free) {
            // (Callers on every CPU without a busy worker: nowhere better to go.)
        } else if (with_worker || with_caller) && hop(None, free, &allowed) {
            now = rustix::thread::sched_getcpu();
        }
    }
    record(&workers[slot], now);
    found
}

/// Run by a caller about to sleep that woke sleeping workers since it last slept: when the
/// kernel queued two of the pool's busy workers on one CPU and none on the caller's, one of
/// them is moved to the caller's CPU, which is free once the caller sleeps.
///
/// A worker woken while every CPU was busy (the caller ran on the other one) is queued where
/// the kernel found room, often behind the worker woken just before it, which has already
/// looked and found no one. It cannot look until it runs, and it runs when the other's time
/// slice ends: on 2 CPUs, in a map of 1 ms elements, the second worker started 1–6 ms late in
/// half the maps while the caller's CPU idled. Only small pools are looked at (each worker
/// is a `/proc` read); the worker moved this way looks for itself when it runs, as after any
/// wake.
pub(crate) fn hand_over(v: &PoolView<'_>) {
    let workers = v.workers();
    if workers.len() > ASK_ALL || workers.iter().filter(|w| busy(w)).count() < 2 {
        return;
    }
    let here = rustix::thread::sched_getcpu();
    // The busy workers running or queued, with their CPUs and whether that is where their
    // record says they looked last (one woken and queued since has not looked there yet).
    // Those recorded on this CPU are asked about first: one the kernel has queued here ends
    // the look after one read (~7 µs each, while that worker waits for this CPU).
    let mut busy_ones: Vec<&WorkerSlot> = workers.iter().filter(|w| busy(w)).collect();
    busy_ones.sort_by_key(|w| w.rec.cpu.load(Ordering::Relaxed) != here as u32 + 1);
    let mut runnable = Vec::with_capacity(workers.len());
    for w in busy_ones {
        let pid = w.rec.pid.load(Ordering::Relaxed);
        match kernel_state(pid) {
            Some((cpu, true)) if cpu == here => return,
            Some((cpu, true)) => runnable.push((
                pid,
                cpu,
                w.rec.cpu.load(Ordering::Relaxed) == cpu as u32 + 1,
            )),
            _ => {}
        }
    }
    if let Some(pid) = crowded(&runnable) {
        move_to(pid, here);
    }
}

/// Of busy workers `(pid, cpu, looked there)` running or queued, one sharing its CPU with
/// another: preferably one that has not looked there (it waits behind the other), else the
/// last found.
fn crowded(runnable: &[(u32, usize, bool)]) -> Option<u32> {
    let sharing: Vec<_> = runnable
        .iter()
        .filter(|r| runnable.iter().filter(|o| o.1 == r.1).count() > 1)
        .collect();
    sharing
        .iter()
        .find(|r| !r.2)
        .or(sharing.last())
        .map(|r| r.0)
}

/// Moves process `pid` to `cpu` and gives it back its allowance (which leaves it there),
/// unless it may not run there or is allowed one CPU only (held there on purpose, or in the
/// middle of its own move: see [`look`]).
fn move_to(pid: u32, cpu: usize) {
    let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    let Ok(allowed) = rustix::thread::sched_getaffinity(Some(p)) else {
        return;
    };
    if allowed.count() > 1 && allowed.is_set(cpu) {
        hop(Some(p), cpu, &allowed);
    }
}

/// Moves a process (None: this thread) to `cpu` and gives it back `allowed`: the move
/// happens inside the first call, before it returns; the second leaves it where it is, as
/// that CPU is allowed. True if it moved.
fn hop(pid: Option<rustix::process::Pid>, cpu: usize, allowed: &rustix::thread::CpuSet) -> bool {
    let mut one = rustix::thread::CpuSet::new();
    one.set(cpu);
    let moved = rustix::thread::sched_setaffinity(pid, &one).is_ok();
    if moved {
        let _ = rustix::thread::sched_setaffinity(pid, allowed);
    }
    moved
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
    // One read into a buffer of the line's greatest length: `read_to_string` asks for the
    // file's size (0 for `/proc`) and reads in doubling pieces, 9 system calls instead of 3,
    // and this runs when a caller parks after waking workers and when a woken worker looks
    // where the others are (~3.5 of ~11 µs a read in a VM).
    let mut buf = [0u8; 2048];
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut len = 0;
    while len < buf.len() {
        match std::io::Read::read(&mut file, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
        // The kernel writes the line whole in one read; a second would only find its end.
        if buf[..len].ends_with(b"\n") {
            break;
        }
    }
    let stat = std::str::from_utf8(&buf[..len]).ok()?;
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

/// An allowed CPU other than `here` no busy worker but this one is recorded on.
fn free_cpu(
    workers: &[WorkerSlot],
    slot: usize,
    here: usize,
    allowed: &rustix::thread::CpuSet,
) -> Option<usize> {
    (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| c != here && allowed.is_set(c))
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

    use crate::records::slots_with as workers;

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
        assert_eq!(free_cpu(&w, 1, 2, &allowed), Some(1));
        assert_eq!(free_cpu(&w, 1, 1, &allowed), None, "not where it is");
        allowed.unset(1);
        assert_eq!(
            free_cpu(&w, 1, 2, &allowed),
            None,
            "no allowed CPU without a busy worker"
        );
        // A sleeping or departed worker holds no CPU.
        let w = workers(&[(r, s, 1), (wstate::DEAD, b, 1), (r, b, 1)]);
        assert!(!shares_cpu(&w, 2, 0, |_| Some(0)));
        allowed.set(1);
        assert_eq!(
            free_cpu(&w, 2, 5, &allowed),
            Some(0),
            "its own record does not count"
        );
    }

    #[test]
    fn a_caller_hands_its_cpu_to_a_worker_queued_behind_another() {
        // (pid, CPU, looked there): 11 was woken onto CPU 1, where 10 runs and last looked.
        assert_eq!(crowded(&[(10, 1, true), (11, 1, false)]), Some(11));
        assert_eq!(crowded(&[(11, 1, false), (10, 1, true)]), Some(11));
        // Both looked there (one was moved onto the other since): either goes.
        assert_eq!(crowded(&[(10, 1, true), (11, 1, true)]), Some(11));
        // One per CPU, or one alone: nothing to hand over.
        assert_eq!(crowded(&[(10, 1, true), (11, 0, false)]), None);
        assert_eq!(crowded(&[(10, 1, false)]), None);
        assert_eq!(
            crowded(&[(10, 2, true), (11, 1, true), (12, 1, false)]),
            Some(12)
        );
    }

    #[test]
    fn a_process_is_moved_to_a_cpu_and_given_back_its_allowance() {
        /// A real process that keeps running (a sleeping one only moves when it wakes),
        /// killed however the test ends.
        struct Spinner(std::process::Child);
        impl Drop for Spinner {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let child = Spinner(
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("sh"),
        );
        let pid = child.0.id();
        let p = rustix::process::Pid::from_raw(pid as i32);
        let allowed = rustix::thread::sched_getaffinity(p).expect("its allowance");
        let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| allowed.is_set(c))
            .collect();
        if cpus.len() > 1 {
            // Each time to a CPU it is not on. The kernel's own balancing moves it too, but
            // seldom between two reads microseconds apart (none in 200 tries without the
            // move, against 88-99 in 100 with it: a quarter leaves room for a busy machine).
            let moved = (0..100)
                .filter(|_| {
                    let at = kernel_cpu(pid).expect("its /proc/PID/stat");
                    let to = *cpus.iter().find(|&&c| c != at).expect("another CPU");
                    move_to(pid, to);
                    kernel_cpu(pid) == Some(to)
                })
                .count();
            assert!(moved > 25, "moved to the CPU asked {moved} times in 100");
            assert_eq!(
                rustix::thread::sched_getaffinity(p).expect("its allowance"),
                allowed,
                "its allowance given back"
            );
        }
        // Held on one CPU (on purpose, or by its own move in progress): left alone.
        let mut one = rustix::thread::CpuSet::new();
        one.set(cpus[0]);
        rustix::thread::sched_setaffinity(p, &one).expect("hold it on one CPU");
        move_to(pid, *cpus.last().expect("a CPU"));
        assert_eq!(
            rustix::thread::sched_getaffinity(p).expect("its allowance"),
            one
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
