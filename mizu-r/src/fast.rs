//! Plain `.Call` entry points for the two calls every task makes — submit and collect —
//! without extendr's wrappers, whose argument and result tracking costs more than the rest of
//! the call (a hash-table update per R value). R reaches them through `NativeSymbol` external
//! pointers (`.native` in the package namespace, filled when the package loads).
//!
//! Each entry point returns a value the R wrapper understands even when something is wrong:
//! no R error is raised from here (so none long-jumps over Rust frames; R running out of
//! memory while allocating a result is the exception, as everywhere in extendr code) and a
//! panic is caught.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use extendr_api::prelude::*;
use extendr_ffi::{R_NilValue, Rf_protect, Rf_unprotect, SEXP};

use crate::collect::{Collected, collect_protected, task_at, timeout_sexp};
use crate::encode::Outgoing;
use crate::handle::{kept_with, mk_string};
use crate::pool::{pool_at, stale};
use crate::sendable::{Unsendable, check_msg_sexp, check_var_names};
use crate::submit::submit_encoded;

/// The message of an error for R, without the `mizu: ` prefix the R side adds.
fn message(e: impl std::fmt::Display) -> String {
    let m = e.to_string();
    m.strip_prefix("mizu: ").map(str::to_owned).unwrap_or(m)
}

/// `f()`, with a panic turned into a message (none may unwind into R).
fn guarded<T, E: From<String>>(f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(E::from(
            "internal error (see the panic message above)".into(),
        ))
    })
}

/// Submits `msg` (`list(kind, expr, vars)`) to `pool`: the task handle, or `c(class,
/// message)` for the R wrapper to raise (messages as the other entry points word them).
///
/// # Safety
/// R's main thread, from `.Call` or `mizu_submit_shim` (`shims.c`), with both arguments
/// protected for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mizu_rs_submit(pool: SEXP, msg: SEXP) -> SEXP {
    // SAFETY: R's main thread (`.Call`); `msg` is protected by R (or by the caller) meanwhile.
    unsafe {
        let p = pool_at(pool);
        let to = p.as_ref().ok().and_then(|p| p.repeats_key());
        submit_to(pool, p, || {
            check_msg_sexp(msg)?;
            Outgoing::encode_task(msg, to).map_err(|e| Unsendable::from(e.to_string()))
        })
    }
}

/// Submits the payload `encode` makes to `pool` (the pool behind it already looked up, `p`):
/// as [`submit`] answers.
///
/// # Safety
/// R's main thread; `pool` and whatever `encode` reads are protected meanwhile; `p` is
/// `pool_at(pool)`.
unsafe fn submit_to(
    pool: SEXP,
    p: extendr_api::Result<&crate::pool::RPool>,
    encode: impl FnOnce() -> Result<Outgoing, Unsendable>,
) -> SEXP {
    let r = guarded(|| {
        // SAFETY: R's main thread (`.Call`); `pool` is protected by R for the call.
        unsafe {
            let p = p.map_err(|e| Unsendable::from(e.to_string()))?;
            if p.foreign {
                return Err(Unsendable::from(
                    "a pool of Python workers runs mizu_call() tasks (see mizu_submit())"
                        .to_string(),
                ));
            }
            let out = encode()?;
            Ok(
                match submit_encoded(pool, p, &out).map_err(|e| Unsendable::from(e.to_string()))? {
                    Ok(t) => crate::batch::task_handle(pool, &p.batch, t),
                    // The failure's Robj is released here; nothing allocates before R has it.
                    Err(f) => f.get(),
                },
            )
        }
    });
    match r {
        Ok(x) => x,
        // SAFETY: R's main thread.
        Err(u) => unsafe { failure_sexp(u.class, &u.message) },
    }
}

thread_local! {
    /// `c("mizu_foreign", "")`, made once: see [`foreign_marker`].
    static FOREIGN: Cell<Option<SEXP>> = const { Cell::new(None) };
    /// `c("mizu_globals", "")`, made once: see [`globals_marker`].
    static GLOBALS: Cell<Option<SEXP>> = const { Cell::new(None) };
}

