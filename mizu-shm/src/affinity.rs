//! CPU placement, so benchmarks can state and reproduce where each process runs.

use crate::error::{Result, ShmError};

/// Pins the calling thread (the whole process, when called before it starts threads) to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> Result<()> {
    allow_cpus(&[cpu])
}

/// Restricts the calling thread to `cpus`.
pub fn allow_cpus(cpus: &[usize]) -> Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    for &c in cpus {
        if c >= rustix::thread::CpuSet::MAX_CPU {
            return Err(ShmError::io(
                "sched_setaffinity",
                format!("cpus {cpus:?}"),
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            ));
        }
        set.set(c);
    }
    rustix::thread::sched_setaffinity(None, &set)
        .map_err(|e| ShmError::io("sched_setaffinity", format!("cpus {cpus:?}"), e))
}

/// Every online CPU, whatever the current affinity (so a pinned process can unpin itself).
pub fn available_cpus_all() -> Vec<usize> {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(s.trim()))
        .unwrap_or_else(|| (0..n).collect())
}

/// The machine's floor for any shared-memory round trip, now: nanoseconds for one cache line
/// to go from CPU `a` to CPU `b` and back (two threads pinned there, each waiting for the
/// other's store), the median of `runs` runs of `rounds` round trips. A task round trip
/// moves at least one line each way, so it costs at least this. On a VM this changes with
/// where the host puts the virtual CPUs: ~100 ns at one time, ~400 ns at another, on this
/// project's 2-CPU machines. Benchmarks print it beside their round trips. It spins both
/// CPUs: call it when nothing else runs.
pub fn line_round_trip(a: usize, b: usize, rounds: u64, runs: usize) -> Result<f64> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    /// One line per direction, so each store moves exactly one line.
    #[repr(align(128))]
    struct Line(AtomicU64);
    /// Written to the first line instead of a round number: the echo thread stops.
    const STOP: u64 = u64::MAX;
    let fail = |why: &str| {
        ShmError::io(
            "line_round_trip",
            format!("cpus {a} and {b}"),
            std::io::Error::other(why.to_string()),
        )
    };
    if a == b {
        // Two spinning threads on one CPU would take turns by time slices.
        return Err(fail("needs two different CPUs"));
    }
    let (rounds, runs) = (rounds.max(1), runs.max(1));
    // [ping, pong, echo's pinning: 0 pending, 1 done, 2 failed]
    let lines = Arc::new([
        Line(AtomicU64::new(0)),
        Line(AtomicU64::new(0)),
        Line(AtomicU64::new(0)),
    ]);
    let echo = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            let pinned = pin_to_cpu(b);
            lines[2]
                .0
                .store(if pinned.is_ok() { 1 } else { 2 }, Ordering::Release);
            pinned?;
            let mut i = 1;
            loop {
                let got = lines[0].0.load(Ordering::Acquire);
                if got == STOP {
                    return Ok(());
                }
                if got == i {
                    lines[1].0.store(i, Ordering::Release);
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        })
    };
    let pinned = pin_to_cpu_of_new_thread(a, || {
        // (A hang guard: the echo thread reports within microseconds.)
        let start = std::time::Instant::now();
        while lines[2].0.load(Ordering::Acquire) == 0
            && start.elapsed() < std::time::Duration::from_secs(10)
        {
            std::hint::spin_loop();
        }
        let mut out = Vec::new();
        if lines[2].0.load(Ordering::Acquire) != 1 {
            return out;
        }
        let mut i = 0;
        for _ in 0..runs {
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                i += 1;
                lines[0].0.store(i, Ordering::Release);
                while lines[1].0.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
            }
            out.push(t.elapsed().as_nanos() as f64 / rounds as f64);
        }
        out
    });
    // Whatever happened, the echo thread ends.
    lines[0].0.store(STOP, Ordering::Release);
    let echoed = echo.join().map_err(|_| fail("the echo thread panicked"))?;
    let mut times = pinned?;
    echoed?;
    if times.is_empty() {
        return Err(fail("no measurement"));
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Runs `f` on a new thread pinned to `cpu` (the caller's own placement stays as it is).
fn pin_to_cpu_of_new_thread<T: Send>(cpu: usize, f: impl FnOnce() -> T + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| pin_to_cpu(cpu).map(|()| f()))
            .join()
            .unwrap_or_else(|_| {
                Err(ShmError::io(
                    "line_round_trip",
                    format!("cpu {cpu}"),
                    std::io::Error::other("the timing thread panicked"),
                ))
            })
    })
}

fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut v = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => v.push(part.parse().ok()?),
        }
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists_parse() {
        assert_eq!(super::parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(super::parse_cpu_list("0,2-3,5"), Some(vec![0, 2, 3, 5]));
        assert_eq!(super::parse_cpu_list("x"), None);
    }

    #[test]
    fn a_line_round_trip_between_two_cpus_is_measured() {
        let cpus = super::available_cpus_all();
        let (a, b) = (cpus[0], *cpus.last().unwrap());
        assert!(super::line_round_trip(a, a, 10, 1).is_err());
        // A CPU that does not exist, on either side: an error, not a hang.
        assert!(super::line_round_trip(a, 100_000, 10, 1).is_err());
        assert!(super::line_round_trip(100_000, a, 10, 1).is_err());
        if a != b {
            let ns = super::line_round_trip(a, b, 1000, 3).unwrap();
            assert!(ns.is_finite() && ns > 0.0, "{ns}");
        }
    }
}
