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
//! the records alone moved workers onto each other's real CPUs as often as it separated them; letting only the lower slot move left two
//! workers together whenever the higher one woke first. Nothing is pinned: the kernel stays
//! free to move a worker later, and threads a task starts may run anywhere the worker may.

use mizu_shm::sync::Ordering;

use crate::records::{WorkerSlot, idle};

/// A look after a wake: the CPU this worker runs on now, recorded; moved first when it shares
/// that CPU with another busy worker and another allowed CPU has no busy worker.
pub(super) fn settle(workers: &[WorkerSlot], slot: usize) {
    let here = rustix::thread::sched_getcpu();
    let mut now = here;
    if shares_cpu(workers, slot, here, kernel_cpu)
        && let Ok(allowed) = rustix::thread::sched_getaffinity(None)
        && let Some(free) = free_cpu(workers, slot, &allowed)
    {
        let mut one = rustix::thread::CpuSet::new();
        one.set(free);
        // (The move happens inside the first call, before it returns; the second keeps the
        // thread where it is, as its CPU is allowed.)
        if rustix::thread::sched_setaffinity(None, &one).is_ok() {
            let _ = rustix::thread::sched_setaffinity(None, &allowed);
            now = rustix::thread::sched_getcpu();
        }
    }
    record(&workers[slot], now);
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
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields 3, 4, ... follow the name: field 39 is the 37th of them.
    rest.split_ascii_whitespace().nth(36)?.parse().ok()
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
        assert_eq!(kernel_cpu(u32::MAX), None, "no such process");
    }
}