/// `c("mizu_foreign", "")`: what a submit to a pool of another language's workers returns
/// for the shim (`shims.c`) to submit the expression's value instead.
///
/// # Safety
/// R's main thread.
unsafe fn foreign_marker() -> SEXP {
    // SAFETY: the caller's contract.
    unsafe { kept_with(&FOREIGN, || marker("mizu_foreign")) }
}

/// `c("mizu_globals", "")`: what a submit of an expression that may use the caller's
/// variables returns for the shim (`shims.c`) to find them. Kept, not made per submit: such
/// submits are common (a script's function called in the task), and the shim only reads it.
///
/// # Safety
/// R's main thread.
unsafe fn globals_marker() -> SEXP {
    // SAFETY: the caller's contract.
    unsafe { kept_with(&GLOBALS, || marker("mizu_globals")) }
}

/// `c(what, "")`: a submit the shim (`shims.c`) completes in R (unprotected).
fn marker(what: &str) -> SEXP {
    // SAFETY: R's main thread; the vector is protected while its elements are set.
    unsafe {
        let v = Rf_protect(extendr_ffi::Rf_allocVector(
            extendr_ffi::SEXPTYPE::STRSXP,
            2,
        ));
        extendr_ffi::SET_STRING_ELT(v, 0, extendr_ffi::STRING_ELT(mk_string(what), 0));
        extendr_ffi::SET_STRING_ELT(v, 1, extendr_ffi::STRING_ELT(mk_string(""), 0));
        Rf_unprotect(1);
        v
    }
}

/// `NULL` when nothing in `values` (an expression task's globals, a named list) is an
/// environment or an external pointer, else the failure `c("mizu_error_not_portable",
/// message)` naming the global. Called by `mizu_expr_message_in` (`globals.c`), which raises
/// it.
///
/// # Safety
/// R's main thread; `values` is protected by the caller.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mizu_rs_check_globals(values: SEXP) -> SEXP {
    // SAFETY: the caller's contract; the result is a fresh value the caller protects.
    unsafe {
        // (No R handle: making one costs more than the check of a few values.)
        let r = guarded(|| Ok::<_, String>(crate::sendable::portability(values, "global ")));
        match r {
            Ok(None) => R_NilValue,
            Ok(Some(u)) => failure_sexp(u.class, &u.message),
            Err(why) => failure_sexp("mizu_error", &why),
        }
    }
}

/// Submits the expression `expr` with the bindings `vars` (a named list): what [`submit`]
/// does with `list("e", expr, vars)`. The message's compact encoding is written from its
/// parts; only bindings that need another encoding (or fail the names check) make the list,
/// here rather than by R's `list()` (a builtin call costs more than the allocation). Called
/// by `mizu_submit_shim` (`shims.c`), which raises the failures.
///
/// # Safety
/// R's main thread, from `.Call` (the arguments are protected by R for the call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mizu_rs_submit_expr(pool: SEXP, expr: SEXP, vars: SEXP) -> SEXP {
    // SAFETY: R's main thread (`.Call`); the arguments are protected by R for the call; the
    // message is protected while its elements are set and while it is submitted.
    unsafe {
        let p = pool_at(pool);
        if p.as_ref().is_ok_and(|p| p.foreign) {
            // The shim submits the expression's value as a cross-language call.
            return foreign_marker();
        }
        // An expression that may use the caller's variables: the shim has R find its globals.
        if crate::globals::may_use(expr, vars) {
            return globals_marker();
        }
        // The common message goes out without being made: its compact encoding is written
        // from its parts, large vectors and shared views out of band (bindings that fail the
        // names check or need another encoding take the list, and its whole check: what the
        // compact encoding takes holds no environment or external pointer).
        if check_var_names(vars).is_ok()
            && let Some(out) = Outgoing::encode_expr_task(
                expr,
                vars,
                p.as_ref().ok().and_then(|p| p.repeats_key()),
            )
        {
            return submit_to(pool, p, || out.map_err(|e| Unsendable::from(e.to_string())));
        }
        let msg = Rf_protect(extendr_ffi::Rf_allocVector(
            extendr_ffi::SEXPTYPE::VECSXP,
            3,
        ));
        extendr_ffi::SET_VECTOR_ELT(msg, 0, crate::handle::kept_expr_kind());
        extendr_ffi::SET_VECTOR_ELT(msg, 1, expr);
        extendr_ffi::SET_VECTOR_ELT(msg, 2, vars);
        let r = mizu_rs_submit(pool, msg);
        Rf_unprotect(1);
        r
    }
}

