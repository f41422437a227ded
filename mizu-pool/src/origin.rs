//! Which process made an object. Pools, tasks and channels live in the process that made
//! them: a forked child inherits a copy of each, but the workers, peers and shared memory
//! belong to the parent. A copy used in the child fails with [`PoolError::Forked`]; dropped
//! there, it touches nothing shared (the parent still uses all of it). And whether this
//! process is a pool's worker.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{PoolError, Result};

static WORKER: AtomicBool = AtomicBool::new(false);

/// This process becomes a pool's worker ([`crate::run_worker`]).
pub(crate) fn joining() {
    WORKER.store(true, Ordering::SeqCst);
}

/// Whether this process is a pool's worker (it called [`crate::run_worker`]).
pub(crate) fn in_worker_process() -> bool {
    WORKER.load(Ordering::Relaxed)
}

/// The process an object was made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin(u32);

impl Origin {
    /// The calling process.
    pub fn here() -> Origin {
        Origin(mizu_shm::current_pid())
    }

    /// Whether the calling process is the one this object was made in (false in a forked
    /// child). Costs no system call.
    #[inline]
    pub fn is_here(self) -> bool {
        self.0 == mizu_shm::current_pid()
    }

    /// `Err(PoolError::Forked)` in a forked child.
    #[inline]
    pub fn check(self) -> Result<()> {
        if self.is_here() {
            Ok(())
        } else {
            Err(PoolError::Forked)
        }
    }

    /// The process id.
    pub fn pid(self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_made_here_is_here() {
        let o = Origin::here();
        assert!(o.is_here());
        assert!(o.check().is_ok());
        assert_eq!(o.pid(), std::process::id());
        assert!(matches!(Origin(o.0 ^ 1).check(), Err(PoolError::Forked)));
    }
}
