//! The caller's side: pools and tasks. Waits run in 50 ms slices with a Ctrl-C check between
//! them; a pressed Ctrl-C is reported to the R wrapper, which signals the interrupt.

use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use arrow_buffer::Buffer;
use extendr_api::Result;
use extendr_api::prelude::*;
use mizu_pool::{CollectError, Launcher, PoolConfig, PoolError, TaskError};

use crate::codec::{Decoded, Outgoing, decode};
use crate::worker::with_context;
use crate::{forked, interrupt, rerr};

/// How long one wait lasts before Ctrl-C is checked.
const SLICE: Duration = Duration::from_millis(50);

/// A pool of R worker processes.
pub struct RPool {
    inner: RefCell<Option<mizu_pool::Pool>>,
    pid: u32,
    submit_timeout: Option<Duration>,
    /// The tasks submitted here that may still hold a task slot: when every slot is taken,
    /// finished outcomes are moved out of their slots into the tasks (see `drain`).
    tasks: RefCell<Vec<Weak<TaskCell>>>,
}

impl Drop for RPool {
    fn drop(&mut self) {
        if let Some(p) = self.inner.get_mut().take() {
            if self.pid == std::process::id() {
                stop_pool(p, Duration::from_secs(2));
            } else {
                // A forked child's copy (mclapply): the workers belong to the parent.
                std::mem::forget(p);
            }
        }
    }
}

fn stop_pool(mut p: mizu_pool::Pool, grace: Duration) {
    let workers = p.launched_pids();
    p.stop(grace);
    drop(p);
    // Only our own workers' leftovers: other programs may have data in flight.
    let _ = mizu_shm::prune_of(&workers);
}

/// Where a task is.
pub enum TaskState {
    /// Submitted; its outcome (when there is one) is in its task slot.
    Pending(mizu_pool::Task),
    /// Its outcome, moved out of the slot to make room for more tasks.
    Finished(std::result::Result<Buffer, CollectError>),
    /// Collected.
    Taken,
}

type TaskCell = RefCell<TaskState>;

/// A submitted task.
pub struct RTask {
    cell: Rc<TaskCell>,
    pid: u32,
}

impl RTask {
    pub(crate) fn new(t: mizu_pool::Task) -> RTask {
        RTask {
            cell: Rc::new(RefCell::new(TaskState::Pending(t))),
            pid: std::process::id(),
        }
    }

    fn is_done(&self) -> bool {
        match &*self.cell.borrow() {
            TaskState::Pending(t) => t.is_done(),
            TaskState::Finished(_) => true,
            TaskState::Taken => false,
        }
    }
}

impl Drop for RTask {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            let st = std::mem::replace(&mut *self.cell.borrow_mut(), TaskState::Taken);
            if let TaskState::Pending(t) = st {
                std::mem::forget(t);
            }
        }
    }
}

impl RPool {
    fn track(&self, t: &RTask) {
        let mut v = self.tasks.borrow_mut();
        if v.len() >= 64 && v.len().is_power_of_two() {
            v.retain(|w| w.strong_count() > 0);
        }
        v.push(Rc::downgrade(&t.cell));
    }

    /// Moves finished outcomes out of their task slots; waits (in Ctrl-C-checked slices, up
    /// to `timeout`) for one when none is finished. Whether a slot was freed.
    fn drain(&self, timeout: Option<Duration>) -> Result<bool> {
        let start = Instant::now();
        loop {
            let mut freed = false;
            let live: Vec<Rc<TaskCell>> = {
                let mut v = self.tasks.borrow_mut();
                v.retain(|w| {
                    w.upgrade()
                        .is_some_and(|c| matches!(&*c.borrow(), TaskState::Pending(_)))
                });
                v.iter().filter_map(Weak::upgrade).collect()
            };
            for c in &live {
                let mut g = c.borrow_mut();
                if let TaskState::Pending(t) = &mut *g
                    && t.is_done()
                {
                    let r = t.result(Some(Duration::ZERO));
                    *g = TaskState::Finished(r);
                    freed = true;
                }
            }
            if freed {
                return Ok(true);
            }
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            if live.is_empty() || left.is_some_and(|l| l.is_zero()) {
                return Ok(false);
            }
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            let g = live[0].borrow();
            if let TaskState::Pending(probe) = &*g {
                mizu_pool::wait_until(probe, Some(slice), || {
                    live.iter()
                        .skip(1)
                        .any(|c| match c.try_borrow().as_deref() {
                            Ok(TaskState::Pending(t)) => t.is_done(),
                            _ => false,
                        })
                        .then_some(())
                        .or_else(|| probe.is_done().then_some(()))
                });
            }
            drop(g);
            if interrupt::pending() {
                return Err(rerr("interrupted"));
            }
        }
    }
}