/// [`collect_protected`] with a bad argument as a message; protected once when `Ok`.
///
/// # Safety
/// R's main thread (`.Call`); `task` and `timeout` are protected by R for the call.
unsafe fn collected(task: SEXP, timeout: SEXP) -> Result<Collected, String> {
    guarded(|| {
        // SAFETY: the caller's contract; the result comes back protected once.
        unsafe {
            let t = task_at(task).map_err(message)?;
            let timeout = timeout_sexp(timeout).map_err(message)?;
            collect_protected(t, task, timeout).map_err(message)
        }
    })
}

/// The outcome list of a runtime failure (status 9) with message `why` (unprotected).
///
/// # Safety
/// R's main thread.
unsafe fn failure_outcome(why: &str) -> SEXP {
    // SAFETY: R's main thread; the list is protected while its elements are made.
    unsafe {
        let o = Rf_protect(extendr_ffi::Rf_allocVector(
            extendr_ffi::SEXPTYPE::VECSXP,
            5,
        ));
        extendr_ffi::SET_VECTOR_ELT(o, 0, extendr_ffi::Rf_ScalarInteger(9));
        extendr_ffi::SET_VECTOR_ELT(o, 4, mk_string(why));
        Rf_unprotect(1);
        o
    }
}

/// Collects `task` within `timeout` seconds: its outcome (see `pool::outcome`); a bad
/// argument is an outcome of status 9 with the message.
unsafe extern "C" fn collect(task: SEXP, timeout: SEXP) -> SEXP {
    // SAFETY: R's main thread (`.Call`); the arguments are protected by R for the call; the
    // protection `collected` leaves is handed to `into_outcome` and then popped.
    unsafe {
        match collected(task, timeout) {
            Ok(c) => {
                let o = c.into_outcome();
                Rf_unprotect(1);
                o
            }
            Err(why) => failure_outcome(&why),
        }
    }
}

/// Collects `task` within `timeout` seconds for `mizu_collect_shim` (`shims.c`): the plain
/// value, with `*outcome` set to 0; or, with `*outcome` set to 1, an outcome list (see
/// `pool::outcome`) for R's `.value()` to turn into a value or a condition (a bad argument is
/// an outcome of status 9 with the message).
///
/// # Safety
/// R's main thread, from `.Call` (the arguments are protected by R for the call); `outcome`
/// points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mizu_rs_collect_value(
    task: SEXP,
    timeout: SEXP,
    outcome: *mut c_int,
) -> SEXP {
    // SAFETY: the caller's contract; the protection `collected` leaves is popped before the
    // value is returned (R protects what `.Call` returns from then on).
    unsafe {
        let (is_outcome, x) = match collected(task, timeout) {
            Ok(Collected::Value(v)) => (0, v),
            Ok(Collected::Outcome(o)) => (1, o),
            Err(why) => {
                *outcome = 1;
                return failure_outcome(&why);
            }
        };
        Rf_unprotect(1);
        *outcome = is_outcome;
        x
    }
}

