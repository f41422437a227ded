//! The worker's side of a cross-language task (a call from a pool of another language's
//! callers): the call read from its envelope, run as an R task, and its outcome written back
//! as an envelope.

use super::*;

impl RExec {
    /// Runs a cross-language task (a call from a pool of another language): its outcome
    /// payload. The call runs through `.dispatch` (kind `"x"`) in the task's top-level context,
    /// with the worker's handlers, as an R task does.
    pub(super) fn run_xlang(&self, buf: &arrow_buffer::Buffer) -> (bool, Envelope) {
        let _reading = crate::xvalue_in::Reading::payload(buf);
        let task = match envelope::read_task(buf, Some(&crate::payload::MAPPER)) {
            Ok(t) => t,
            Err(e) => return fail(&["mizu_error"], format!("malformed task: {e}")),
        };
        if let Err(e) = crate::xvalue_in::call_names(&task.target, &task.kwargs) {
            return fail(&["mizu_error"], format!("malformed task: {e}"));
        }
        // A named function without a seed: the call itself, evaluated natively in the global
        // environment (no R closure in between: `.xrun` costs ~20 µs a task).
        let chunk_first = task.chunk.as_ref().map(|_| task.ctx.index);
        // (R symbols cannot be empty: a call with an empty name goes through `.dispatch`.)
        let direct = match (&task.target, task.ctx.seed, &task.chunk) {
            (mizu_pool::wire::CallTarget::Name(n), None, None)
                if !n.is_empty() && task.kwargs.iter().all(|(k, _)| !k.is_empty()) =>
            {
                Some(n.clone())
            }
            _ => None,
        };
        if let Some(name) = direct {
            let envelope::Task { args, kwargs, .. } = task;
            // SAFETY: R's main thread; every argument is protected (once each) from the moment
            // it exists until the task is done; the message holds the call.
            unsafe {
                let mut held = 0;
                let mut parts = Vec::with_capacity(args.len() + kwargs.len());
                let named = args
                    .into_iter()
                    .map(|v| (None, v))
                    .chain(kwargs.into_iter().map(|(k, v)| (Some(k), v)));
                for (k, v) in named {
                    match crate::xvalue_in::to_sexp_protected(v) {
                        Ok(x) => {
                            held += 1;
                            parts.push((k, x));
                        }
                        Err(e) => {
                            Rf_unprotect(held);
                            return fail(&["mizu_error_not_portable", "mizu_error"], e.to_string());
                        }
                    }
                }
                let msg = Rf_protect(call_message(&name, &parts));
                let _held = Unprotect(held + 1);
                return self.finish_xlang(self.eval_task(msg, true), None);
            }
        }
        let msg = match xlang_message(task) {
            Ok(m) => m,
            Err(e) => return fail(&["mizu_error_not_portable", "mizu_error"], e.to_string()),
        };
        // SAFETY: R's main thread; `msg` is held by its Robj for the whole task.
        unsafe { self.finish_xlang(self.eval_task(msg.get(), false), chunk_first) }
    }

