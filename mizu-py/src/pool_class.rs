//! The `Pool` class's state: what a pool of Python workers holds (the runtime's pool, its
//! tasks' registry, the executor it serves). Its methods are `pool.rs`'s; what other modules
//! need of a pool goes through this type.

use std::sync::atomic::AtomicBool;
use std::sync::{OnceLock, RwLock};

use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::registry::Registry;

/// A pool of Python worker processes (`python -m pymizu.worker ...`).
#[pyclass(module = "pymizu._native", frozen)]
pub struct Pool {
    /// The runtime pool's number in this process (`mizu_pool::Pool::id`: keys the copies
    /// `mizu_pool::repeats` keeps for it).
    pub(crate) id: u64,
    /// Read-locked to use the pool (never held while waiting for the GIL to be written to),
    /// write-locked only to take it out in `stop`.
    pub(crate) inner: RwLock<Option<mizu_pool::Pool>>,
    pub(crate) origin: mizu_pool::Origin,
    pub(crate) tasks: Registry,
    /// Set when a `PoolExecutor` serves through this pool (`bind_executor`).
    pub(crate) executor: OnceLock<ExecutorHooks>,
    /// The executor's `accepting` flag (its state object sets it through `set_accepting`),
    /// read by the executor's submit without a Python attribute lookup.
    pub(crate) accepting: AtomicBool,
}

/// What the executor's submit needs of a `PoolExecutor`: its future class, its shared state
/// (`accepting`, `broken`, `refuse()`), the state's set of pending futures, and the function
/// that makes an already failed future.
pub(crate) struct ExecutorHooks {
    pub(crate) cls: Py<PyType>,
    pub(crate) state: Py<PyAny>,
    /// The state's `PendingSet` (only one is ever stored: `pending::with_executor_pending` reads
    /// it as one).
    pub(crate) pending: Py<PyAny>,
    pub(crate) failed: Py<PyAny>,
}