/// `.submit_many()`: submits the task messages `msgs` (a list) to `pool` as one batch, as
/// `pool_submit_batch` does, without extendr's handle per value (a hash-table update each,
/// which cost more than encoding a small message). `list(tasks, failure)`, or `NULL` when
/// `pool` is not a live pool (or a panic stopped it before a task went out): the extendr
/// routine then words the error.
unsafe extern "C" fn submit_msgs(pool: SEXP, msgs: SEXP) -> SEXP {
    use extendr_ffi::{R_xlen_t, Rf_allocVector, SET_VECTOR_ELT, SEXPTYPE, TYPEOF, VECTOR_ELT};
    // SAFETY: R's main thread (`.Call`); the arguments are protected by R for the call (and
    // so is what the encoded messages refer to); the failure's answer is protected while it
    // is made.
    unsafe {
        let Ok(p) = pool_at(pool) else {
            return R_NilValue;
        };
        if TYPEOF(msgs) != SEXPTYPE::VECSXP {
            return R_NilValue;
        }
        let n = extendr_ffi::XLENGTH(msgs) as usize;
        let key = p.repeats_key();
        let outs = guarded(|| {
            let mut outs = Vec::with_capacity(n);
            for i in 0..n {
                let m = VECTOR_ELT(msgs, i as R_xlen_t);
                if let Err(u) = check_msg_sexp(m) {
                    return Ok(Err(u));
                }
                outs.push(
                    Outgoing::encode_task(m, key).map_err(|e| Unsendable::from(e.to_string()))?,
                );
            }
            Ok::<_, Unsendable>(Ok(outs))
        });
        let outs = match outs {
            Ok(Ok(outs)) => outs,
            Ok(Err(u)) | Err(u) => {
                let tasks = Rf_protect(Rf_allocVector(SEXPTYPE::VECSXP, 0));
                let f = Rf_protect(failure_sexp(u.class, &u.message));
                let a = Rf_allocVector(SEXPTYPE::VECSXP, 2);
                SET_VECTOR_ELT(a, 0, tasks);
                SET_VECTOR_ELT(a, 1, f);
                Rf_unprotect(2);
                return a;
            }
        };
        submit_outs_answer(pool, p, &outs)
    }
}

/// Submits `outs` to `p` (whose handle is `pool`) as one batch and answers `list(tasks,
/// failure)` (see [`submit_msgs`]), or `NULL` when nothing went out because of an error the
/// general path words.
///
/// # Safety
/// R's main thread; `pool` is the live, protected handle of `p`; what `outs` refers to is
/// protected.
unsafe fn submit_outs_answer(pool: SEXP, p: &crate::pool::RPool, outs: &[Outgoing]) -> SEXP {
    use extendr_ffi::{R_xlen_t, Rf_allocVector, SET_VECTOR_ELT, SEXPTYPE};
    // SAFETY: as stated; the handles' list is protected while handles are made and put in
    // it; a failure is held by its Robj until the answer holds it.
    unsafe {
        let n = outs.len();
        // As in `submit_encoded`: before the handles exist.
        crate::altrep::collect_garbage_if_due();
        let tasks = Rf_protect(Rf_allocVector(SEXPTYPE::VECSXP, n as R_xlen_t));
        let mut made = 0;
        let r = guarded(|| {
            crate::submit::submit_outs(pool, p, outs, |t| {
                let h = crate::batch::task_handle(pool, &p.batch, crate::task::RTask::new(t));
                SET_VECTOR_ELT(tasks, made as R_xlen_t, h);
                made += 1;
            })
            .map_err(message)
        });
        let fail = match r {
            Ok(f) => f,
            // (A nested pool used outside its task: the general path raises its error.)
            Err(_) if made == 0 => {
                Rf_unprotect(1);
                return R_NilValue;
            }
            Err(why) => Some(Robj::from_sexp(failure_sexp("mizu_error", &why))),
        };
        let tasks = if made < n {
            extendr_ffi::Rf_xlengthgets(tasks, made as R_xlen_t)
        } else {
            tasks
        };
        let tasks = Rf_protect(tasks);
        let a = Rf_allocVector(SEXPTYPE::VECSXP, 2);
        SET_VECTOR_ELT(a, 0, tasks);
        if let Some(f) = fail {
            SET_VECTOR_ELT(a, 1, f.get());
        }
        Rf_unprotect(2);
        a
    }
}

