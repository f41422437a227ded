//! What the bindings ask of the machine and of this process, beside pools: the process id
//! (cached), removing what dead processes left in shared memory, how much room `/dev/shm`
//! has, the names mizu holds there, and the floor every benchmark prints.

pub use mizu_shm::current_pid;

use crate::error::Result;

/// Removes what processes that are gone left: the references their ledgers list are given
/// back, then the segments and lock files of dead owners are removed. Returns the names
/// removed. Safe while other programs use mizu: only dead owners' leftovers go.
pub fn prune() -> Result<Vec<String>> {
    mizu_wire::ledger::release_dead(None);
    Ok(mizu_shm::prune()?)
}

/// Gives back at once what this process keeps only for reuse: idle data segments of every
/// pool and channel, and mappings of other processes' segments kept open (otherwise they go
/// after a few idle seconds).
pub fn give_back_idle_now() {
    mizu_wire::store::give_back_idle_now();
}

/// The notice of this process's first value spilled to the spill directory because `/dev/shm`
/// had no room (how much it holds, how to enlarge it), once: a binding shows it to its user
/// after the operation that spilled (a submission, a share); a worker prints it.
pub fn take_spill_notice() -> Option<String> {
    mizu_wire::store::take_spill_notice()
}

/// Bytes `/dev/shm` holds in all (or the `MIZU_SHM_BYTES` limit, when smaller).
pub fn shm_capacity() -> u64 {
    mizu_shm::space::capacity()
}

/// Bytes free in `/dev/shm` for new segments now (under the `MIZU_SHM_BYTES` limit, when set).
pub fn shm_available() -> u64 {
    mizu_shm::space::available()
}

/// The names this machine's shared-memory directory holds under mizu's prefix (any process's,
/// alive or not): for tests that check nothing was left behind.
pub fn shm_names() -> Vec<String> {
    let Ok(place) = mizu_shm::place::current() else {
        return Vec::new();
    };
    std::fs::read_dir(place.dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(place.prefix()))
                .collect()
        })
        .unwrap_or_default()
}

/// Nanoseconds for one cache line's round trip between CPUs `a` and `b` now (the median of
/// `runs` runs of `rounds`): the floor under any shared-memory round trip. It spins both CPUs.
pub fn line_round_trip(a: usize, b: usize, rounds: u64, runs: usize) -> Result<f64> {
    Ok(mizu_shm::affinity::line_round_trip(a, b, rounds, runs)?)
}
