//! The worker's side: runs R's task callback for every task, with the task's context reachable
//! from R (nested submission, the element index of a map).

use std::cell::Cell;

use extendr_api::Result;
use extendr_api::prelude::*;
use mizu_pool::{Executor, TaskContext};

use crate::codec::{Decoded, Outgoing, decode, text};
use crate::ffi;
use crate::rerr;
use crate::rtry::try_r;

/// The context of the task this thread is running, if any (set by the runtime).
pub use mizu_pool::with_current_task as with_context;

/// Runs R's `run(msg)` for every task, and `failed(msg)` — which returns the condition `run`
/// raised, as the R side recorded it — when it raised an error.
struct RExec {
    run: Function,
    failed: Function,
    max_tasks: u64,
    tasks: Cell<u64>,
}

// SAFETY: `mizu_pool::run_worker` calls `execute` only on the thread that called it — R's main
// thread (see `run_worker` below); the R objects are never touched from another thread.
unsafe impl Send for RExec {}
// SAFETY: as above.
unsafe impl Sync for RExec {}

/// `f(arg)` evaluated in the global environment, or `Err` if it raised an error (the R side
/// records the condition: see `.run_task`).
fn call1(f: &Function, arg: &Robj) -> std::result::Result<Robj, ()> {
    // SAFETY: R's main thread; `f` and `arg` are protected by their handles; the closure owns
    // nothing; the call is protected while it is evaluated.
    unsafe {
        let (fs, a) = (f.get(), arg.get());
        try_r(move || {
            let call = extendr_ffi::Rf_protect(ffi::Rf_lang2(fs, a));
            let v = ffi::Rf_eval(call, extendr_ffi::R_GlobalEnv);
            extendr_ffi::Rf_unprotect(1);
            v
        })
        .map(|v| Robj::from_sexp(v))
    }
}

impl RExec {
    fn run(&self, ctx: &TaskContext<'_>, input: &[u8]) -> std::result::Result<Vec<u8>, Vec<u8>> {
        let buf = ctx
            .input()
            .unwrap_or_else(|| arrow_buffer::Buffer::from_slice_ref(input));
        let msg = match decode(buf) {
            Ok(Decoded::Value(v)) => v,
            Ok(Decoded::Text(t)) => return Err(text(&format!("mizu: a text payload: {t}"))),
            Err(e) => return Err(text(&e.to_string())),
        };
        bind_vars(&msg);
        let (ok, value) = match call1(&self.run, &msg) {
            Ok(v) => (true, v),
            Err(()) => match call1(&self.failed, &msg) {
                Ok(c) => (false, c),
                Err(()) => return Err(text("mizu: the task failed and so did reporting it")),
            },
        };
        let out = match Outgoing::encode(&value) {
            Ok(o) => o,
            Err(e) => {
                let why = format!(
                    "mizu: the task's {} cannot be sent: {e}",
                    if ok { "value" } else { "error" }
                );
                return Err(text(&why));
            }
        };
        // Write straight into the result slot/region; fall back to bytes where that is not
        // possible (inside a map element).
        if ctx.reply(ok, &out as &dyn mizu_pool::Fill).is_ok() {
            return Ok(Vec::new());
        }
        let v = out.to_vec();
        if ok { Ok(v) } else { Err(v) }
    }
}

impl Executor for RExec {
    fn execute(
        &self,
        ctx: &TaskContext<'_>,
        input: &[u8],
    ) -> std::result::Result<Vec<u8>, Vec<u8>> {
        let r = self.run(ctx, input);
        let n = self.tasks.get() + 1;
        self.tasks.set(n);
        if self.max_tasks > 0 && n >= self.max_tasks {
            ctx.recycle();
        }
        r
    }

    fn idle(&self) {
        crate::view::collect_garbage_when_idle();
    }
}

/// Serves a pool as worker `slot` until it stops, running `run(msg)` for each task and
/// `failed(msg)` for each task that raised an error; with `max_tasks > 0` the worker leaves
/// after that many tasks and the pool replaces it.
#[extendr]
fn run_worker(
    token: &str,
    slot: i32,
    run: Function,
    failed: Function,
    max_tasks: f64,
) -> Result<()> {
    let slot = usize::try_from(slot).map_err(|_| rerr("bad worker slot"))?;
    let exec = RExec {
        run,
        failed,
        max_tasks: max_tasks.max(0.0) as u64,
        tasks: Cell::new(0),
    };
    mizu_pool::run_worker(token, slot, &exec).map_err(rerr)
}

/// For an expression task (`list("e", expr, vars)`, freshly decoded and owned here): replaces
/// `vars` by the environment the expression is evaluated in — the bindings in a new
/// environment whose parent is the global environment — so R does not make it (saves an R
/// call per task). Anything else is left as it is.
fn bind_vars(msg: &Robj) {
    let Some(l) = msg.as_list() else {
        return;
    };
    if l.len() != 3 || l.elt(0).ok().and_then(|k| k.as_str().map(|k| k == "e")) != Some(true) {
        return;
    }
    let Ok(vars) = l.elt(2).and_then(List::try_from) else {
        return;
    };
    if let Ok(env) = task_env(vars) {
        // SAFETY: `msg` is a list of length 3 (checked) that nobody else holds yet; `env` is
        // protected by its handle until the list owns it.
        unsafe { extendr_ffi::SET_VECTOR_ELT(msg.get(), 2, env.get()) };
    }
}

/// The environment a task's expression is evaluated in: the named values of `vars` bound in a
/// new environment whose parent is the global environment.
fn task_env(vars: List) -> Result<Robj> {
    // SAFETY: R's main thread; `vars` is protected by its handle; the closure owns nothing
    // (an allocation error is caught by `try_r`); the new environment is protected while the
    // bindings are made.
    unsafe {
        let v = vars.get();
        let r = try_r(move || {
            let env = extendr_ffi::Rf_protect(ffi::R_NewEnv(extendr_ffi::R_GlobalEnv, 0, 29));
            let names = extendr_ffi::Rf_getAttrib(v, extendr_ffi::R_NamesSymbol);
            if extendr_ffi::TYPEOF(names) == extendr_ffi::SEXPTYPE::STRSXP {
                for i in 0..extendr_ffi::XLENGTH(v) {
                    let sym = ffi::Rf_installChar(extendr_ffi::STRING_ELT(names, i));
                    ffi::Rf_defineVar(sym, extendr_ffi::VECTOR_ELT(v, i), env);
                }
            }
            extendr_ffi::Rf_unprotect(1);
            env
        });
        r.map(|e| Robj::from_sexp(e))
            .map_err(|()| rerr("cannot make the task's environment"))
    }
}

/// Whether this process is running a task (inside a worker).
#[extendr]
fn in_task() -> bool {
    with_context(|c| c.is_some())
}

/// The worker slot of this process while it runs a task (else NULL).
#[extendr]
fn worker_slot() -> Option<i32> {
    with_context(|c| c.map(|c| c.worker_slot() as i32))
}

extendr_module! {
    mod worker;
    fn run_worker;
    fn in_task;
    fn worker_slot;
}