/// `mizu_submit_batch()` of the common batch: `exprs` (a list of expressions) each with the
/// bindings `vars` (a named list), when none of them may use the caller's variables and each
/// message takes the compact encoding — encoded and submitted here in one call, as
/// `mizu_submit()` does one, with one publication per worker queue. `list(tasks, failure)` as
/// `pool_submit_batch` answers, or `NULL` for any other batch (and for bad arguments): the R
/// function then makes each message (finding globals) and submits them the general way,
/// which also words the errors. As R closures and extendr calls per expression, the same
/// work cost ~4 µs per task.
unsafe extern "C" fn submit_exprs(pool: SEXP, exprs: SEXP, vars: SEXP) -> SEXP {
    use extendr_ffi::{R_xlen_t, SEXPTYPE, TYPEOF, VECTOR_ELT};
    // SAFETY: R's main thread (`.Call`); the arguments are protected by R for the call (and
    // so is what the encoded messages refer to).
    unsafe {
        let Ok(p) = pool_at(pool) else {
            return R_NilValue;
        };
        if p.foreign || TYPEOF(exprs) != SEXPTYPE::VECSXP || check_var_names(vars).is_err() {
            return R_NilValue;
        }
        let n = extendr_ffi::XLENGTH(exprs) as usize;
        let key = p.repeats_key();
        let outs = guarded(|| {
            let mut outs = Vec::with_capacity(n);
            for i in 0..n {
                let e = VECTOR_ELT(exprs, i as R_xlen_t);
                if crate::globals::may_use(e, vars) {
                    return Ok(None);
                }
                match Outgoing::encode_expr_task(e, vars, key) {
                    Some(Ok(o)) => outs.push(o),
                    _ => return Ok(None),
                }
            }
            Ok::<_, String>(Some(outs))
        });
        let Ok(Some(outs)) = outs else {
            return R_NilValue;
        };
        submit_outs_answer(pool, p, &outs)
    }
}

