//! Whether the machine's CPUs are oversubscribed now, by any process.
//!
//! A pool's records say what its own workers do; a CPU they leave free may still be wanted by
//! everything else — a Dask scheduler beside its workers, another pool, a build. A watcher
//! polling there takes it from them: with Dask distributed on two CPUs, the event loops of
//! its workers watched through ~15 loop rounds a task while its scheduler waited for a CPU.
//! So a watch, which takes a CPU only when one is free, also asks the kernel: its count of
//! runnable threads (the fourth field of `/proc/loadavg`, "runnable/total", this thread
//! included) against the CPUs online. The count is the whole machine's, as are the CPUs it
//! is compared with (a container limited to some CPUs of a larger machine sees the machine's
//! load spread over all of them: it is crowded only when the machine is). It is read at most
//! once a millisecond (a read costs a few microseconds); where it cannot be read, nothing is
//! ever crowded.
//!
//! Idle workers keep their short adaptive spin regardless: on this VM, a worker that parked
//! at once whenever the count was high answered a task submitted 2 ms later in ~700 µs
//! instead of ~25.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a reading of the load stands.
const FRESH: Duration = Duration::from_millis(1);

/// Whether the threads runnable on this machine, besides the one asking, outnumber the CPUs
/// online: someone already waits for a CPU. (Not "as many as": an idle worker of another
/// pool spinning for a moment after its task must not count as a crowd.)
pub(crate) fn crowded() -> bool {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    // When (ns after EPOCH) the reading below goes stale.
    static STALE_AT: AtomicU64 = AtomicU64::new(0);
    // The last reading: the runnable threads (this one included).
    static RUNNABLE: AtomicU64 = AtomicU64::new(0);
    let Some(online) = online_cpus() else {
        return false;
    };
    let now = EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64;
    let stale = STALE_AT.load(Ordering::Relaxed);
    // (One thread reads it; the others use the last reading meanwhile.)
    let runnable_now = if now >= stale
        && STALE_AT
            .compare_exchange(
                stale,
                now + FRESH.as_nanos() as u64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    {
        let r = runnable().unwrap_or(0) as u64;
        RUNNABLE.store(r, Ordering::Relaxed);
        r
    } else {
        RUNNABLE.load(Ordering::Relaxed)
    };
    runnable_now.saturating_sub(1) > online as u64
}

/// The machine's runnable threads now (this one included).
fn runnable() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_runnable(&text)
}

/// The fourth field of `/proc/loadavg`: "0.52 0.58 0.59 3/512 12345" has 3 runnable.
fn parse_runnable(text: &str) -> Option<usize> {
    text.split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// The CPUs online on this machine (not only those this process may use).
fn online_cpus() -> Option<usize> {
    static ONLINE: OnceLock<Option<usize>> = OnceLock::new();
    *ONLINE.get_or_init(|| {
        let text = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
        parse_cpu_list(text.trim()).filter(|&n| n > 0)
    })
}

/// How many CPUs a kernel CPU list names ("0-3,6,8-9": 7).
fn parse_cpu_list(text: &str) -> Option<usize> {
    text.split(',').try_fold(0usize, |n, part| {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        (hi >= lo).then(|| n + hi - lo + 1)
    })
}

#[cfg(test)]
mod tests {
    use super::{crowded, online_cpus, parse_cpu_list, parse_runnable, runnable};

    #[test]
    fn the_kernels_formats_are_read() {
        assert_eq!(parse_runnable("0.52 0.58 0.59 3/512 12345\n"), Some(3));
        assert_eq!(parse_runnable("0.52 0.58"), None);
        assert_eq!(parse_runnable("a b c x/5 1"), None);
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,6,8-9"), Some(7));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), None);
    }

    #[test]
    fn this_machine_counts_itself_running() {
        // (Linux: both files exist; the asking thread is runnable.)
        assert!(online_cpus().is_some_and(|n| n >= 1));
        assert!(runnable().is_some_and(|r| r >= 1));
    }

    #[test]
    fn a_machine_with_its_cpus_all_spinning_is_crowded() {
        // More threads spinning than CPUs online, besides this one: the runnable count says
        // so however the kernel places them (the reading is at most a millisecond old).
        let n = online_cpus().expect("CPUs online") + 1;
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..n {
                s.spawn(|| {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                });
            }
            let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let mut seen = false;
            while !seen && std::time::Instant::now() < end {
                seen = crowded();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(seen, "never crowded with {n} threads spinning");
        });
    }
}
