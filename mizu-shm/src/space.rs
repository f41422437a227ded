//! How much `/dev/shm` holds — and `MIZU_SHM_BYTES`, which makes mizu behave as if it held
//! less (at most that many bytes in `mizu_*` objects), so that the behaviour of a small
//! `/dev/shm` (a container's default is 64 MiB) can be tested on any machine.

use std::sync::OnceLock;

/// The `MIZU_SHM_BYTES` limit, if set to a number of bytes.
fn limit() -> Option<u64> {
    static L: OnceLock<Option<u64>> = OnceLock::new();
    *L.get_or_init(|| std::env::var("MIZU_SHM_BYTES").ok()?.trim().parse().ok())
}

/// Bytes `/dev/shm` holds in all (or the `MIZU_SHM_BYTES` limit, when smaller). Sizes of
/// segments and budgets of memory held scale with it.
pub fn capacity() -> u64 {
    let total = rustix::fs::statvfs(crate::place::here().dir())
        .map(|s| s.f_blocks.saturating_mul(s.f_frsize))
        .unwrap_or(u64::MAX);
    limit().map_or(total, |l| l.min(total))
}

/// Bytes free for new segments now (the file system's, or what the `MIZU_SHM_BYTES` limit
/// leaves, when smaller).
pub fn available() -> u64 {
    let free = rustix::fs::statvfs(crate::place::here().dir())
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
        .unwrap_or(u64::MAX);
    left_under_limit().map_or(free, |l| l.min(free))
}

/// Under a `MIZU_SHM_BYTES` limit: the bytes left for a new segment (the limit less what the
/// `mizu_*` objects hold now); `None` without a limit.
pub(crate) fn left_under_limit() -> Option<u64> {
    let l = limit()?;
    let place = crate::place::here();
    let used: u64 = std::fs::read_dir(place.dir())
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(place.prefix()))
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    Some(l.saturating_sub(used))
}
