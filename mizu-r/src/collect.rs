//! Collecting: a task's outcome as the R wrapper receives it (a value, or a status with what
//! it says), waits in Ctrl-C-checked slices, done/cancel/wait-any.

use std::time::{Duration, Instant};

use arrow_buffer::Buffer;
use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{SEXP, SEXPTYPE};
use mizu_pool::{CollectError, TaskError};

use crate::codec::Decoded;
use crate::decode::decode;
use crate::pool::{SLICE, opt_secs, stale};
use crate::task::{RTask, TaskState};
use crate::worker::with_context;
use crate::{forked, interrupt, rerr};

fn task_ref(task: &Robj) -> Result<&RTask> {
    // SAFETY: `task` is protected by its handle for the lifetime of the reference.
    unsafe { task_at(task.get()) }
}

/// The task behind handle `task`, checked (kind, liveness, process).
///
/// # Safety
/// `task` is a live SEXP that stays protected while the reference is used.
pub(crate) unsafe fn task_at<'a>(task: SEXP) -> Result<&'a RTask> {
    // SAFETY: the caller's contract.
    unsafe {
        if stale(task) {
            return Err(rerr(
                "not a live mizu task (one restored from a saved session?)",
            ));
        }
        let t = crate::batch::task_ref(task).ok_or_else(|| rerr("`task` must be a mizu_task"))?;
        forked(t.origin)?;
        Ok(t)
    }
}

/// Status codes of an outcome (see `outcome`).
mod status {
    pub const VALUE: i32 = 0;
    pub const RAISED: i32 = 1;
    pub const DIED: i32 = 2;
    pub const EXEC_TIMEOUT: i32 = 3;
    pub const CANCELLED: i32 = 4;
    pub const STOPPED: i32 = 5;
    pub const TIMEOUT: i32 = 6;
    pub const INTERRUPTED: i32 = 8;
    pub const RUNTIME: i32 = 9;
    pub const WARNED: i32 = 10;
}

fn mk(st: i32, value: Robj, slot: usize, pid: u32, msg: &str) -> List {
    List::from_values([
        Robj::from(st),
        value,
        Robj::from(slot as f64),
        Robj::from(f64::from(pid)),
        Robj::from(msg),
    ])
}

/// How a task ended: `list(status, value, slot, pid, message)`. Status: 0 value, 10 value with
/// warnings (the value is `list(value, warnings)`), 1 the task raised (the value is the
/// condition), 2 worker died, 3 execution timeout, 4 cancelled, 5 pool stopped, 6 not finished
/// (timeout), 8 interrupted (Ctrl-C), 9 a runtime error (message).
fn outcome(r: std::result::Result<Buffer, CollectError>) -> Result<List> {
    let nil = || Robj::from(());
    let value = |st: i32, b: Buffer| -> Result<List> { Ok(decoded_outcome(st, decode(b)?)) };
    Ok(match r {
        Ok(b) => value(status::VALUE, b)?,
        Err(CollectError::Timeout) => mk(status::TIMEOUT, nil(), 0, 0, ""),
        Err(CollectError::AlreadyCollected) => mk(
            status::RUNTIME,
            nil(),
            0,
            0,
            "the task was already collected",
        ),
        Err(CollectError::Task(e)) => match e {
            // The runtime's own failure ("mizu: cannot store the result: …"): text.
            TaskError::Runtime(m) => runtime_failure(&m),
            TaskError::Failed(b) => value(status::RAISED, Buffer::from_vec(b))?,
            TaskError::WorkerDied { slot, pid } => {
                mk(status::DIED, nil(), slot, pid, &e.to_string())
            }
            TaskError::ExecTimeout { slot, pid } => {
                mk(status::EXEC_TIMEOUT, nil(), slot, pid, &e.to_string())
            }
            TaskError::Cancelled => mk(status::CANCELLED, nil(), 0, 0, &e.to_string()),
            e => mk(status::STOPPED, nil(), 0, 0, &e.to_string()),
        },
    })
}