/// `mizu_collect_all()`'s loop, from the task at position `from` (1-based) of `tasks` on: their
/// plain values, in order, each task waited for as `mizu_pool::Ahead` waits for a caller that
/// needs every result, all within `timeout` seconds. It stops at the first task whose outcome
/// is anything else, which it hands over uncollected-by-R: `list(values, code, outcome)`, where
/// `code` is 0 when every task from `from` on gave its value, 1 when the task after `values`
/// gave the outcome list `outcome` (an error, warnings, a timeout, a bad handle: for
/// `.value()`), 2 when `timeout` passed while waiting, 3 when Ctrl-C was pressed while waiting.
/// As an interpreted loop, the same work cost ~1 µs per task.
unsafe extern "C" fn collect_values(tasks: SEXP, from: SEXP, timeout: SEXP) -> SEXP {
    use extendr_ffi::{
        R_xlen_t, Rf_allocVector, Rf_xlengthgets, SET_VECTOR_ELT, SEXPTYPE, TYPEOF, VECTOR_ELT,
        XLENGTH,
    };
    // SAFETY: R's main thread (`.Call`); the arguments are protected by R for the call. Every
    // value made here is protected until it is in the answer (two protections, popped at the
    // end: the values and the outcome); a collected value is protected once by
    // `collect_protected` until it is stored in the values list.
    unsafe {
        let first = match (TYPEOF(from), XLENGTH(from)) {
            (SEXPTYPE::INTSXP, 1) => f64::from(*extendr_ffi::INTEGER(from)),
            (SEXPTYPE::REALSXP, 1) => *extendr_ffi::REAL(from),
            _ => f64::NAN,
        };
        let n = if TYPEOF(tasks) == SEXPTYPE::VECSXP {
            XLENGTH(tasks) as usize
        } else {
            0
        };
        if !(first >= 1.0 && first.fract() == 0.0 && first <= (n + 1) as f64) {
            return failed_answer("internal error: bad arguments to the collecting loop");
        }
        let start = first as usize - 1;
        let timeout = match timeout_sexp(timeout) {
            Ok(t) => t,
            Err(e) => return failed_answer(&message(e)),
        };
        let began = std::time::Instant::now();
        let left = || timeout.map(|t| t.saturating_sub(began.elapsed()));
        let values = Rf_protect(Rf_allocVector(SEXPTYPE::VECSXP, (n - start) as R_xlen_t));
        let elt = |i: usize| VECTOR_ELT(tasks, i as R_xlen_t);
        let mut k = start;
        let (code, outcome) = loop {
            if k == n {
                break (0, R_NilValue);
            }
            let task = elt(k);
            let t = match guarded(|| task_at(task).map_err(message)) {
                Ok(t) => t,
                Err(why) => break (1, Rf_protect(failure_outcome(&why))),
            };
            if !t.is_done() {
                // (The rest up to a bad handle, which is reached in turn.)
                let rest: Vec<&crate::task::RTask> =
                    (k..n).map_while(|i| task_at(elt(i)).ok()).collect();
                match guarded(|| {
                    Ok::<_, String>(crate::collect::wait_ahead_of(&rest, false, left()))
                }) {
                    Ok(1) => {}
                    Ok(0) => break (2, R_NilValue),
                    Ok(_) => break (3, R_NilValue),
                    Err(why) => break (1, Rf_protect(failure_outcome(&why))),
                }
            }
            match guarded(|| collect_protected(t, task, left()).map_err(message)) {
                Ok(Collected::Value(v)) => {
                    SET_VECTOR_ELT(values, (k - start) as R_xlen_t, v);
                    Rf_unprotect(1);
                    k += 1;
                }
                // (Protected once, by `collect_protected`.)
                Ok(Collected::Outcome(o)) => break (1, o),
                Err(why) => break (1, Rf_protect(failure_outcome(&why))),
            }
        };
        if outcome == R_NilValue {
            Rf_protect(outcome);
        }
        let values = if k - start < n - start {
            Rf_xlengthgets(values, (k - start) as R_xlen_t)
        } else {
            values
        };
        let a = answer(values, code, outcome);
        Rf_unprotect(2);
        a
    }
}

/// [`collect_values`]'s answer when its arguments are wrong: no values, the failure `why`.
///
/// # Safety
/// R's main thread.
unsafe fn failed_answer(why: &str) -> SEXP {
    // SAFETY: as stated; both parts are protected while the answer is made.
    unsafe {
        let values = Rf_protect(extendr_ffi::Rf_allocVector(
            extendr_ffi::SEXPTYPE::VECSXP,
            0,
        ));
        let outcome = Rf_protect(failure_outcome(why));
        let a = answer(values, 1, outcome);
        Rf_unprotect(2);
        a
    }
}

/// `list(values, code, outcome)`, the answer of [`collect_values`].
///
/// # Safety
/// R's main thread; `values` and `outcome` are protected by the caller (or are fresh, with
/// nothing allocated since they were made).
unsafe fn answer(values: SEXP, code: i32, outcome: SEXP) -> SEXP {
    use extendr_ffi::{Rf_allocVector, SET_VECTOR_ELT, SEXPTYPE};
    // SAFETY: as stated; each part is protected while the others are allocated.
    unsafe {
        let values = Rf_protect(values);
        let outcome = Rf_protect(outcome);
        let a = Rf_protect(Rf_allocVector(SEXPTYPE::VECSXP, 3));
        SET_VECTOR_ELT(a, 0, values);
        SET_VECTOR_ELT(a, 1, extendr_ffi::Rf_ScalarInteger(code));
        SET_VECTOR_ELT(a, 2, outcome);
        Rf_unprotect(3);
        a
    }
}

