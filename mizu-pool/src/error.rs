//! Errors of the pool runtime.

use std::time::Duration;

/// Why a pool operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The configuration (of a pool or a channel) is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The pool segment is inconsistent (corrupted, or another layout).
    #[error("invalid pool segment: {0}")]
    Layout(String),
    /// Shared memory failed.
    #[error(transparent)]
    Shm(#[from] mizu_shm::ShmError),
    /// Payload storage failed.
    #[error(transparent)]
    Wire(#[from] mizu_wire::WireError),
    /// A worker could not be started.
    #[error("cannot launch worker {slot}: {why}")]
    Launch {
        /// Worker slot.
        slot: usize,
        /// What went wrong.
        why: String,
    },
    /// A channel's peer could not be started, or did not attach in time.
    #[error("cannot start the channel's peer: {0}")]
    PeerLaunch(String),
    /// Every task slot of this submitter is in use.
    #[error("all {0} task slots of this submitter are in use: collect or drop some tasks")]
    SlotsExhausted(usize),
    /// No worker could take the task within the timeout.
    #[error("submit timed out after {0:?}: every worker's queue is full")]
    SubmitTimeout(Duration),
    /// The pool was stopped.
    #[error("the pool is stopped")]
    Stopped,
    /// The caller gave up waiting for the workers to join (see [`crate::Pool::new_interruptible`]).
    #[error("interrupted while the workers were starting")]
    Interrupted,
    /// The object belongs to the process that made it; this is a forked child of that
    /// process (see [`crate::Origin`]).
    #[error(
        "this object belongs to the parent process; a forked child cannot use it (create a new pool in the child)"
    )]
    Forked,
}

/// How a task failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// The executor returned an error (its bytes are the payload).
    #[error("task failed ({} bytes of error payload)", .0.len())]
    Failed(Vec<u8>),
    /// The worker process died while running the task.
    #[error("worker {slot} (pid {pid}) died while running the task")]
    WorkerDied {
        /// Worker slot.
        slot: usize,
        /// Its process id.
        pid: u32,
    },
    /// The task ran longer than the pool's execution timeout; its worker was replaced.
    #[error(
        "task exceeded the execution timeout on worker {slot} (pid {pid}), which was killed and replaced"
    )]
    ExecTimeout {
        /// Worker slot.
        slot: usize,
        /// Its process id.
        pid: u32,
    },
    /// The task was cancelled before it ran.
    #[error("task was cancelled")]
    Cancelled,
    /// The pool stopped before the task ran.
    #[error("the pool stopped before the task ran")]
    Stopped,
    /// The runtime itself failed the task: its input could not be read or its result could
    /// not be stored (a full `/dev/shm`, say). Not a payload of the executor's.
    #[error("{0}")]
    Runtime(String),
}

/// Result alias.
pub type Result<T, E = PoolError> = std::result::Result<T, E>;