/// The outcome (see `outcome`) of a decoded value or error of status `st`.
fn decoded_outcome(st: i32, d: Decoded) -> List {
    match d {
        Decoded::Value(v) if st == status::VALUE && v.inherits("mizu_with_warnings") => {
            mk(status::WARNED, v, 0, 0, "")
        }
        Decoded::Value(v) => mk(st, v, 0, 0, ""),
        // A worker's own failure, as text ("mizu: malformed payload: …").
        Decoded::Text(t) => runtime_failure(&t),
    }
}

/// The outcome of a runtime failure with message `m`, without the "mizu: " the R side puts
/// in front of every such message.
fn runtime_failure(m: &str) -> List {
    mk(
        status::RUNTIME,
        ().into(),
        0,
        0,
        m.trim_start_matches("mizu: "),
    )
}

/// A timeout in seconds from R: a non-negative number (Inf: none).
fn timeout_arg(t: &Robj) -> Result<Option<Duration>> {
    // SAFETY: `t` is protected by its handle for the call.
    unsafe { timeout_sexp(t.get()) }
}

/// [`timeout_arg`] of a raw value.
///
/// # Safety
/// `t` is a live SEXP; this only reads it.
pub(crate) unsafe fn timeout_sexp(t: SEXP) -> Result<Option<Duration>> {
    use extendr_ffi::{INTEGER, R_NaInt, REAL, TYPEOF, XLENGTH};
    // SAFETY: type and length are checked before the element is read.
    let x = unsafe {
        match (TYPEOF(t), XLENGTH(t)) {
            (SEXPTYPE::REALSXP, 1) => Some(*REAL(t)),
            (SEXPTYPE::INTSXP, 1) if *INTEGER(t) != R_NaInt => Some(f64::from(*INTEGER(t))),
            _ => None,
        }
    }
    .filter(|x| !x.is_nan() && *x >= 0.0)
    .ok_or_else(|| rerr("`timeout` must be a non-negative number of seconds"))?;
    opt_secs(x, "timeout")
}

pub(crate) fn task_collect(task: Robj, timeout: Robj) -> Result<Robj> {
    let t = task_ref(&task)?;
    let timeout = timeout_arg(&timeout)?;
    // SAFETY: R's main thread; `task` is the live handle `t` was read from; the outcome comes
    // back protected once and is held by an Robj before that protection ends.
    unsafe {
        let o = collect_protected(t, task.get(), timeout)?.into_outcome();
        let r = Robj::from_sexp(o);
        extendr_ffi::Rf_unprotect(1);
        Ok(r)
    }
}

/// What a collection gives, protected once: the task's plain value (status 0, the common
/// case, made without an outcome list) or its outcome list (see `outcome`).
pub(crate) enum Collected {
    /// The value of a task that ended with a plain value (and no warnings).
    Value(SEXP),
    /// Any other outcome.
    Outcome(SEXP),
}

impl Collected {
    /// The outcome list, protected once (the protection of `self` is handed over).
    ///
    /// # Safety
    /// R's main thread; `self` is the protected result of `collect_protected`, the top of
    /// R's protect stack.
    pub(crate) unsafe fn into_outcome(self) -> SEXP {
        match self {
            Collected::Outcome(o) => o,
            // SAFETY: the caller's contract; `v` stays protected while the list is made.
            Collected::Value(v) => unsafe {
                let o = value_outcome(v);
                extendr_ffi::Rf_unprotect(2);
                extendr_ffi::Rf_protect(o)
            },
        }
    }
}

