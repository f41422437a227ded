//! CPU placement, so benchmarks can state and reproduce where each process runs.

use crate::error::{Result, ShmError};

/// Pins the calling thread (the whole process, when called before it starts threads) to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
        .map_err(|e| ShmError::io("sched_setaffinity", format!("cpu {cpu}"), e))
}

/// Number of CPUs this process may run on.
pub fn available_cpus() -> usize {
    rustix::thread::sched_getaffinity(None)
        .map(|s| s.count() as usize)
        .unwrap_or(1)
}
