//! The caller's side: pools and tasks. Waits run in 50 ms slices with a Ctrl-C check between
//! them; a pressed Ctrl-C is reported to the R wrapper, which signals the interrupt.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{SEXP, SEXPTYPE};
use mizu_pool::{Launcher, PoolConfig, PoolError};

use crate::task::{RTask, TaskState};
use crate::worker::with_context;
use crate::{forked, interrupt, rerr};

/// How long one wait lasts before Ctrl-C is checked.
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// A pool of R worker processes.
pub struct RPool {
    pub(crate) inner: RefCell<Option<mizu_pool::Pool>>,
    /// The handle `mizu_current_pool()` gives inside a task: submits to the pool running it.
    pub(crate) nested: bool,
    pub(crate) workers: i32,
    pub(crate) origin: mizu_pool::Origin,
    pub(crate) submit_timeout: Option<Duration>,
    /// The batches of task handles: new handles join the batch being filled (see
    /// `batch::task_handle`); when every task slot is taken, finished outcomes are moved
    /// out of their slots into the tasks (see `drain`).
    pub(crate) batch: crate::batch::BatchSlot,
    /// Workers of another language (Python): tasks are cross-language calls
    /// (`mizu_call()`), not R expressions.
    pub(crate) foreign: bool,
}

impl Drop for RPool {
    fn drop(&mut self) {
        if let Some(mut p) = self.inner.get_mut().take() {
            // In a forked child (mclapply) the runtime touches nothing: the workers are the
            // parent's.
            p.stop(Duration::from_secs(2));
        }
    }
}

impl RPool {
    /// The key of the copies the runtime keeps of large vectors sent again to this pool
    /// (`mizu_pool::repeats`): None for a nested pool handle, whose tasks go to the pool
    /// running it.
    pub(crate) fn repeats_key(&self) -> Option<u64> {
        self.inner.try_borrow().ok()?.as_ref().map(|p| p.id())
    }
    /// Moves finished outcomes out of their task slots, or waits (in Ctrl-C-checked slices, up
    /// to `timeout`) for some to finish, as the runtime's rule says (`mizu_pool::retry::drain`).
    pub(crate) fn drain(&self, timeout: Option<Duration>) -> Drained {
        let start = Instant::now();
        let pending = |t: &RTask| matches!(&*t.cell.borrow(), TaskState::Pending(_));
        let settle = |t: &&RTask| {
            let mut g = t.cell.borrow_mut();
            match &mut *g {
                TaskState::Pending(p) if p.is_done() => {
                    let r = p.result(Some(Duration::ZERO));
                    *g = TaskState::Finished(r);
                    true
                }
                _ => false,
            }
        };
        loop {
            let batches = self.batch.live(pending);
            let held: Vec<&RTask> = batches.iter().flat_map(|b| b.tasks()).collect();
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            let freed = mizu_pool::retry::drain(
                &held,
                settle,
                |t| pending(t),
                |t| {
                    if let TaskState::Pending(p) = &*t.cell.borrow() {
                        mizu_pool::wait_until(p, Some(slice), || p.is_done().then_some(()));
                    }
                },
            );
            if freed {
                return Drained::Freed;
            }
            if !held.iter().any(|t| pending(t)) || left.is_some_and(|l| l.is_zero()) {
                return Drained::TimedOut;
            }
            if interrupt::pending() {
                return Drained::Interrupted;
            }
        }
    }
}

/// What [`RPool::drain`] achieved.
pub(crate) enum Drained {
    /// A task slot is free again.
    Freed,
    /// Nothing finished within the timeout (or nothing is in flight).
    TimedOut,
    /// Ctrl-C.
    Interrupted,
}

/// The failure an R wrapper turns into an interrupt condition (Ctrl-C while waiting).
pub(crate) fn interrupted() -> Robj {
    failure("interrupt", "interrupted")
}

pub(crate) fn opt_secs(x: f64, what: &str) -> Result<Option<Duration>> {
    if x.is_nan() || x.is_infinite() {
        return Ok(None);
    }
    Duration::try_from_secs_f64(x)
        .map(Some)
        .map_err(|e| rerr(format!("{what}: {e}")))
}

/// Whether `x` is an external pointer whose address was cleared (restored from a saved
/// session, where native handles cannot survive).
///
/// # Safety
/// `x` is a live SEXP; this only reads it.
pub(crate) unsafe fn stale(x: SEXP) -> bool {
    // SAFETY: the address is read only from an external pointer.
    unsafe {
        extendr_ffi::TYPEOF(x) == SEXPTYPE::EXTPTRSXP && extendr_ffi::R_ExternalPtrAddr(x).is_null()
    }
}

pub(crate) fn pool_ref(pool: &Robj) -> Result<&RPool> {
    // SAFETY: `pool` is protected by its handle for the lifetime of the reference.
    unsafe { pool_at(pool.get()) }
}

/// The pool behind handle `pool`, checked (kind, liveness, process).
///
/// # Safety
/// `pool` is a live SEXP that stays protected while the reference is used.
pub(crate) unsafe fn pool_at<'a>(pool: SEXP) -> Result<&'a RPool> {
    // SAFETY: the caller's contract.
    unsafe {
        if stale(pool) {
            return Err(rerr(
                "not a live mizu pool (one restored from a saved session?)",
            ));
        }
        let p = crate::handle::ext_ref::<RPool>(pool).ok_or_else(|| {
            rerr("`pool` must be a mizu_pool (see mizu_pool() and mizu_current_pool())")
        })?;
        forked(p.origin)?;
        Ok(p)
    }
}