/// [`task_collect`] for the task `t` behind handle `task`, protected once (the caller
/// unprotects it); nothing is left protected when it fails.
///
/// # Safety
/// R's main thread; `task` is the live, protected handle `t` belongs to.
pub(crate) unsafe fn collect_protected(
    t: &RTask,
    task: SEXP,
    timeout: Option<Duration>,
) -> Result<Collected> {
    use extendr_ffi::{
        INTEGER, R_ExternalPtrProtected, R_SetExternalPtrProtected, Rf_protect, VECTOR_ELT,
    };
    let start = Instant::now();
    // After a whole slice without the outcome, a nearly full `/dev/shm` may be what holds the
    // worker up (see `view::collect_if_pressed`; the task's own batch stays alive meanwhile,
    // so no finalizer reaches this cell).
    let mut pressed_check = false;
    let mut g = t.cell.borrow_mut();
    let r = match &mut *g {
        TaskState::Done { outcome } => {
            // SAFETY: `task` is a live external pointer (the caller's contract).
            let kept = unsafe { Rf_protect(R_ExternalPtrProtected(task)) };
            return Ok(if *outcome {
                Collected::Outcome(kept)
            } else {
                Collected::Value(kept)
            });
        }
        TaskState::Taken => {
            let o = outcome(Err(CollectError::AlreadyCollected))?;
            // SAFETY: R's main thread; `o` is alive until after the protection.
            return Ok(Collected::Outcome(unsafe { Rf_protect(o.get()) }));
        }
        TaskState::Finished(_) => {
            let TaskState::Finished(r) = std::mem::replace(&mut *g, TaskState::Taken) else {
                unreachable!("matched above")
            };
            r
        }
        TaskState::Pending(task) => loop {
            if pressed_check {
                crate::altrep::collect_if_pressed();
            }
            pressed_check = true;
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            let r = with_context(|ctx| match ctx {
                Some(ctx) => ctx.collect(task, Some(slice)),
                None => task.result(Some(slice)),
            });
            if matches!(r, Err(CollectError::Timeout)) {
                let o = if left.is_some_and(|l| l <= slice) {
                    outcome(r)?
                } else if interrupt::pending() {
                    mk(status::INTERRUPTED, ().into(), 0, 0, "interrupted")
                } else {
                    continue;
                };
                // SAFETY: as above.
                return Ok(Collected::Outcome(unsafe { Rf_protect(o.get()) }));
            }
            break r;
        },
    };
    // SAFETY: R's main thread; every value is protected while anything allocates: `v` by its
    // Robj or by `Rf_protect`, the lists by `Rf_protect` (one left for the caller); `task` is
    // live.
    unsafe {
        let c = match r {
            // The common case, built without R handles: a small plain value.
            Ok(b) if let Some(v) = crate::decode::decode_small(&b) => {
                Collected::Value(Rf_protect(v?))
            }
            Ok(b) => match decode(b)? {
                // (`OBJECT` first: the class lookup costs an R handle, plain values have none.)
                Decoded::Value(v)
                    if crate::ffi::OBJECT(v.get()) == 0 || !v.inherits("mizu_with_warnings") =>
                {
                    Collected::Value(Rf_protect(v.get()))
                }
                d => Collected::Outcome(Rf_protect(decoded_outcome(status::VALUE, d).get())),
            },
            r => Collected::Outcome(Rf_protect(outcome(r)?.get())),
        };
        *g = match c {
            Collected::Value(v) => {
                R_SetExternalPtrProtected(task, v);
                TaskState::Done { outcome: false }
            }
            // Later collects see the value without its warnings (they are signalled once).
            Collected::Outcome(o) if *INTEGER(VECTOR_ELT(o, 0)) == status::WARNED => {
                R_SetExternalPtrProtected(task, VECTOR_ELT(VECTOR_ELT(o, 1), 0));
                TaskState::Done { outcome: false }
            }
            Collected::Outcome(o) => {
                R_SetExternalPtrProtected(task, o);
                TaskState::Done { outcome: true }
            }
        };
        Ok(c)
    }
}

