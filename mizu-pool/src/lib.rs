//! The mizu runtime: pools of worker processes with no dispatcher. Submitters write task ids
//! into per-(submitter, worker) rings and payloads into their own task slots; workers claim
//! tasks by CAS (crash-safely, with a claim record), run them through an [`Executor`] and
//! write results back into the slot; large payloads travel through `mizu-wire` data segments.
//! See the crate README for the design and its invariants.
//!
//! # Example
//!
//! One program as controller and workers (the pool starts it again with the pool's token and
//! a slot; `examples/upper.rs` runs it):
//!
//! ```no_run
//! use mizu_pool::{Executor, Launcher, Pool, PoolConfig, TaskContext, run_worker};
//!
//! struct Upper;
//! impl Executor for Upper {
//!     fn execute(&self, _: &TaskContext<'_>, input: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
//!         Ok(input.to_ascii_uppercase())
//!     }
//! }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let args: Vec<String> = std::env::args().collect();
//!     if let [_, flag, token, slot] = args.as_slice() && flag == "--worker" {
//!         return Ok(run_worker(token, slot.parse()?, &Upper)?);
//!     }
//!     let launcher = Launcher::new(std::env::current_exe()?, ["--worker"]);
//!     let pool = Pool::new(PoolConfig { workers: 2, ..Default::default() }, launcher)?;
//!     let mut task = pool.submit(b"hello")?;
//!     assert_eq!(task.result(None)?.as_slice(), b"HELLO");
//!     Ok(())
//! }
//! ```

// The atomic protocols that involve no segment: public to the loom models only
// (`tests/loom.rs` under `--cfg mizu_loom`), which run this very code.
#[cfg(not(mizu_loom))]
pub mod chunks;
#[cfg(mizu_loom)]
pub mod claim;
#[cfg(not(mizu_loom))]
mod claim;
#[cfg(mizu_loom)]
pub mod handout;
#[cfg(not(mizu_loom))]
mod handout;
#[cfg(mizu_loom)]
pub mod records;
#[cfg(not(mizu_loom))]
mod records;

#[cfg(not(mizu_loom))]
mod ahead;
#[cfg(not(mizu_loom))]
mod attach;
#[cfg(not(mizu_loom))]
mod channel;
#[cfg(not(mizu_loom))]
mod collect;
#[cfg(not(mizu_loom))]
mod context;
#[cfg(not(mizu_loom))]
mod error;
#[cfg(all(not(mizu_loom), feature = "test-helpers"))]
pub mod fuzzing;
#[cfg(not(mizu_loom))]
mod geometry;
#[cfg(not(mizu_loom))]
mod layout;
#[cfg(not(mizu_loom))]
mod load;
#[cfg(not(mizu_loom))]
mod loop_watch;
#[cfg(not(mizu_loom))]
pub mod machine;
#[cfg(not(mizu_loom))]
mod map;
#[cfg(not(mizu_loom))]
mod map_segment;
#[cfg(not(mizu_loom))]
mod origin;
#[cfg(not(mizu_loom))]
mod outcome;
#[cfg(not(mizu_loom))]
mod pool;
#[cfg(not(mizu_loom))]
pub mod pressure;
#[cfg(not(mizu_loom))]
pub mod repeats;
#[cfg(not(mizu_loom))]
pub mod retry;
#[cfg(not(mizu_loom))]
pub mod share;
#[cfg(not(mizu_loom))]
mod shared;
#[cfg(not(mizu_loom))]
mod submitter;
#[cfg(not(mizu_loom))]
mod watch;
#[cfg(not(mizu_loom))]
pub mod wire;
#[cfg(not(mizu_loom))]
mod worker;

#[cfg(not(mizu_loom))]
pub use {
    ahead::{Ahead, PATIENCE, wait_ahead},
    attach::Submitter,
    channel::{Channel, ChannelSendError, DEFAULT_CAPACITY, DEFAULT_SLOT_SIZE},
    collect::{Wakeup, collect_all, collect_any, wait_until},
    context::{Executor, TaskContext, with_current_task},
    error::{PoolError, Result, TaskError},
    loop_watch::Watch,
    map::{MapError, MapOptions, MapOutput},
    mizu_queue::{RecvError, SlotState},
    origin::Origin,
    outcome::{OutcomeBytes, SMALL_OUTCOME},
    pool::{
        Launcher, MAX_SLOTS, MAX_WORKERS, Pool, PoolConfig, PoolStatus, SubmitterStatus,
        WorkerStatus,
    },
    pressure::set_pressure_hook,
    records::TaskId,
    shared::{Fill, set_discard_hook},
    submitter::{CollectError, Task},
    watch::WATCH,
    worker::{exit_if_orphaned_while_starting, run_worker},
};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