/// `f` of the data segments of the process submitting through `pool`: the pool's, or inside a
/// task (a nested pool handle) the worker's.
pub(crate) fn with_data_pool<T>(
    pool: &Robj,
    f: impl FnOnce(&mizu_pool::wire::DataPool) -> T,
) -> Result<T> {
    let p = pool_ref(pool)?;
    if p.nested {
        with_context(|c| c.map(|c| f(c.data_pool())))
            .ok_or_else(|| rerr("a nested pool handle is only usable inside its task"))
    } else {
        let g = p.inner.borrow();
        let pool = g.as_ref().ok_or_else(|| rerr("the pool is stopped"))?;
        Ok(f(pool.data_pool()))
    }
}

/// A classed failure for the R wrapper: `c(class, message)`.
pub(crate) fn failure(class: &str, msg: impl std::fmt::Display) -> Robj {
    Robj::from(vec![class.to_string(), msg.to_string()])
}

pub(crate) fn submit_failure(e: PoolError) -> Robj {
    match e {
        PoolError::SlotsExhausted(_) => failure("mizu_error_slots_full", e),
        PoolError::SubmitTimeout(_) => failure("mizu_error_submit_timeout", e),
        PoolError::Stopped => failure("mizu_error_stopped", e),
        e => failure("mizu_error", e),
    }
}

fn pool_robj(p: RPool) -> Robj {
    let mut r: Robj = ExternalPtr::new(p).into();
    let _ = r.set_class(["mizu_pool"]);
    r
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn pool_new(
    workers: i32,
    program: &str,
    args: Vec<String>,
    slots: i32,
    exec_timeout: f64,
    submit_timeout: f64,
    respawn: bool,
    foreign: bool,
) -> Result<Robj> {
    let cfg = PoolConfig {
        workers: usize::try_from(workers).map_err(|_| rerr("n_workers must be positive"))?,
        slots: u32::try_from(slots).map_err(|_| rerr("slots must be positive"))?,
        exec_timeout: opt_secs(exec_timeout, "exec_timeout")?,
        respawn,
        // R tasks take microseconds on each side: spin long enough to bridge one. Spinning
        // idle workers are capped at the CPU count minus one by the runtime.
        spin: Duration::from_micros(250),
        ..Default::default()
    };
    cfg.validate().map_err(rerr)?;
    let submit_timeout = opt_secs(submit_timeout, "submit_timeout")?;
    // Workers load the package (and `init` runs there) before they join: Ctrl-C meanwhile
    // stops them.
    let launcher = Launcher::new(program, args);
    let started = mizu_pool::Pool::new_interruptible(cfg, launcher, &mut || !interrupt::pending());
    let pool = match started {
        Ok(p) => p,
        Err(PoolError::Interrupted) => return Ok(interrupted()),
        Err(e) => return Err(rerr(e)),
    };
    Ok(pool_robj(RPool {
        inner: RefCell::new(Some(pool)),
        nested: false,
        workers,
        origin: mizu_pool::Origin::here(),
        submit_timeout,
        batch: Default::default(),
        foreign,
    }))
}

pub(crate) fn pool_nested() -> Result<Robj> {
    if !with_context(|c| c.is_some()) {
        return Err(rerr(
            "mizu_current_pool() is only available inside a mizu task",
        ));
    }
    Ok(pool_robj(RPool {
        inner: RefCell::new(None),
        nested: true,
        workers: 0,
        origin: mizu_pool::Origin::here(),
        submit_timeout: None,
        batch: Default::default(),
        foreign: false,
    }))
}

pub(crate) fn pool_info(pool: Robj) -> Result<List> {
    let p = pool_ref(&pool)?;
    Ok(List::from_values([
        Robj::from(p.workers),
        Robj::from(p.nested),
        Robj::from(p.nested || p.inner.borrow().is_some()),
        Robj::from(p.foreign),
    ]))
}

pub(crate) fn pool_status(pool: Robj) -> Result<List> {
    let p = pool_ref(&pool)?;
    if p.nested {
        return Err(rerr(
            "the status of the current pool is not available inside a task",
        ));
    }
    let ws = p
        .inner
        .borrow()
        .as_ref()
        .map(|p| p.status().workers)
        .unwrap_or_default();
    Ok(List::from_values([
        Robj::from(ws.iter().map(|w| w.slot as i32).collect::<Vec<_>>()),
        Robj::from(ws.iter().map(|w| f64::from(w.pid)).collect::<Vec<_>>()),
        Robj::from(ws.iter().map(|w| w.state.to_string()).collect::<Vec<_>>()),
        Robj::from(ws.iter().map(|w| w.busy).collect::<Vec<_>>()),
        Robj::from(ws.iter().map(|w| w.tasks as f64).collect::<Vec<_>>()),
        Robj::from(ws.iter().map(|w| w.steals as f64).collect::<Vec<_>>()),
    ]))
}

pub(crate) fn pool_stop(pool: Robj, grace: f64) -> Result<()> {
    if grace.is_nan() {
        return Err(rerr("`grace` must be a number of seconds, not NaN"));
    }
    let p = pool_ref(&pool)?;
    let taken = p.inner.borrow_mut().take();
    if let Some(mut pl) = taken {
        pl.stop(Duration::from_secs_f64(grace.clamp(0.0, 3600.0)));
        drop(pl);
        p.batch.abandon_pending();
        // Views of the pool's results this session dropped held data segments; the runtime
        // gave back what was idle at the stop, and these are idle now.
        mizu_pool::machine::give_back_idle_now();
    }
    Ok(())
}