    /// The outcome payload of an evaluated cross-language task.
    ///
    /// # Safety
    /// R's main thread; `evaluated` is what [`RExec::eval_task`] returned (a value protected
    /// once), which stays protected until its payload is made (arrays lend its memory).
    /// `chunk_first`: the first element's index when the task was a map chunk (whose value is
    /// the list of the elements' results).
    unsafe fn finish_xlang(
        &self,
        evaluated: std::result::Result<SEXP, ()>,
        chunk_first: Option<u64>,
    ) -> (bool, Envelope) {
        // SAFETY: the caller's contract.
        unsafe {
            match evaluated {
                Ok(v) => {
                    let _value = Unprotect(1);
                    // The warnings the task raised go back with its value (the caller warns
                    // again); reading them resets what the handlers recorded.
                    let warnings: Vec<String> = if self.warned() {
                        call1(&self.with_warnings, &Robj::from(()))
                            .ok()
                            .and_then(|w| call1(&self.xwarning_messages, &w).ok())
                            .and_then(|m| m.as_str_iter().map(|it| it.map(str::to_owned).collect()))
                            .unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    let value = match chunk_first {
                        None => crate::xvalue::from_sexp(v, "the result").map_err(|e| (e, None)),
                        // A chunk's list of results (made by `.xrun_chunk`), element by
                        // element: one that cannot cross names its element.
                        Some(_) if extendr_ffi::TYPEOF(v) != extendr_ffi::SEXPTYPE::VECSXP => {
                            return fail(
                                &["mizu_error"],
                                "a map chunk's value is not a list".into(),
                            );
                        }
                        Some(first) => (0..extendr_ffi::XLENGTH(v))
                            .map(|j| {
                                let i = first + j as u64;
                                let x = extendr_ffi::VECTOR_ELT(v, j);
                                crate::xvalue::from_sexp(x, &format!("the result of element {i}"))
                                    .map_err(|e| (e, Some(i)))
                            })
                            .collect::<std::result::Result<Vec<_>, _>>()
                            .map(mizu_pool::wire::Value::List),
                    };
                    let not_portable = |message: String, element| {
                        let e = RemoteError {
                            language: "r".into(),
                            classes: vec!["mizu_error_not_portable".into(), "mizu_error".into()],
                            message,
                            element,
                            ..Default::default()
                        };
                        (false, Envelope::failure_of(&e))
                    };
                    match value {
                        Ok(value) => match Envelope::value_warned(&value, &warnings) {
                            Ok(env) => (true, env),
                            Err(e) => not_portable(e.to_string(), None),
                        },
                        Err((e, element)) => not_portable(e.to_string(), element),
                    }
                }
                Err(()) => {
                    let parts = call1(&self.failed, &Robj::from(()))
                        .and_then(|c| call1(&self.xerror_parts, &c));
                    let parts = parts.ok().and_then(|p| {
                        let l = p.as_list()?;
                        let text = |i: usize| -> Option<Vec<String>> {
                            l.elt(i)
                                .ok()?
                                .as_str_iter()
                                .map(|it| it.map(str::to_owned).collect())
                        };
                        let element = l.elt(4).ok().and_then(|i| i.as_real()).map(|i| i as u64);
                        Some((text(0)?, text(1)?, text(2)?, text(3)?, element))
                    });
                    match parts {
                        Some((classes, message, call, traceback, element)) => {
                            let e = RemoteError {
                                language: "r".into(),
                                classes,
                                message: message.concat(),
                                call: call.concat(),
                                traceback: traceback.concat(),
                                element,
                            };
                            (false, Envelope::failure_of(&e))
                        }
                        None => fail(&["error"], "the task failed and so did reporting it".into()),
                    }
                }
            }
        }
    }
}

/// A failed cross-language task of this (R) worker.
fn fail(classes: &[&str], message: String) -> (bool, Envelope) {
    (false, Envelope::failure("r", classes, message))
}

/// The message `.dispatch` runs for a cross-language task read from its payload (kind `"x"`,
/// or `"xm"` for a map chunk): the call's parts as R values. The R fuzz harness reads tasks
/// through this too (`xlang_task_loads`).
pub(crate) fn xlang_message(task: envelope::Task) -> Result<Robj> {
    let envelope::Task {
        target,
        args,
        kwargs,
        ctx: xctx,
        chunk,
    } = task;
    let (t, source) = match target {
        mizu_pool::wire::CallTarget::Name(n) => (n, false),
        mizu_pool::wire::CallTarget::Source(s) => (s, true),
    };
    let a = args
        .into_iter()
        .map(crate::xvalue_in::to_r)
        .collect::<Result<Vec<_>>>()?;
    let (names, vals): (Vec<String>, Vec<mizu_pool::wire::Value>) = kwargs.into_iter().unzip();
    let vals = vals
        .into_iter()
        .map(crate::xvalue_in::to_r)
        .collect::<Result<Vec<_>>>()?;
    let mut kw: Robj = List::from_values(vals).into();
    kw.set_names(names)?;
    let seed = match xctx.seed {
        Some(s) => Robj::from(s as f64),
        None => Robj::from(()),
    };
    if let Some(c) = chunk {
        let xs = c
            .elements
            .into_iter()
            .map(crate::xvalue_in::to_r)
            .collect::<Result<Vec<_>>>()?;
        return Ok(List::from_values([
            Robj::from("xm"),
            Robj::from(t.as_str()),
            List::from_values(a).into(),
            kw,
            seed,
            Robj::from(xctx.index as f64),
            List::from_values(xs).into(),
            Robj::from(c.spread),
        ])
        .into());
    }
    Ok(List::from_values([
        Robj::from("x"),
        Robj::from(t.as_str()),
        Robj::from(source),
        List::from_values(a).into(),
        kw,
        seed,
        Robj::from(xctx.index as f64),
    ])
    .into())
}

/// `list("e", <call>, globalenv())` (unprotected): an expression task calling the function
/// `name` (`fun`, or `pkg::fun` / `pkg:::fun`) with `parts` (named ones as named arguments).
///
/// # Safety
/// R's main thread; the values in `parts` are protected by the caller.
unsafe fn call_message(name: &str, parts: &[(Option<String>, SEXP)]) -> SEXP {
    use extendr_ffi::{R_GlobalEnv, R_NilValue, Rf_cons, Rf_install, Rf_lcons, SET_TAG};
    let sym = |s: &str| {
        let c = std::ffi::CString::new(s).unwrap_or_default();
        // SAFETY: R's main thread; installing a symbol only reads or extends the table.
        unsafe { Rf_install(c.as_ptr()) }
    };
    // SAFETY: as the caller promises; every new cell is protected until the message holds it.
    unsafe {
        let mut n = 0;
        let fun = match name.split_once(":::").or_else(|| name.split_once("::")) {
            Some((pkg, f)) => {
                let op = if name.contains(":::") { ":::" } else { "::" };
                let tail = Rf_protect(Rf_cons(sym(f), R_NilValue));
                let tail = Rf_protect(Rf_cons(sym(pkg), tail));
                let c = Rf_protect(Rf_lcons(sym(op), tail));
                n += 3;
                c
            }
            None => sym(name),
        };
        let mut tail = R_NilValue;
        for (tag, v) in parts.iter().rev() {
            tail = Rf_protect(Rf_cons(*v, tail));
            n += 1;
            if let Some(t) = tag {
                SET_TAG(tail, sym(t));
            }
        }
        let call = Rf_protect(Rf_lcons(fun, tail));
        let msg = Rf_protect(extendr_ffi::Rf_allocVector(
            extendr_ffi::SEXPTYPE::VECSXP,
            3,
        ));
        extendr_ffi::SET_VECTOR_ELT(msg, 0, crate::handle::mk_string("e"));
        extendr_ffi::SET_VECTOR_ELT(msg, 1, call);
        extendr_ffi::SET_VECTOR_ELT(msg, 2, R_GlobalEnv);
        Rf_unprotect(n + 2);
        msg
    }
}
