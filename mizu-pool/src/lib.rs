//! The mizu runtime: pools of worker processes with no dispatcher. Submitters write task ids
//! into per-(submitter, worker) rings and payloads into their own task slots; workers claim
//! tasks by CAS (crash-safely, with a claim record), run them through an [`Executor`] and
//! write results back into the slot; large payloads travel through `mizu-wire` data segments.
//! See the crate README for the design and its invariants.

pub mod attach;
pub mod channel;
pub mod error;
pub mod layout;
pub mod map;
pub mod pool;
pub mod shared;
pub mod submitter;
pub mod worker;

pub use attach::Submitter;
pub use channel::{Channel, ChannelSendError};
pub use error::{PoolError, Result, TaskError};
pub use map::{MapError, MapOptions, MapOutput};
pub use mizu_queue::{RecvError, SlotState};
pub use pool::{Launcher, Pool, PoolConfig, PoolStatus, SubmitterStatus, WorkerStatus};
pub use shared::{Fill, set_discard_hook};
pub use submitter::{CollectError, Task, collect_all, collect_any, wait_until};
pub use worker::{
    Executor, TaskContext, exit_if_orphaned_while_starting, run_worker, with_current_task,
};
