//! Extra submitters: other processes attach to a running pool by token and submit tasks of
//! their own (their results come back to them, not to the controller).

use std::sync::Arc;
use std::time::Duration;

use crate::error::{PoolError, Result};
use crate::layout::POOL_KIND;
use crate::records::Holder;
use crate::shared::Shared;
use crate::submitter::{SubmitterCore, Task};

/// A submitter attached to someone else's pool.
pub struct Submitter {
    core: Arc<SubmitterCore>,
}

impl Submitter {
    /// Attaches to the pool named by `token`, taking a free submitter record.
    pub fn attach(token: &str) -> Result<Submitter> {
        let shared = Shared::new(mizu_shm::Segment::open(token, POOL_KIND)?)?;
        let v = shared.view();
        let first = 1 + v.params.max_workers as usize;
        let me = mizu_shm::current_pid();
        let index = (first..v.params.submitters as usize)
            .find(|&s| {
                // A record is free when unused, or when its previous holder (or a process
                // that was taking it) died.
                v.submitter(s).rec.take(me, |h| match h {
                    Holder::Held(pid, nonce) => mizu_shm::ProcessId::new(pid, nonce).is_alive(),
                    Holder::Taking(pid) => mizu_shm::pid_runs(pid),
                })
            })
            .ok_or_else(|| {
                PoolError::Config(format!(
                    "all {} extra submitter records are taken",
                    v.params.submitters as usize - first
                ))
            })?;
        let spin = Duration::from_micros(u64::from(v.params.spin_us));
        let rec = &v.submitter(index).rec;
        match SubmitterCore::new(shared.clone(), index, spin) {
            Ok(core) => Ok(Submitter { core }),
            Err(e) => {
                rec.release();
                Err(e)
            }
        }
    }

    /// Submits a task.
    pub fn submit(&self, payload: &[u8]) -> Result<Task> {
        self.core.submit(&payload, None)
    }

    /// This submitter's record index.
    pub fn index(&self) -> usize {
        self.core.index()
    }
}

impl Drop for Submitter {
    fn drop(&mut self) {
        // Outstanding tasks keep the core alive; the record is released for reuse now.
        self.core
            .shared()
            .view()
            .submitter(self.core.index())
            .rec
            .release();
    }
}
