//! The caller's side: pools and tasks. Waits run in 50 ms slices with a Ctrl-C check between
//! them; a pressed Ctrl-C is reported to the R wrapper, which signals the interrupt.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use arrow_buffer::Buffer;
use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{SEXP, SEXPTYPE};
use mizu_pool::retry::{MakeRoom, retrying};
use mizu_pool::{CollectError, Launcher, PoolConfig, PoolError, TaskError};

use crate::codec::{Decoded, Outgoing, decode};
use crate::worker::with_context;
use crate::{forked, interrupt, rerr};

/// How long one wait lasts before Ctrl-C is checked.
const SLICE: Duration = Duration::from_millis(50);

/// A pool of R worker processes.
pub struct RPool {
    inner: RefCell<Option<mizu_pool::Pool>>,
    /// The handle `mizu_current_pool()` gives inside a task: submits to the pool running it.
    nested: bool,
    workers: i32,
    pub(crate) origin: mizu_pool::Origin,
    submit_timeout: Option<Duration>,
    /// The batches of task handles: new handles join the batch being filled (see
    /// `handle::task_handle`); when every task slot is taken, finished outcomes are moved
    /// out of their slots into the tasks (see `drain`).
    pub(crate) batch: crate::handle::BatchSlot,
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

/// Where a task is.
pub enum TaskState {
    /// Submitted; its outcome (when there is one) is in its task slot.
    Pending(mizu_pool::Task),
    /// Its outcome, moved out of the slot to make room for more tasks.
    Finished(std::result::Result<Buffer, CollectError>),
    /// Collected: what the first collection returned is kept in the task handle's `prot`
    /// field (so R's collector sees it as part of the task, not as a global root) and
    /// returned again when asked again: the plain value, or (`outcome`) the outcome list of
    /// a task that did not end with a plain value.
    Done { outcome: bool },
    /// Dropped in a forked child.
    Taken,
}

/// A submitted task (it lives in its batch of handles, see `handle::task_handle`).
pub struct RTask {
    cell: RefCell<TaskState>,
    pub(crate) origin: mizu_pool::Origin,
}

thread_local! {
    /// Tasks alive in this process (for tests: dropped handles must release theirs).
    static LIVE_TASKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many task objects this process holds (a test hook: see `test-pool.R`).
#[extendr]
fn live_tasks() -> f64 {
    LIVE_TASKS.get() as f64
}

impl RTask {
    pub(crate) fn new(t: mizu_pool::Task) -> RTask {
        LIVE_TASKS.set(LIVE_TASKS.get() + 1);
        RTask {
            cell: RefCell::new(TaskState::Pending(t)),
            origin: mizu_pool::Origin::here(),
        }
    }

    /// A pending task of a stopped pool: its outcome is "stopped" (see
    /// `BatchSlot::abandon_pending`).
    pub(crate) fn abandon(&self) {
        let mut c = self.cell.borrow_mut();
        if matches!(*c, TaskState::Pending(_)) {
            *c = TaskState::Finished(Err(CollectError::Task(TaskError::Stopped)));
        }
    }

    fn is_done(&self) -> bool {
        match &*self.cell.borrow() {
            TaskState::Pending(t) => t.is_done(),
            TaskState::Finished(_) | TaskState::Done { .. } => true,
            TaskState::Taken => false,
        }
    }
}

impl Drop for RTask {
    fn drop(&mut self) {
        LIVE_TASKS.set(LIVE_TASKS.get().saturating_sub(1));
    }
}

impl RPool {
    /// Moves finished outcomes out of their task slots; waits (in Ctrl-C-checked slices, up
    /// to `timeout`) for one when none is finished.
    fn drain(&self, timeout: Option<Duration>) -> Drained {
        let start = Instant::now();
        loop {
            let mut freed = false;
            let pending = |t: &RTask| matches!(&*t.cell.borrow(), TaskState::Pending(_));
            let batches = self.batch.live(pending);
            let live: Vec<&RTask> = batches
                .iter()
                .flat_map(|b| b.tasks())
                .filter(|t| pending(t))
                .collect();
            for t in &live {
                let mut g = t.cell.borrow_mut();
                if let TaskState::Pending(t) = &mut *g
                    && t.is_done()
                {
                    let r = t.result(Some(Duration::ZERO));
                    *g = TaskState::Finished(r);
                    freed = true;
                }
            }
            if freed {
                return Drained::Freed;
            }
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            if live.is_empty() || left.is_some_and(|l| l.is_zero()) {
                return Drained::TimedOut;
            }
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            let g = live[0].cell.borrow();
            if let TaskState::Pending(probe) = &*g {
                mizu_pool::wait_until(probe, Some(slice), || {
                    live.iter()
                        .skip(1)
                        .any(|t| match t.cell.try_borrow().as_deref() {
                            Ok(TaskState::Pending(t)) => t.is_done(),
                            _ => false,
                        })
                        .then_some(())
                        .or_else(|| probe.is_done().then_some(()))
                });
            }
            drop(g);
            if interrupt::pending() {
                return Drained::Interrupted;
            }
        }
    }
}

/// What [`RPool::drain`] achieved.
enum Drained {
    /// A task slot is free again.
    Freed,
    /// Nothing finished within the timeout (or nothing is in flight).
    TimedOut,
    /// Ctrl-C.
    Interrupted,
}

/// The failure an R wrapper turns into an interrupt condition (Ctrl-C while waiting).
fn interrupted() -> Robj {
    failure("interrupt", "interrupted")
}

fn opt_secs(x: f64, what: &str) -> Result<Option<Duration>> {
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
unsafe fn stale(x: SEXP) -> bool {
    // SAFETY: the address is read only from an external pointer.
    unsafe {
        extendr_ffi::TYPEOF(x) == SEXPTYPE::EXTPTRSXP && extendr_ffi::R_ExternalPtrAddr(x).is_null()
    }
}

fn pool_ref(pool: &Robj) -> Result<&RPool> {
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

fn pool_robj(p: RPool) -> Robj {
    let mut r: Robj = ExternalPtr::new(p).into();
    let _ = r.set_class(["mizu_pool"]);
    r
}

/// Starts a pool: `workers` processes `program args… <token> <slot>`; the failure
/// `c("interrupt", …)` if Ctrl-C came while they started (the R wrapper signals it).
#[extendr]
#[allow(clippy::too_many_arguments)]
fn pool_new(
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

/// The pool running the current task (see `mizu_current_pool()`).
#[extendr]
fn pool_nested() -> Result<Robj> {
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

/// `list(n_workers, nested, running, foreign)`.
#[extendr]
fn pool_info(pool: Robj) -> Result<List> {
    let p = pool_ref(&pool)?;
    Ok(List::from_values([
        Robj::from(p.workers),
        Robj::from(p.nested),
        Robj::from(p.nested || p.inner.borrow().is_some()),
        Robj::from(p.foreign),
    ]))
}

/// Submits a chunk of a map over a pool of another language's workers: `call` a
/// `mizu_call()`, `vars` further keyword arguments (a named list), `elements` the chunk's
/// elements (a list; each is appended to the arguments), element `j` under the stream
/// `(seed, first + j)`. The task handle, or a failure `c(class, message)`.
#[extendr]
fn pool_submit_xchunk(
    pool: Robj,
    call: Robj,
    vars: Robj,
    elements: Robj,
    seed: Robj,
    first: f64,
) -> Result<Robj> {
    let p = pool_ref(&pool)?;
    let seed = if seed.is_null() { None } else { seed.as_real() };
    // SAFETY: R's main thread; the arguments are held by their Robjs for the call.
    let env = unsafe {
        crate::xvalue::chunk_envelope(call.get(), vars.get(), elements.get(), seed, first)
    };
    submit_xenvelope(&pool, p, env)
}

/// Submits a cross-language payload to `p` (whose handle is `pool`): the task handle, or a
/// failure `c(class, message)` (`env`'s error says why the task cannot cross).
fn submit_xenvelope(
    pool: &Robj,
    p: &RPool,
    env: std::result::Result<mizu_pool::wire::envelope::Envelope, String>,
) -> Result<Robj> {
    let env = match env {
        Ok(env) => env,
        Err(why) => return Ok(failure("mizu_error_not_portable", why)),
    };
    // SAFETY: R's main thread; `pool` is the live handle of `p`; the new handle is protected
    // by the Robj from here on.
    Ok(match unsafe { submit_encoded(pool.get(), p, &env) }? {
        // SAFETY: as above.
        Ok(t) => unsafe { Robj::from_sexp(crate::handle::task_handle(pool.get(), &p.batch, t)) },
        Err(f) => f,
    })
}

/// Checks a task message `list(kind, expr, vars)`: as [`check_vars_sexp`].
fn check_msg(msg: &Robj) -> std::result::Result<(), Unsendable> {
    // SAFETY: `msg` is protected by its handle for the call.
    unsafe { check_msg_sexp(msg.get()) }
}

/// [`check_msg`] on a raw value (no R handles: it runs on every submit).
///
/// # Safety
/// `msg` is a live SEXP; this only reads it.
pub(crate) unsafe fn check_msg_sexp(msg: SEXP) -> std::result::Result<(), Unsendable> {
    use extendr_ffi::{TYPEOF, VECTOR_ELT, XLENGTH};
    // SAFETY: reads of live objects (the caller's contract).
    unsafe {
        // (A fourth element, an expression task's globals, is checked by the R code that
        // found them.)
        if TYPEOF(msg) != SEXPTYPE::VECSXP || !matches!(XLENGTH(msg), 3 | 4) {
            return Ok(());
        }
        check_vars_sexp(VECTOR_ELT(msg, 2))
    }
}

/// Why a task cannot be submitted: the class of the R condition and its message.
#[derive(Debug)]
pub(crate) struct Unsendable {
    /// The condition's class (it inherits `mizu_error`).
    pub class: &'static str,
    /// The condition's message.
    pub message: String,
}

/// A failure of class `mizu_error`.
impl From<String> for Unsendable {
    fn from(message: String) -> Unsendable {
        Unsendable {
            class: "mizu_error",
            message,
        }
    }
}

impl Unsendable {
    /// The failure `c(class, message)` the R wrappers raise.
    pub(crate) fn failure(&self) -> Robj {
        failure(self.class, &self.message)
    }
}

/// [`check_msg_sexp`] of a message's bindings `vars`: every value of a non-empty list is
/// named, and none is (or holds in a list) an environment or an external pointer, unless the
/// list is marked `mizu_copy` (the future backend's globals, sent as copies as `future`'s
/// other backends send them).
///
/// # Safety
/// `vars` is a live SEXP; this only reads it (and allocates only to describe a failure).
pub(crate) unsafe fn check_vars_sexp(vars: SEXP) -> std::result::Result<(), Unsendable> {
    // SAFETY: reads of a live object (the caller's contract).
    unsafe {
        check_var_names(vars)?;
        match portability(vars, "argument ") {
            Some(u) if !copies_allowed(vars) => Err(u),
            _ => Ok(()),
        }
    }
}

/// The names part of [`check_vars_sexp`]: every value of a non-empty list `vars` is named.
/// Enough before the compact encoding, which takes no environment or external pointer (a
/// binding it does not take goes through the whole check).
///
/// # Safety
/// `vars` is a live SEXP; this only reads it.
pub(crate) unsafe fn check_var_names(vars: SEXP) -> std::result::Result<(), Unsendable> {
    use extendr_ffi::{R_NaString, STRING_ELT, TYPEOF, XLENGTH};
    const BAD: &str = "the values in `...` must be named: they are the bindings the expression \
                       sees";
    // SAFETY: reads of a live object (the caller's contract).
    unsafe {
        if TYPEOF(vars) != SEXPTYPE::VECSXP || XLENGTH(vars) == 0 {
            return Ok(());
        }
        let names = list_names(vars);
        if TYPEOF(names) != SEXPTYPE::STRSXP || XLENGTH(names) != XLENGTH(vars) {
            return Err(Unsendable::from(BAD.to_owned()));
        }
        for i in 0..XLENGTH(names) {
            let n = STRING_ELT(names, i);
            if n == R_NaString || extendr_ffi::LENGTH(n) == 0 {
                return Err(Unsendable::from(BAD.to_owned()));
            }
        }
        Ok(())
    }
}

/// The names of the list `vars` (`R_NilValue` when it has none): its `names` attribute as
/// stored, found without `Rf_getAttrib`'s checks for other kinds of object; a list without one
/// asks it (a one-dimensional array's names are its dimnames). Neither allocates.
///
/// # Safety
/// R's main thread; `vars` is a live SEXP.
pub(crate) unsafe fn list_names(vars: SEXP) -> SEXP {
    use extendr_ffi::{R_NamesSymbol, TYPEOF};
    // SAFETY: reads of a live object's attribute list (the caller's contract).
    unsafe {
        let mut a = crate::ffi::ATTRIB(vars);
        while TYPEOF(a) == SEXPTYPE::LISTSXP {
            if extendr_ffi::TAG(a) == R_NamesSymbol {
                return extendr_ffi::CAR(a);
            }
            a = extendr_ffi::CDR(a);
        }
        extendr_ffi::Rf_getAttrib(vars, R_NamesSymbol)
    }
}

/// Whether `vars` carries the `mizu_copy` mark (looked up only when a check failed).
///
/// # Safety
/// `vars` is a live SEXP.
unsafe fn copies_allowed(vars: SEXP) -> bool {
    // SAFETY: reads of a live object; `Rf_install` of an ASCII name.
    unsafe {
        let mark = extendr_ffi::Rf_install(c"mizu_copy".as_ptr());
        extendr_ffi::TYPEOF(extendr_ffi::Rf_getAttrib(vars, mark)) != SEXPTYPE::NILSXP
    }
}

/// One step into a list: by name (`$a`) or position (`[[2]]`).
enum Step {
    Name(String),
    Index(isize),
}

/// An environment or external pointer in `x`, the elements of a list `x` (recursively) — the
/// values R's serialization would send as a copy or as a null pointer — as an error naming
/// where it sits: `{prefix}`, then the first step as `` `name` `` or its position, then the
/// further steps as R would index them. Environments that travel by name (the global, base
/// and empty environments, namespaces, attached packages) pass. A function's environment is
/// not looked into: a closure travels with its environment, as R sends it.
///
/// # Safety
/// `x` is a live SEXP; this only reads it until it has found something to report.
pub(crate) unsafe fn portability(x: SEXP, prefix: &str) -> Option<Unsendable> {
    /// What was found, and the steps to it (innermost first).
    unsafe fn find(x: SEXP, depth: usize) -> Option<(bool, Vec<Step>)> {
        use extendr_ffi::{
            R_BaseEnv, R_EmptyEnv, R_GlobalEnv, R_IsNamespaceEnv, R_IsPackageEnv, R_NamesSymbol,
            Rf_getAttrib, STRING_ELT, TYPEOF, VECTOR_ELT, XLENGTH,
        };
        // SAFETY: reads of live objects (the caller's contract; list elements are kept alive
        // by their list).
        unsafe {
            match TYPEOF(x) {
                SEXPTYPE::ENVSXP => {
                    let by_name = x == R_GlobalEnv
                        || x == R_BaseEnv
                        || x == R_EmptyEnv
                        || R_IsNamespaceEnv(x) != extendr_ffi::Rboolean::FALSE
                        || R_IsPackageEnv(x) != extendr_ffi::Rboolean::FALSE;
                    (!by_name).then(|| (true, Vec::new()))
                }
                SEXPTYPE::EXTPTRSXP => Some((false, Vec::new())),
                // Deeper lists than this are left to the serializer (no stack overflow here).
                SEXPTYPE::VECSXP if depth < 64 => {
                    for i in 0..XLENGTH(x) {
                        if let Some((env, mut steps)) = find(VECTOR_ELT(x, i), depth + 1) {
                            let names = Rf_getAttrib(x, R_NamesSymbol);
                            let name = (TYPEOF(names) == SEXPTYPE::STRSXP).then(|| {
                                let c = STRING_ELT(names, i);
                                std::ffi::CStr::from_ptr(extendr_ffi::R_CHAR(c))
                                    .to_string_lossy()
                                    .into_owned()
                            });
                            steps.push(match name {
                                Some(n) if !n.is_empty() => Step::Name(n),
                                _ => Step::Index(i + 1),
                            });
                            return Some((env, steps));
                        }
                    }
                    None
                }
                _ => None,
            }
        }
    }
    // SAFETY: the caller's contract.
    let (env, steps) = unsafe { find(x, 0) }?;
    let mut at = prefix.to_owned();
    for (k, step) in steps.iter().rev().enumerate() {
        match (k, step) {
            (0, Step::Name(n)) => at.push_str(&format!("`{n}`")),
            (0, Step::Index(i)) => at.push_str(&i.to_string()),
            (_, Step::Name(n)) => at.push_str(&format!("${n}")),
            (_, Step::Index(i)) => at.push_str(&format!("[[{i}]]")),
        }
    }
    let message = if env {
        format!(
            "{at}: an environment cannot be sent to a worker (it would arrive as a copy, and \
             changes made there would not come back); send the values it holds instead, \
             e.g. as.list()"
        )
    } else {
        format!(
            "{at}: an external pointer cannot be sent to another process (it would arrive as \
             a null pointer)"
        )
    };
    Some(Unsendable {
        class: "mizu_error_not_portable",
        message,
    })
}

/// `NULL` when nothing in `x` is an environment or external pointer (see [`portability`]),
/// else the failure `c("mizu_error_not_portable", message)`, its place named after `what`
/// (e.g. "argument " or "`.x` element ").
#[extendr]
fn check_portable(x: Robj, what: &str) -> Robj {
    // SAFETY: `x` is protected by its handle for the call.
    match unsafe { portability(x.get(), what) } {
        Some(u) => u.failure(),
        None => ().into(),
    }
}

/// Submits a task message: the task (class `mizu_task`), or `c(class, message)` when it
/// cannot be submitted. When every task slot is taken, finished outcomes are moved into their
/// tasks first (and, if none is finished, it waits for one, up to the pool's submit timeout).
#[extendr]
fn pool_submit(pool: Robj, msg: Robj) -> Result<Robj> {
    let p = pool_ref(&pool)?;
    if let Err(u) = check_msg(&msg) {
        return Ok(u.failure());
    }
    // SAFETY: `msg` is protected by its handle for the call.
    let out = Outgoing::encode_sexp(unsafe { msg.get() })?;
    // SAFETY: R's main thread; `pool` is the live handle of `p`.
    Ok(match unsafe { submit_encoded(pool.get(), p, &out) }? {
        // SAFETY: R's main thread; `pool` is the live handle of `p`; the new handle is
        // protected by the Robj from here on.
        Ok(t) => unsafe { Robj::from_sexp(crate::handle::task_handle(pool.get(), &p.batch, t)) },
        Err(f) => f,
    })
}

/// Submits an encoded task message: the task, or the failure for the R wrapper (`c(class,
/// message)`) when it cannot be submitted.
///
/// # Safety
/// R's main thread; `pool` is the live, protected handle of `p`.
pub(crate) unsafe fn submit_encoded(
    pool: SEXP,
    p: &RPool,
    out: &dyn mizu_pool::Fill,
) -> Result<std::result::Result<RTask, Robj>> {
    // A collection that views asked for runs here, before the task's handle exists, rather
    // than when its result is decoded: there the handle would survive the collection, be
    // promoted, and keep the result (a few MB of views of a data frame, say) alive until a
    // full collection, long after the program dropped both.
    crate::view::collect_garbage_if_due();
    if p.nested {
        return with_context(|c| {
            let ctx = c.ok_or_else(|| rerr("this pool handle only works inside its task"))?;
            Ok(match ctx.submit_with(out) {
                Ok(t) => Ok(RTask::new(t)),
                Err(e) => Err(submit_failure(e)),
            })
        });
    }
    let mut room = Room::new(pool, p);
    Ok(retrying(&mut room, |slice| {
        let g = p.inner.borrow();
        let inner = g.as_ref().ok_or(PoolError::Stopped)?;
        inner.submit_with(out, Some(slice))
    })
    .map(RTask::new))
}

/// The R package's part in the submit policy (`mizu_pool::retry`): waits go in slices with
/// Ctrl-C checked between them, and end at the pool's submit timeout; a full set of slots is
/// drained into the task handles; a full `/dev/shm` runs R's garbage collector.
struct Room<'a> {
    /// The live, protected handle of `p`.
    pool: SEXP,
    p: &'a RPool,
    /// When the submission started and the pool's submit timeout (the clock is read only
    /// when there is a timeout to keep).
    start: Option<(Instant, Duration)>,
}

impl<'a> Room<'a> {
    fn new(pool: SEXP, p: &'a RPool) -> Room<'a> {
        Room {
            pool,
            p,
            start: p.submit_timeout.map(|t| (Instant::now(), t)),
        }
    }

    fn left(&self) -> Option<Duration> {
        self.start.map(|(s, t)| t.saturating_sub(s.elapsed()))
    }

    fn timed_out(&self) -> Robj {
        submit_failure(PoolError::SubmitTimeout(
            self.p.submit_timeout.unwrap_or_default(),
        ))
    }
}

impl MakeRoom for Room<'_> {
    type Error = Robj;

    fn slice(&mut self) -> Duration {
        self.left().map_or(SLICE, |l| l.min(SLICE))
    }

    fn waited(&mut self) -> std::result::Result<(), Robj> {
        if self.left().is_some_and(|l| l.is_zero()) {
            return Err(self.timed_out());
        }
        if interrupt::pending() {
            return Err(interrupted());
        }
        Ok(())
    }

    fn drain(&mut self) -> std::result::Result<(), Robj> {
        match self.p.drain(self.left()) {
            Drained::Freed => Ok(()),
            Drained::TimedOut => Err(self.timed_out()),
            Drained::Interrupted => Err(interrupted()),
        }
    }

    /// Views this session no longer uses may hold `/dev/shm` (and, through the workers, the
    /// memory of earlier sends). The outcomes of tasks whose handles were dropped uncollected
    /// hold their references until their whole batch of handles is garbage: the batch being
    /// filled is let go first, so that the collection can drop it.
    fn collect(&mut self) {
        // SAFETY: R's main thread; `pool` is the live handle of `p` (`Room::new`'s callers).
        unsafe { crate::handle::seal_batch(self.pool, &self.p.batch) };
    }

    fn fail(&mut self, e: PoolError) -> Robj {
        submit_failure(e)
    }
}

/// Submits several task messages with one publication per worker queue: `list(tasks,
/// failure)` where `failure` is NULL or `c(class, message)` for the rest.
#[extendr]
fn pool_submit_batch(pool: Robj, msgs: List) -> Result<List> {
    let p = pool_ref(&pool)?;
    // As in `submit_encoded`: before the handles exist.
    crate::view::collect_garbage_if_due();
    for m in msgs.values() {
        if let Err(u) = check_msg(&m) {
            return Ok(batch_list(Vec::new(), Some(u.failure())));
        }
    }
    let outs: Vec<Outgoing> = msgs
        .values()
        .map(|v| Outgoing::encode(&v))
        .collect::<Result<_>>()?;
    if p.nested {
        return with_context(|c| {
            let ctx = c.ok_or_else(|| rerr("this pool handle only works inside its task"))?;
            let (ts, res) = ctx.submit_batch_with(outs.iter().map(|o| o as &dyn mizu_pool::Fill));
            let tasks = ts.into_iter().map(|t| handle(&pool, p, t)).collect();
            Ok(batch_list(tasks, res.err().map(submit_failure)))
        });
    }
    let mut tasks = Vec::with_capacity(outs.len());
    if outs.is_empty() {
        return Ok(batch_list(tasks, None));
    }
    // SAFETY: R's main thread; `pool` is the live handle of `p`, protected by the Robj for
    // the call.
    let mut room = Room::new(unsafe { pool.get() }, p);
    let fail = retrying(&mut room, |slice| {
        let (ts, res) = {
            let g = p.inner.borrow();
            let inner = g.as_ref().ok_or(PoolError::Stopped)?;
            inner.submit_batch_with(
                outs[tasks.len()..]
                    .iter()
                    .map(|o| o as &dyn mizu_pool::Fill),
                Some(slice),
            )
        };
        // Each task gets its handle at once: `drain` finds tasks through their handles' batches.
        tasks.extend(ts.into_iter().map(|t| handle(&pool, p, t)));
        res
    })
    .err();
    Ok(batch_list(tasks, fail))
}

/// A new handle of `t`, submitted to `p` (whose handle is `pool`).
fn handle(pool: &Robj, p: &RPool, t: mizu_pool::Task) -> Robj {
    // SAFETY: R's main thread; `pool` is the live handle of `p`; the new handle is protected
    // by its Robj at once.
    unsafe {
        Robj::from_sexp(crate::handle::task_handle(
            pool.get(),
            &p.batch,
            RTask::new(t),
        ))
    }
}

fn batch_list(tasks: Vec<Robj>, fail: Option<Robj>) -> List {
    let fail = fail.unwrap_or_else(|| Robj::from(()));
    List::from_values([List::from_values(tasks).into(), fail])
}

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
        let t = crate::handle::task_ref(task).ok_or_else(|| rerr("`task` must be a mizu_task"))?;
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
            TaskError::Runtime(m) => {
                mk(status::RUNTIME, nil(), 0, 0, m.trim_start_matches("mizu: "))
            }
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
        Decoded::Text(t) => mk(status::RUNTIME, ().into(), 0, 0, &t),
    }
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

/// Waits at most `timeout` seconds (Inf: forever) for the task's outcome (see `outcome`);
/// asked again, returns the same outcome. Inside a worker, waiting runs other tasks (nested
/// maps never deadlock).
#[extendr]
fn task_collect(task: Robj, timeout: Robj) -> Result<Robj> {
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
                crate::view::collect_if_pressed();
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
            Ok(b) if let Some(v) = crate::codec::decode_small(&b) => {
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

/// Whether the task's outcome is ready to collect (or was collected).
#[extendr]
fn task_done(task: Robj) -> Result<bool> {
    Ok(task_ref(&task)?.is_done())
}

/// Whether the task was collected.
#[extendr]
fn task_collected(task: Robj) -> Result<bool> {
    Ok(matches!(
        &*task_ref(&task)?.cell.borrow(),
        TaskState::Done { .. }
    ))
}

/// Cancels the task if it has not started; whether it will never run.
#[extendr]
fn task_cancel(task: Robj) -> Result<bool> {
    let t = task_ref(&task)?;
    Ok(matches!(&*t.cell.borrow(), TaskState::Pending(t) if t.cancel()))
}

/// Waits until one of `tasks` that was not collected yet has an outcome: its 1-based
/// position, 0 after `timeout` seconds, -1 on Ctrl-C, -2 when every task was collected.
#[extendr]
fn task_wait_any(tasks: List, timeout: Robj) -> Result<i32> {
    let ts: Vec<&RTask> = tasks
        .values()
        .map(|t| task_ref(&t).map(|r| r as *const RTask))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        // SAFETY: each task is kept alive by the `tasks` list for this whole call.
        .map(|p| unsafe { &*p })
        .collect();
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

/// Per worker: `list(slot, pid, state, busy, tasks, steals)` columns.
#[extendr]
fn pool_status(pool: Robj) -> Result<List> {
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

/// Stops the pool (queued tasks cancelled, running ones fail, uncollected results dropped);
/// idempotent; a no-op on the handle of `mizu_current_pool()`. What its workers left in shared
/// memory is removed.
#[extendr]
fn pool_stop(pool: Robj, grace: f64) -> Result<()> {
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

extendr_module! {
    mod pool;
    fn pool_new;
    fn pool_nested;
    fn pool_info;
    fn pool_submit_xchunk;
    fn check_portable;
    fn pool_submit;
    fn pool_submit_batch;
    fn pool_status;
    fn pool_stop;
    fn task_collect;
    fn live_tasks;
    fn task_done;
    fn task_collected;
    fn task_cancel;
    fn task_wait_any;
}