fn opt_secs(x: f64, what: &str) -> Result<Option<Duration>> {
    if x.is_nan() || x.is_infinite() {
        return Ok(None);
    }
    Duration::try_from_secs_f64(x)
        .map(Some)
        .map_err(|e| rerr(format!("{what}: {e}")))
}

fn pool_ref(pool: &Robj) -> Result<&RPool> {
    let p: &ExternalPtr<RPool> = pool
        .try_into()
        .map_err(|_| rerr("not a mizu pool (or one restored from a saved session)"))?;
    let p = p.try_addr().map_err(|_| rerr("not a live mizu pool"))?;
    forked(p.pid)?;
    Ok(p)
}

/// A classed failure for the R wrapper: `c(class, message)`.
fn failure(class: &str, msg: impl std::fmt::Display) -> Robj {
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

/// Starts a pool: `workers` processes `program args… <token> <slot>`.
#[extendr]
fn pool_new(
    workers: i32,
    program: &str,
    args: Vec<String>,
    slots: i32,
    exec_timeout: f64,
    submit_timeout: f64,
    respawn: bool,
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
    let pool = mizu_pool::Pool::new(cfg, Launcher::new(program, args)).map_err(rerr)?;
    Ok(ExternalPtr::new(RPool {
        inner: RefCell::new(Some(pool)),
        pid: std::process::id(),
        submit_timeout: opt_secs(submit_timeout, "submit_timeout")?,
        tasks: RefCell::new(Vec::new()),
    })
    .into())
}

/// Submits an R value (the task message): the task handle, or `c(class, message)` when it
/// cannot be submitted.
/// When every task slot is taken, finished outcomes are moved into their tasks first (and,
/// if none is finished, it waits for one, up to the pool's submit timeout).
#[extendr]
fn pool_submit(pool: Robj, value: Robj) -> Result<Robj> {
    let p = pool_ref(&pool)?;
    let out = Outgoing::encode(&value)?;
    loop {
        let r = {
            let g = p.inner.borrow();
            let Some(inner) = g.as_ref() else {
                return Ok(failure("mizu_error_stopped", "the pool is stopped"));
            };
            inner.submit_with(&out, p.submit_timeout)
        };
        match r {
            Ok(t) => {
                let t = RTask::new(t);
                p.track(&t);
                return Ok(ExternalPtr::new(t).into());
            }
            Err(PoolError::SlotsExhausted(_)) => {
                if !p.drain(p.submit_timeout)? {
                    return Ok(submit_failure(PoolError::SubmitTimeout(
                        p.submit_timeout.unwrap_or_default(),
                    )));
                }
            }
            Err(e) => return Ok(submit_failure(e)),
        }
    }
}

/// Submits several values (a list of task messages) with one publication per worker
/// queue: `list(tasks, failure)` where `failure` is NULL or `c(class, message)` for the rest.
#[extendr]
fn pool_submit_batch(pool: Robj, payloads: List) -> Result<List> {
    let p = pool_ref(&pool)?;
    let outs = outgoing_list(&payloads)?;
    let mut tasks = Vec::with_capacity(outs.len());
    let mut fail = None;
    while tasks.len() < outs.len() {
        let (ts, res) = {
            let g = p.inner.borrow();
            let Some(inner) = g.as_ref() else {
                fail = Some(PoolError::Stopped);
                break;
            };
            inner.submit_batch_with(
                outs[tasks.len()..]
                    .iter()
                    .map(|o| o as &dyn mizu_pool::Fill),
            )
        };
        for t in ts {
            let t = RTask::new(t);
            p.track(&t);
            tasks.push(t);
        }
        match res {
            Ok(()) => {}
            Err(PoolError::SlotsExhausted(_)) => {
                if !p.drain(p.submit_timeout)? {
                    fail = Some(PoolError::SubmitTimeout(
                        p.submit_timeout.unwrap_or_default(),
                    ));
                    break;
                }
            }
            Err(e) => {
                fail = Some(e);
                break;
            }
        }
    }
    Ok(batch_list(tasks, fail))
}

pub(crate) fn batch_list(tasks: Vec<RTask>, fail: Option<PoolError>) -> List {
    let tasks: Vec<Robj> = tasks
        .into_iter()
        .map(|t| ExternalPtr::new(t).into())
        .collect();
    let fail = fail.map_or_else(|| Robj::from(()), submit_failure);
    List::from_values([List::from_values(tasks).into(), fail])
}

pub(crate) fn outgoing_list(values: &List) -> Result<Vec<Outgoing>> {
    values.values().map(|v| Outgoing::encode(&v)).collect()
}

pub(crate) fn batch_result(ts: Vec<mizu_pool::Task>, res: mizu_pool::Result<()>) -> List {
    batch_list(ts.into_iter().map(RTask::new).collect(), res.err())
}

fn task_ref(task: &Robj) -> Result<&RTask> {
    let t: &ExternalPtr<RTask> = task
        .try_into()
        .map_err(|_| rerr("not a mizu task (or one restored from a saved session)"))?;
    let t = t.try_addr().map_err(|_| rerr("not a live mizu task"))?;
    forked(t.pid)?;
    Ok(t)
}

/// How a collect ended: `list(status, value, NULL, slot, pid, message)`. Status: 0 value,
/// 1 the task raised (the value is the condition), 2 worker died, 3 execution timeout, 4 cancelled,
/// 5 pool stopped, 6 not finished (timeout), 7 already collected, 8 interrupted (Ctrl-C),
/// 9 a runtime error (message).
fn outcome(r: std::result::Result<Buffer, CollectError>) -> Result<List> {
    let nil = || Robj::from(());
    let mk = |st: i32, skel: Robj, views: Robj, slot: usize, pid: u32, msg: String| {
        List::from_values([
            Robj::from(st),
            skel,
            views,
            Robj::from(slot as f64),
            Robj::from(f64::from(pid)),
            Robj::from(msg),
        ])
    };
    let value = |st: i32, b: Buffer| -> Result<List> {
        Ok(match decode(b)? {
            Decoded::Value(v) => mk(st, v, nil(), 0, 0, String::new()),
            Decoded::Text(t) => mk(9, nil(), nil(), 0, 0, t),
        })
    };
    Ok(match r {
        Ok(b) => value(0, b)?,
        Err(CollectError::Timeout) => mk(6, nil(), nil(), 0, 0, String::new()),
        Err(CollectError::AlreadyCollected) => mk(7, nil(), nil(), 0, 0, String::new()),
        Err(CollectError::Task(e)) => match e {
            TaskError::Failed(b) => value(1, Buffer::from_vec(b))?,
            TaskError::WorkerDied { slot, pid } => mk(2, nil(), nil(), slot, pid, e.to_string()),
            TaskError::ExecTimeout { slot, pid } => mk(3, nil(), nil(), slot, pid, e.to_string()),
            TaskError::Cancelled => mk(4, nil(), nil(), 0, 0, e.to_string()),
            e => mk(5, nil(), nil(), 0, 0, e.to_string()),
        },
    })
}

fn interrupted() -> Result<List> {
    Ok(List::from_values([
        Robj::from(8),
        ().into(),
        ().into(),
        0.0.into(),
        0.0.into(),
        "interrupted".into(),
    ]))
}

/// Waits at most `timeout` seconds (Inf: forever) for the task's outcome. Inside a worker,
/// waiting runs other tasks (nested maps never deadlock).
#[extendr]
fn task_collect(task: Robj, timeout: f64) -> Result<List> {
    let t = task_ref(&task)?;
    let timeout = if timeout.is_nan() {
        None
    } else {
        opt_secs(timeout.max(0.0), "timeout")?
    };
    let start = Instant::now();
    let mut g = t.cell.borrow_mut();
    let task = match &mut *g {
        TaskState::Pending(task) => task,
        TaskState::Finished(_) => {
            let TaskState::Finished(r) = std::mem::replace(&mut *g, TaskState::Taken) else {
                unreachable!("matched above")
            };
            return outcome(r);
        }
        TaskState::Taken => return outcome(Err(CollectError::AlreadyCollected)),
    };
    loop {
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        let r = with_context(|ctx| match ctx {
            Some(ctx) => ctx.collect(task, Some(slice)),
            None => task.result(Some(slice)),
        });
        if matches!(r, Err(CollectError::Timeout)) {
            if left.is_some_and(|l| l <= slice) {
                return outcome(r);
            }
            if interrupt::pending() {
                return interrupted();
            }
            continue;
        }
        *g = TaskState::Taken;
        return outcome(r);
    }
}

/// Whether the task's outcome is ready to collect.
#[extendr]
fn task_done(task: Robj) -> Result<bool> {
    let t = task_ref(&task)?;
    Ok(t.is_done())
}

/// Cancels the task if it has not started; whether it will never run.
#[extendr]
fn task_cancel(task: Robj) -> Result<bool> {
    let t = task_ref(&task)?;
    Ok(matches!(&*t.cell.borrow(), TaskState::Pending(t) if t.cancel()))
}

/// Waits until one of `tasks` has an outcome: its 1-based position, 0 after `timeout`
/// seconds, -1 on Ctrl-C.
#[extendr]
fn task_wait_any(tasks: List, timeout: f64) -> Result<i32> {
    let ts: Vec<&RTask> = tasks
        .values()
        .map(|t| task_ref(&t).map(|r| r as *const RTask))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        // SAFETY: each task is kept alive by the `tasks` list for this whole call.
        .map(|p| unsafe { &*p })
        .collect();
    let timeout = opt_secs(timeout.max(0.0), "timeout")?;
    let start = Instant::now();
    loop {
        if let Some(i) = ts.iter().position(|t| t.is_done()) {
            return Ok(i as i32 + 1);
        }
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            return Ok(0);
        }
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        let guards: Vec<_> = ts.iter().map(|t| t.cell.borrow()).collect();
        let probe = guards.iter().find_map(|g| match &**g {
            TaskState::Pending(t) => Some(t),
            _ => None,
        });
        let Some(probe) = probe else {
            return Err(rerr("every task was already collected"));
        };
        let found = mizu_pool::wait_until(probe, Some(slice), || {
            guards.iter().position(|g| match &**g {
                TaskState::Pending(t) => t.is_done(),
                TaskState::Finished(_) => true,
                TaskState::Taken => false,
            })
        });
        drop(guards);
        if let Some(i) = found {
            return Ok(i as i32 + 1);
        }
        if interrupt::pending() {
            return Ok(-1);
        }
    }
}

/// Per worker: `list(slot, pid, state, busy, tasks, steals)` columns.
#[extendr]
fn pool_status(pool: Robj) -> Result<List> {
    let p = pool_ref(&pool)?;
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

/// Whether the pool is running.
#[extendr]
fn pool_running(pool: Robj) -> Result<bool> {
    Ok(pool_ref(&pool)?.inner.borrow().is_some())
}

/// Stops the pool (queued tasks cancelled, running ones fail, uncollected results dropped);
/// idempotent. What its workers left in shared memory is removed.
#[extendr]
fn pool_stop(pool: Robj, grace: f64) -> Result<()> {
    let p = pool_ref(&pool)?;
    let taken = p.inner.borrow_mut().take();
    if let Some(pl) = taken {
        stop_pool(pl, Duration::from_secs_f64(grace.clamp(0.0, 3600.0)));
    }
    Ok(())
}

extendr_module! {
    mod pool;
    fn pool_new;
    fn pool_submit;
    fn pool_submit_batch;
    fn pool_status;
    fn pool_running;
    fn pool_stop;
    fn task_collect;
    fn task_done;
    fn task_cancel;
    fn task_wait_any;
}