/// Whether `tasks` is a list of `mizu_task` handles (`TRUE`/`FALSE`): what
/// `vapply(tasks, inherits, TRUE, "mizu_task")` tells, at a few nanoseconds per element
/// instead of ~3 µs (a closure call each). Each handle is still checked when it is used.
unsafe extern "C" fn tasks_ok(tasks: SEXP) -> SEXP {
    // SAFETY: R's main thread (`.Call`); `tasks` is protected by R for the call; only reads
    // (`Rf_inherits` reads the class attribute), then one allocation for the answer.
    unsafe {
        use extendr_ffi::{SEXPTYPE, TYPEOF, VECTOR_ELT, XLENGTH};
        let ok = TYPEOF(tasks) == SEXPTYPE::VECSXP
            && (0..XLENGTH(tasks)).all(|i| {
                let t = VECTOR_ELT(tasks, i);
                // A live task's handle is known by its tag (a few loads); a class lookup
                // for each of a long list cost as much as the collecting. A handle restored
                // from a saved session passes on its class: collecting it says it is stale.
                crate::batch::task_ref(t).is_some()
                    || (stale(t) && crate::ffi::Rf_inherits(t, c"mizu_task".as_ptr()) != 0)
            });
        crate::ffi::Rf_ScalarLogical(i32::from(ok))
    }
}

/// Whether `task` is final (`TRUE`/`FALSE`): `wrap__task_done` without extendr's wrapper,
/// which costs more than the rest of `mizu_collect_all()`'s work per task. A handle that is
/// not a live task answers `FALSE`: the collect that follows raises its error.
unsafe extern "C" fn task_done(task: SEXP) -> SEXP {
    // SAFETY: R's main thread (`.Call`); `task` is protected by R for the call; only reads,
    // then one allocation for the answer.
    unsafe {
        let done = guarded(|| {
            crate::collect::task_at(task)
                .map(|t| t.is_done())
                .map_err(|e| e.to_string())
        })
        .unwrap_or(false);
        crate::ffi::Rf_ScalarLogical(i32::from(done))
    }
}

/// Submits `call` (a `mizu_call()`) with the further keyword arguments `vars` to a pool of
/// Python workers: the task handle, or `c(class, message)` for `mizu_submit_shim`
/// (`shims.c`) to raise.
///
/// # Safety
/// R's main thread; the arguments are protected meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mizu_rs_submit_xcall(pool: SEXP, call: SEXP, vars: SEXP) -> SEXP {
    let r = guarded::<_, String>(|| {
        // SAFETY: R's main thread (`.Call`); the arguments are protected by R for the call.
        unsafe {
            let p = pool_at(pool).map_err(|e| e.to_string())?;
            let env = match crate::xcall::call_envelope(call, vars) {
                Ok(env) => env,
                Err(why) => return Ok(failure_sexp("mizu_error_not_portable", &why)),
            };
            Ok(
                match submit_encoded(pool, p, &env).map_err(|e| e.to_string())? {
                    Ok(t) => crate::batch::task_handle(pool, &p.batch, t),
                    Err(f) => f.get(),
                },
            )
        }
    });
    match r {
        Ok(x) => x,
        // SAFETY: R's main thread.
        Err(m) => unsafe { failure_sexp("mizu_error", &m) },
    }
}

/// `c(class, message)`.
///
/// # Safety
/// R's main thread.
unsafe fn failure_sexp(class: &str, why: &str) -> SEXP {
    // SAFETY: R's main thread; the vector is protected while its elements are made.
    unsafe {
        let v = Rf_protect(extendr_ffi::Rf_allocVector(
            extendr_ffi::SEXPTYPE::STRSXP,
            2,
        ));
        extendr_ffi::SET_STRING_ELT(v, 0, extendr_ffi::STRING_ELT(mk_string(class), 0));
        extendr_ffi::SET_STRING_ELT(v, 1, extendr_ffi::STRING_ELT(mk_string(why), 0));
        Rf_unprotect(1);
        v
    }
}

