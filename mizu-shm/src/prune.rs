//! Removal of what dead processes left in the shared-memory directory (`/dev/shm`).

use rustix::io::Errno;

use crate::error::{Result, ShmError};
use crate::liveness::{ProcessId, pid_exists};
use crate::name::SegmentName;

/// Removes every segment whose creator is dead and every lock file of a dead process;
/// returns the names removed. A live process's files are never touched.
pub fn prune() -> Result<Vec<String>> {
    prune_where(|_| true)
}

/// [`prune`] limited to what the processes `pids` left (once they are dead): for an owner
/// cleaning up after its own children without touching other programs' in-flight data.
pub fn prune_of(pids: &[u32]) -> Result<Vec<String>> {
    prune_where(|pid| pids.contains(&pid))
}

fn prune_where(wanted: impl Fn(u32) -> bool) -> Result<Vec<String>> {
    let mut removed = prune_spilled(&wanted);
    removed.extend(prune_shm(&wanted)?);
    Ok(removed)
}

/// The spilled segments of dead creators (their lock files are in the shared-memory
/// directory, which [`prune_shm`] prunes after this).
fn prune_spilled(wanted: &impl Fn(u32) -> bool) -> Vec<String> {
    let Some(dir) = crate::place::spill_dir() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for n in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
        let Ok(seg) = SegmentName::parse(&n) else {
            continue;
        };
        if seg.is_spilled()
            && wanted(seg.creator().pid)
            && !seg.creator().is_alive()
            && crate::segment::remove_name(&seg.path()).is_ok()
        {
            removed.push(n);
        }
    }
    removed
}

fn prune_shm(wanted: &impl Fn(u32) -> bool) -> Result<Vec<String>> {
    let place = crate::place::current()?;
    let shown = place.dir().display().to_string();
    let dir = std::fs::read_dir(place.dir()).map_err(|e| ShmError::io("read_dir", &shown, e))?;
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(place.prefix()))
        .collect();
    // Segments first: their owner's lock file is what says the owner is dead.
    names.sort_by_key(|n| n.contains(".lock"));
    let mut removed = Vec::new();
    for n in names {
        let owner = lock_owner(&n, ".lock")
            .or_else(|| lock_owner(&n, ".lock.tmp"))
            .map(|id| id.pid)
            .or_else(|| SegmentName::parse(&n).ok().map(|s| s.creator().pid));
        if !owner.is_some_and(wanted) {
            continue;
        }
        if let Some(id) = lock_owner(&n, ".lock") {
            if id.reap() {
                removed.push(n);
            }
        } else if let Some(id) = lock_owner(&n, ".lock.tmp") {
            // A lock file is renamed into place only once locked; a temporary one whose PID
            // is gone was left by a process killed mid-creation.
            if !pid_exists(id.pid) && rustix::fs::unlink(place.path_of(&n)).is_ok() {
                removed.push(n);
            }
        } else if let Ok(seg) = SegmentName::parse(&n)
            && !seg.creator().is_alive()
        {
            match crate::segment::remove_name(&seg.path()) {
                Ok(()) => removed.push(n),
                Err(Errno::NOENT) => {}
                Err(e) => return Err(ShmError::io("unlink", seg.as_str(), e)),
            }
        }
    }
    Ok(removed)
}

fn lock_owner(name: &str, suffix: &str) -> Option<ProcessId> {
    let body = name
        .strip_prefix(crate::place::here().prefix())?
        .strip_suffix(suffix)?;
    let (pid, nonce) = body.split_once('_')?;
    if nonce.len() != 16 {
        return None;
    }
    Some(ProcessId::new(
        u32::from_str_radix(pid, 16).ok()?,
        u64::from_str_radix(nonce, 16).ok()?,
    ))
}