/// `list(0L, v, NULL, NULL, NULL)`: the outcome of a plain value (see `outcome`), protected
/// once.
///
/// # Safety
/// R's main thread; `v` is protected by the caller.
unsafe fn value_outcome(v: SEXP) -> SEXP {
    // SAFETY: as stated; the list is protected while its status is allocated.
    unsafe {
        let o = extendr_ffi::Rf_protect(extendr_ffi::Rf_allocVector(SEXPTYPE::VECSXP, 5));
        extendr_ffi::SET_VECTOR_ELT(o, 0, extendr_ffi::Rf_ScalarInteger(status::VALUE));
        extendr_ffi::SET_VECTOR_ELT(o, 1, v);
        o
    }
}

pub(crate) fn task_done(task: Robj) -> Result<bool> {
    Ok(task_ref(&task)?.is_done())
}

pub(crate) fn task_collected(task: Robj) -> Result<bool> {
    Ok(matches!(
        &*task_ref(&task)?.cell.borrow(),
        TaskState::Done { .. }
    ))
}

pub(crate) fn task_cancel(task: Robj) -> Result<bool> {
    let t = task_ref(&task)?;
    Ok(matches!(&*t.cell.borrow(), TaskState::Pending(t) if t.cancel()))
}

/// The tasks behind the handles in `tasks`, checked as [`task_ref`] does; they live as long
/// as the list.
fn task_refs(tasks: &List) -> Result<Vec<&RTask>> {
    // SAFETY: R's main thread; the list is protected by its handle, and each task by the list,
    // for the references' lifetime (the list's). Its elements are read in place: an extendr
    // handle per element cost more than the rest of `mizu_collect_any()` on a long list.
    unsafe {
        let l = tasks.get();
        (0..extendr_ffi::XLENGTH(l))
            .map(|i| {
                let t = extendr_ffi::VECTOR_ELT(l, i);
                if crate::batch::task_ref(t).is_none() && !stale(t) {
                    return Err(rerr("`tasks` must be a list of mizu_task"));
                }
                task_at(t)
            })
            .collect()
    }
}

pub(crate) fn task_wait_any(tasks: List, timeout: Robj) -> Result<i32> {
    let ts = task_refs(&tasks)?;
    let timeout = timeout_arg(&timeout)?;
    let start = Instant::now();
    let ready = |s: &TaskState| match s {
        TaskState::Pending(t) => t.is_done(),
        TaskState::Finished(_) => true,
        TaskState::Done { .. } | TaskState::Taken => false,
    };
    loop {
        if let Some(i) = ts.iter().position(|t| ready(&t.cell.borrow())) {
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
            return Ok(-2);
        };
        let found =
            mizu_pool::wait_until(probe, Some(slice), || guards.iter().position(|g| ready(g)));
        drop(guards);
        if let Some(i) = found {
            return Ok(i as i32 + 1);
        }
        if interrupt::pending() {
            return Ok(-1);
        }
    }
}

pub(crate) fn tasks_wait_ahead(tasks: List, stream: bool, timeout: Robj) -> Result<i32> {
    let ts = task_refs(&tasks)?;
    let timeout = timeout_arg(&timeout)?;
    Ok(wait_ahead_of(&ts, stream, timeout))
}

/// [`tasks_wait_ahead`] of the tasks `ts`: 1 once `ts[0]` is worth collecting (see
/// `mizu_pool::Ahead`), 0 when `timeout` passed first, -1 when Ctrl-C was pressed.
pub(crate) fn wait_ahead_of(ts: &[&RTask], stream: bool, timeout: Option<Duration>) -> i32 {
    let start = Instant::now();
    let mut ahead = mizu_pool::Ahead::new(stream);
    loop {
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            return 0;
        }
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        let guards: Vec<_> = ts.iter().map(|t| t.cell.borrow()).collect();
        let pending: Vec<&mizu_pool::Task> = guards
            .iter()
            .filter_map(|g| match &**g {
                TaskState::Pending(t) => Some(t),
                _ => None,
            })
            .collect();
        if ahead.wait(&pending, Some(slice)) {
            return 1;
        }
        drop(pending);
        drop(guards);
        if interrupt::pending() {
            return -1;
        }
    }
}