/// Returns its first argument: what the benchmarks call in place of the submit and collect
/// routines to time R's own part of a round trip (the closures and their argument matching)
/// with nothing sent (through `.Call`, or `.External2` as the submit routine is).
unsafe extern "C" fn nop(a: SEXP, _b: SEXP, _c: SEXP, _d: SEXP) -> SEXP {
    a
}

/// An R `NativeSymbol`: an external pointer to a routine, tagged `native symbol`, which
/// `.Call` accepts in place of a registered name.
///
/// # Safety
/// R's main thread. `f` takes as many SEXP arguments as the R code passes it.
unsafe fn native_symbol(f: *const c_void) -> SEXP {
    // SAFETY: R's main thread; a symbol is never collected.
    unsafe {
        let tag = extendr_ffi::Rf_install(c"native symbol".as_ptr());
        extendr_ffi::R_MakeExternalPtr(f.cast_mut(), tag, R_NilValue)
    }
}

pub(crate) fn native_routines() -> List {
    type One = unsafe extern "C" fn(SEXP) -> SEXP;
    type Two = unsafe extern "C" fn(SEXP, SEXP) -> SEXP;
    type Three = unsafe extern "C" fn(SEXP, SEXP, SEXP) -> SEXP;
    type Four = unsafe extern "C" fn(SEXP, SEXP, SEXP, SEXP) -> SEXP;
    type Five = unsafe extern "C" fn(SEXP, SEXP, SEXP, SEXP, SEXP) -> SEXP;
    // `.Call` calls each with as many arguments as its type says: what its R wrapper passes
    // (`submit_frame` is an `.External2` routine: four, whatever the wrapper passes).
    let routines: [(&str, *const c_void); 20] = [
        ("submit", mizu_rs_submit as Two as *const c_void),
        (
            "submit_expr",
            crate::ffi::mizu_submit_shim as Four as *const c_void,
        ),
        (
            "submit_frame",
            crate::ffi::mizu_submit_frame as Four as *const c_void,
        ),
        ("collect", collect as Two as *const c_void),
        ("collect_values", collect_values as Three as *const c_void),
        ("submit_exprs", submit_exprs as Three as *const c_void),
        ("submit_msgs", submit_msgs as Two as *const c_void),
        (
            "collect_value",
            crate::ffi::mizu_collect_shim as Two as *const c_void,
        ),
        ("tasks_ok", tasks_ok as One as *const c_void),
        ("task_done", task_done as One as *const c_void),
        ("nop", nop as Four as *const c_void),
        ("each", crate::ffi::mizu_chunk_each as Five as *const c_void),
        (
            "chunk_msgs",
            crate::ffi::mizu_chunk_msgs as Four as *const c_void,
        ),
        (
            "fill_hole",
            crate::ffi::mizu_fill_hole as Three as *const c_void,
        ),
        (
            "bind_globals",
            crate::ffi::mizu_bind_globals as One as *const c_void,
        ),
        (
            "unbind_globals",
            crate::ffi::mizu_unbind_globals as One as *const c_void,
        ),
        (
            "expr_message",
            crate::ffi::mizu_expr_message as Three as *const c_void,
        ),
        (
            "function_globals",
            crate::ffi::mizu_function_globals as One as *const c_void,
        ),
        (
            "find_identical",
            crate::ffi::mizu_find_identical as Two as *const c_void,
        ),
        (
            "attach_packages",
            crate::ffi::mizu_attach_packages as One as *const c_void,
        ),
    ];
    // SAFETY: R's main thread; each pointer is protected by its Robj as soon as it exists.
    let symbols = routines.map(|(_, p)| unsafe { Robj::from_sexp(native_symbol(p)) });
    List::from_names_and_values(routines.map(|(n, _)| n), symbols).unwrap_or_default()
}
