//! The worker's heap between tasks: the allocator keeps what a task frees for the next one,
//! and an idle worker gives it back.

use std::ffi::c_int;

/// Makes this worker's allocator keep memory it frees for the next task. R allocates vectors
/// past 128 KiB with `malloc`, which by default maps each one afresh and unmaps it when freed
/// (or trims the heap): a task that makes a 400 KB column paid ~100 page faults and an unmap
/// for it every time, a fifth of a data frame task's time here. Freed memory up to
/// [`KEPT_FREE`] stays in the heap; an idle worker gives it back (see the worker's `idle`).
pub(crate) fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    {
        // glibc's `mallopt` parameters (`malloc.h`).
        const M_TRIM_THRESHOLD: c_int = -1;
        const M_MMAP_THRESHOLD: c_int = -3;
        // SAFETY: glibc's `mallopt` only sets allocator parameters; called before this
        // thread runs any task (other threads of the process do not allocate from R).
        unsafe {
            mallopt(M_MMAP_THRESHOLD, MAPPED_FROM as c_int);
            mallopt(M_TRIM_THRESHOLD, KEPT_FREE as c_int);
        }
    }
}

/// Allocations from this size on are mapped on their own (and unmapped when freed): the
/// largest threshold glibc sets by itself.
const MAPPED_FROM: usize = 32 << 20;
/// Free memory at the top of the heap that a working worker keeps.
const KEPT_FREE: usize = 128 << 20;

#[cfg(target_env = "gnu")]
unsafe extern "C" {
    fn mallopt(param: c_int, value: c_int) -> c_int;
    fn malloc_trim(pad: usize) -> c_int;
}

/// Gives the memory the allocator kept (see [`keep_freed_memory`]) back to the system.
pub(crate) fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: glibc's `malloc_trim` only returns free pages; R's main thread, between tasks.
    unsafe {
        malloc_trim(0);
    }
}

/// Growth of resident memory since the last long idle that makes an idle worker run a full
/// collection and give the freed memory back.
pub(crate) const GREW_BY: u64 = 64 << 20;

/// This process's resident memory in bytes (`/proc/self/statm`; 0 where it cannot be read).
pub(crate) fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * rustix::param::page_size() as u64)
}
