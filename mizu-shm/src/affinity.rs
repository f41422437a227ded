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
}
