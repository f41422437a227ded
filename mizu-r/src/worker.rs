//! The worker's side: runs every task in R, with the task's context reachable from R (nested
//! submission, the element index of a map).

use std::cell::Cell;

use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::{Rf_protect, Rf_unprotect, SEXP};
use mizu_pool::wire::envelope::{self, Envelope, RemoteError};
use mizu_pool::{Executor, TaskContext};

use crate::codec::{Decoded, text};
use crate::decode::{decode, decode_small};
use crate::encode::Outgoing;
use crate::ffi;
use crate::heap;
use crate::rerr;
use crate::rtry::try_r;

mod xlang;
pub(crate) use xlang::xlang_message;

/// The context of the task this thread is running, if any (set by the runtime).
pub use mizu_pool::with_current_task as with_context;

/// Runs every task natively: establishes the worker's condition handlers, then evaluates an
/// expression task in its environment (or calls `dispatch(msg)` for any other kind), all in
/// one R top-level context. When the task raised an error, `failed(NULL)` returns the condition
/// the handler recorded; when it raised warnings, `with_warnings(value)` attaches them.
struct RExec {
    /// `.Internal(.resetCondHands(<stack>))`: installs the worker's condition handlers, made
    /// once (see [`handler_stack`]), as the handler stack. `R_ToplevelExec` starts each task
    /// with an empty stack; pushing the handlers anew (`.addCondHands`, what
    /// `withCallingHandlers()` does) allocates five R objects per task, ~0.3 µs here.
    hands: Robj,
    dispatch: Function,
    failed: Function,
    with_warnings: Function,
    /// `.xerror_parts(condition)`: what a caller of another language gets of an R error.
    xerror_parts: Function,
    /// `.xwarning_messages(with_warnings(NULL))`: the messages of a task's warnings.
    xwarning_messages: Function,
    /// The environment where the handlers record conditions (`.worker_state`).
    state: Robj,
    /// The symbol `warnings` (where the handlers keep a task's warnings; symbols are never
    /// collected).
    warnings: SEXP,
    /// The symbols of a map's function as `.chunk_function` keeps it in `state`.
    chunk: ChunkSymbols,
    max_tasks: u64,
    tasks: Cell<u64>,
    /// Wait slices (2 ms each) that passed without a task since the last task.
    idle_slices: Cell<u32>,
    /// The process's resident memory when it last went idle for long (see `idle`).
    resident: Cell<u64>,
}

// SAFETY: `mizu_pool::run_worker` calls `execute` only on the thread that called it — R's main
// thread (see `run_worker` below); the R objects are never touched from another thread.
unsafe impl Send for RExec {}
// SAFETY: as above.
unsafe impl Sync for RExec {}

/// `f(arg)` evaluated in the global environment, or `Err` if it raised an error.
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
    /// The task's value, protected once (the caller unprotects it), or `Err` if it raised an
    /// error (recorded by the handlers; nothing is left protected then).
    ///
    /// # Safety
    /// R's main thread; `msg` is protected by the caller and owns the expression and its
    /// environment.
    unsafe fn eval_task(&self, msg: SEXP, expr_task: bool) -> std::result::Result<SEXP, ()> {
        // SAFETY: the caller's contract; the handles are held by `self`; the closure owns
        // nothing; the handlers it establishes live until `R_ToplevelExec` restores the
        // handler stack; the value is protected inside the context (an error unwinds that).
        unsafe {
            let (h, d) = (self.hands.get(), self.dispatch.get());
            // An expression task with globals (`list("e", expr, env, globals)`, see
            // `.expr_message()`): they are bound in the global environment while it runs.
            // A fifth element lists the packages it uses (the fourth is NULL when it has no
            // such globals), attached first.
            // A map's common chunk runs as `.run_chunk` would run it, without `.dispatch`'s
            // and `.run_chunk`'s R calls (~26 000 instructions a chunk in a map of trivial
            // elements, callgrind): its globals at 8, packages at 9.
            let chunk_f = if expr_task {
                None
            } else {
                self.chunk_function(msg)
            };
            let (len, at) = if expr_task {
                (extendr_ffi::XLENGTH(msg), 3)
            } else if chunk_f.is_some() {
                (extendr_ffi::XLENGTH(msg), 8)
            } else {
                (0, 3)
            };
            let with_globals = len > at
                && extendr_ffi::TYPEOF(extendr_ffi::VECTOR_ELT(msg, at))
                    == extendr_ffi::SEXPTYPE::VECSXP
                && extendr_ffi::XLENGTH(extendr_ffi::VECTOR_ELT(msg, at)) > 0;
            let with_packages = len == at + 2
                && extendr_ffi::TYPEOF(extendr_ffi::VECTOR_ELT(msg, at + 1))
                    == extendr_ffi::SEXPTYPE::STRSXP;
            let state = self.state.get();
            let bound = Cell::new(false);
            let bound_ref = &bound;
            let r = try_r(move || {
                // In the base environment: `.Internal` is found there at once, not after
                // every attached package's frame. (No allocation: the stack is made.)
                ffi::Rf_eval(h, extendr_ffi::R_BaseEnv);
                if expr_task || chunk_f.is_some() {
                    if with_packages {
                        ffi::mizu_attach_packages(extendr_ffi::VECTOR_ELT(msg, at + 1));
                    }
                    if with_globals {
                        // Inside the task's context, so that a failure to bind (a locked
                        // binding) is the task's error. What they replaced is kept in the
                        // message, for the unbinding below to find even if the task fails.
                        let replaced = ffi::mizu_bind_globals(extendr_ffi::VECTOR_ELT(msg, at));
                        extendr_ffi::SET_VECTOR_ELT(msg, at, replaced);
                        bound_ref.set(true);
                    }
                }
                let v = if expr_task {
                    ffi::Rf_eval(
                        extendr_ffi::VECTOR_ELT(msg, 1),
                        extendr_ffi::VECTOR_ELT(msg, 2),
                    )
                } else if let Some(f) = chunk_f {
                    // Held here: a nested map's chunk run by this worker while the task waits
                    // replaces the one `state` keeps.
                    Rf_protect(f);
                    let v = ffi::mizu_chunk_each(
                        f,
                        extendr_ffi::VECTOR_ELT(msg, 3),
                        extendr_ffi::VECTOR_ELT(msg, 2),
                        extendr_ffi::VECTOR_ELT(msg, 5),
                        state,
                    );
                    Rf_unprotect(1);
                    v
                } else {
                    let call = extendr_ffi::Rf_protect(ffi::Rf_lang2(d, msg));
                    let v = ffi::Rf_eval(call, extendr_ffi::R_GlobalEnv);
                    extendr_ffi::Rf_unprotect(1);
                    v
                };
                extendr_ffi::Rf_protect(v)
            });
            if bound.get() {
                // The worker's own globals come back whether the task returned or failed (the
                // value, if any, is protected; `msg` holds what was replaced).
                let replaced = extendr_ffi::VECTOR_ELT(msg, at);
                if try_r(move || ffi::mizu_unbind_globals(replaced)).is_err() {
                    if r.is_ok() {
                        extendr_ffi::Rf_unprotect(1);
                    }
                    return Err(());
                }
            }
            r
        }
    }

    /// The function to run a map's chunk with natively, for the common chunk
    /// (`list("m", f, dots, xs, seed, start, ptype, spec, globals[, packages])` without a seed
    /// or a type, as `.run_chunk` runs it through `.native_each`): `f` itself when it was sent
    /// as a function, or the one this worker unserialized for the same map (the map's key and
    /// bytes as `.chunk_function` compares them). None for anything else, which `.dispatch`
    /// runs (and the first chunk of a map there unserializes its function).
    ///
    /// # Safety
    /// R's main thread; `msg` is protected by the caller.
    unsafe fn chunk_function(&self, msg: SEXP) -> Option<SEXP> {
        use extendr_ffi::{R_CHAR, SEXPTYPE, STRING_ELT, TYPEOF, VECTOR_ELT, XLENGTH};
        // SAFETY: types and lengths are checked before elements are read; nothing allocates.
        unsafe {
            if TYPEOF(msg) != SEXPTYPE::VECSXP || !(9..=10).contains(&XLENGTH(msg)) {
                return None;
            }
            let kind = VECTOR_ELT(msg, 0);
            let start = VECTOR_ELT(msg, 5);
            let plain = TYPEOF(kind) == SEXPTYPE::STRSXP
                && XLENGTH(kind) == 1
                && std::ffi::CStr::from_ptr(R_CHAR(STRING_ELT(kind, 0))) == c"m"
                && TYPEOF(VECTOR_ELT(msg, 4)) == SEXPTYPE::NILSXP
                && TYPEOF(VECTOR_ELT(msg, 6)) == SEXPTYPE::NILSXP
                && matches!(TYPEOF(start), SEXPTYPE::INTSXP | SEXPTYPE::REALSXP)
                && XLENGTH(start) == 1
                && matches!(
                    TYPEOF(VECTOR_ELT(msg, 8)),
                    SEXPTYPE::VECSXP | SEXPTYPE::NILSXP
                )
                && (XLENGTH(msg) == 9
                    || matches!(
                        TYPEOF(VECTOR_ELT(msg, 9)),
                        SEXPTYPE::STRSXP | SEXPTYPE::NILSXP
                    ));
            if !plain {
                return None;
            }
            let f = VECTOR_ELT(msg, 1);
            match TYPEOF(f) {
                SEXPTYPE::CLOSXP | SEXPTYPE::BUILTINSXP | SEXPTYPE::SPECIALSXP => Some(f),
                SEXPTYPE::VECSXP => self.chunk.kept(self.state.get(), f),
                _ => None,
            }
        }
    }

    /// For an expression task in the compact encoding (what `mizu_submit` sends): its value,
    /// as [`RExec::eval_task`] gives it, decoded and evaluated in one top-level context (a
    /// context costs ~0.1 µs). `None` when `bytes` is not such a task, or not one the compact
    /// path takes (see `small_read::decode_expr_task_in_context`).
    ///
    /// # Safety
    /// R's main thread.
    unsafe fn eval_expr_task(&self, bytes: &[u8]) -> Option<std::result::Result<SEXP, ()>> {
        // SAFETY: the handle holds the call for as long as `self` lives.
        let h = unsafe { self.hands.get() };
        let (p, len) = (bytes.as_ptr(), bytes.len());
        // SAFETY: R's main thread; the closure owns nothing (`bytes` is rebuilt from a pointer
        // that outlives the call); the handlers are installed first, so that an allocation
        // error while decoding is reported as the task's; the expression and its environment are
        // protected while the expression is evaluated, the value when it returns (an error
        // unwinds both).
        let r = unsafe {
            try_r(move || {
                ffi::Rf_eval(h, extendr_ffi::R_BaseEnv);
                let bytes = std::slice::from_raw_parts(p, len);
                let Some((expr, env)) = crate::functions::in_task(|| {
                    crate::small_read::decode_expr_task_in_context(bytes)
                }) else {
                    return extendr_ffi::R_UnboundValue;
                };
                let v = ffi::Rf_eval(expr, env);
                Rf_unprotect(2);
                Rf_protect(v)
            })
        };
        // SAFETY: reading R's constant (which evaluation never returns: it marks "not this
        // path").
        let not_taken = unsafe { extendr_ffi::R_UnboundValue };
        match r {
            Ok(v) if v == not_taken => None,
            r => Some(r),
        }
    }

    /// Whether the handlers recorded warnings during the task.
    fn warned(&self) -> bool {
        // SAFETY: R's main thread; `state` is an environment (checked by `run_worker`) held by
        // its handle; a frame lookup neither allocates nor raises errors.
        unsafe {
            let w = ffi::Rf_findVarInFrame(self.state.get(), self.warnings);
            w != extendr_ffi::R_NilValue && w != extendr_ffi::R_UnboundValue
        }
    }

    fn run(&self, ctx: &TaskContext<'_>, input: &[u8]) -> std::result::Result<Vec<u8>, Vec<u8>> {
        let buf = ctx
            .input()
            .unwrap_or_else(|| arrow_buffer::Buffer::from_slice_ref(input));
        if mizu_pool::wire::envelope::is_envelope(&buf) {
            let (ok, env) = self.run_xlang(&buf);
            return ctx.send(ok, &env);
        }
        // SAFETY: R's main thread. Values live on R's protect stack from the moment they exist
        // to the end of the task (the `Unprotect` guards pop them); nothing here holds an R
        // handle on the hot path (see `handle.rs` for why that matters).
        unsafe {
            // The common expression task first: decoded and evaluated in one top-level
            // context (see `eval_expr_task`). Other messages (a map's chunk, a task with
            // globals) are told apart by their first bytes, before a context is opened.
            let fast = match buf.as_slice().split_first() {
                Some((&crate::codec::TAG_SMALL, rest))
                    if crate::small_read::expr_task_prefix(rest) =>
                {
                    self.eval_expr_task(rest)
                }
                _ => None,
            };
            let evaluated = match fast {
                Some(r) => r,
                None => {
                    let msg = match crate::functions::in_task(|| decode_small(&buf)) {
                        Some(Ok(m)) => Rf_protect(m),
                        Some(Err(e)) => return Err(text(&e.to_string())),
                        None => match crate::functions::in_task(|| decode(buf)) {
                            Ok(Decoded::Value(v)) => Rf_protect(v.get()),
                            Ok(Decoded::Text(t)) => {
                                return Err(text(&format!("mizu: a text payload: {t}")));
                            }
                            Err(e) => return Err(text(&e.to_string())),
                        },
                    };
                    let expr_task = bind_vars(msg);
                    // The message is let go with the value kept (nothing allocates between).
                    match self.eval_task(msg, expr_task) {
                        Ok(v) => {
                            Rf_unprotect(2);
                            Ok(Rf_protect(v))
                        }
                        Err(()) => {
                            Rf_unprotect(1);
                            Err(())
                        }
                    }
                }
            };
            let (ok, value) = match evaluated {
                Ok(v) if !self.warned() => (true, v),
                Ok(v) => {
                    let r = call1(&self.with_warnings, &Robj::from_sexp(v));
                    Rf_unprotect(1);
                    match r {
                        Ok(w) => (true, Rf_protect(w.get())),
                        Err(()) => {
                            return Err(text("mizu: the task's warnings cannot be reported"));
                        }
                    }
                }
                Err(()) => match call1(&self.failed, &Robj::from(())) {
                    Ok(c) => (false, Rf_protect(c.get())),
                    Err(()) => {
                        return Err(text("mizu: the task failed and so did reporting it"));
                    }
                },
            };
            // Out-of-band buffers point into `value`: it stays protected until they are copied.
            let _value = Unprotect(1);
            let out = match Outgoing::encode_sexp(value) {
                Ok(o) => o,
                Err(e) => {
                    let why = format!(
                        "mizu: the task's {} cannot be sent: {e}",
                        if ok { "value" } else { "error" }
                    );
                    return Err(text(&why));
                }
            };
            ctx.send(ok, &out)
        }
    }
}

/// The names `.chunk_function` reads and keeps a map's function under: in the message's
/// `list(bytes, map)`, and in the worker's state (symbols are never collected).
struct ChunkSymbols {
    bytes: SEXP,
    map: SEXP,
    kept_fun: SEXP,
    kept_bytes: SEXP,
    kept_map: SEXP,
}

impl ChunkSymbols {
    /// # Safety
    /// R's main thread.
    unsafe fn install() -> ChunkSymbols {
        // SAFETY: the caller's contract; installing a symbol only reads or extends the table.
        unsafe {
            let sym = |s: &std::ffi::CStr| extendr_ffi::Rf_install(s.as_ptr());
            ChunkSymbols {
                bytes: sym(c"bytes"),
                map: sym(c"map"),
                kept_fun: sym(c"chunk_fun"),
                kept_bytes: sym(c"chunk_bytes"),
                kept_map: sym(c"chunk_map"),
            }
        }
    }

    /// The function `state` keeps for the map `sent` (`list(bytes, map)`) names, if it keeps
    /// that map's: the same key (a double vector) and the same bytes.
    ///
    /// # Safety
    /// R's main thread; `state` is an environment and `sent` a list, both protected.
    unsafe fn kept(&self, state: SEXP, sent: SEXP) -> Option<SEXP> {
        use extendr_ffi::{SEXPTYPE, TYPEOF, XLENGTH};
        // SAFETY: types and lengths are checked before data is read; frame lookups neither
        // allocate nor raise errors; the data pointers are read while their vectors are held.
        unsafe {
            let names = extendr_ffi::Rf_getAttrib(sent, extendr_ffi::R_NamesSymbol);
            if TYPEOF(names) != SEXPTYPE::STRSXP {
                return None;
            }
            let item = |sym: SEXP| {
                let want = extendr_ffi::PRINTNAME(sym);
                (0..XLENGTH(sent))
                    .find(|&i| extendr_ffi::STRING_ELT(names, i) == want)
                    .map(|i| extendr_ffi::VECTOR_ELT(sent, i))
            };
            let (bytes, map) = (item(self.bytes)?, item(self.map)?);
            let keep = |sym: SEXP| ffi::Rf_findVarInFrame(state, sym);
            let (kept_bytes, kept_map) = (keep(self.kept_bytes), keep(self.kept_map));
            // (Not views: an ALTREP's data pointer may allocate, or raise an error.)
            let same = |a: SEXP, b: SEXP, ty: SEXPTYPE, width: usize| {
                TYPEOF(a) == ty
                    && TYPEOF(b) == ty
                    && extendr_ffi::ALTREP(a) == 0
                    && extendr_ffi::ALTREP(b) == 0
                    && XLENGTH(a) == XLENGTH(b)
                    && std::slice::from_raw_parts(
                        extendr_ffi::DATAPTR_RO(a).cast::<u8>(),
                        XLENGTH(a) as usize * width,
                    ) == std::slice::from_raw_parts(
                        extendr_ffi::DATAPTR_RO(b).cast::<u8>(),
                        XLENGTH(b) as usize * width,
                    )
            };
            if !same(map, kept_map, SEXPTYPE::REALSXP, 8)
                || !same(bytes, kept_bytes, SEXPTYPE::RAWSXP, 1)
            {
                return None;
            }
            let f = keep(self.kept_fun);
            matches!(
                TYPEOF(f),
                SEXPTYPE::CLOSXP | SEXPTYPE::BUILTINSXP | SEXPTYPE::SPECIALSXP
            )
            .then_some(f)
        }
    }
}

/// Pops this many values off R's protect stack when dropped.
struct Unprotect(i32);

impl Drop for Unprotect {
    fn drop(&mut self) {
        // SAFETY: R's main thread; the owner pushed exactly this many values, and anything
        // pushed after them was popped before this guard drops (guards drop in reverse order).
        unsafe { Rf_unprotect(self.0) };
    }
}

impl Executor for RExec {
    fn execute(
        &self,
        ctx: &TaskContext<'_>,
        input: &[u8],
    ) -> std::result::Result<Vec<u8>, Vec<u8>> {
        self.idle_slices.set(0);
        let r = self.run(ctx, input);
        let n = self.tasks.get() + 1;
        self.tasks.set(n);
        if self.max_tasks > 0 && n >= self.max_tasks {
            ctx.recycle();
        }
        r
    }

    fn idle(&self) {
        // Collect once the caller has really paused (10 ms), not in the gaps of a stream of
        // large tasks: a collection (0.5–1 ms) in every gap delays the next task, and a
        // caller that spends 2 ms between tasks encoding the next one got one per task.
        let k = self.idle_slices.get() + 1;
        self.idle_slices.set(k);
        if k == IDLE_SLICES_BEFORE_GC {
            crate::altrep::collect_garbage_when_idle();
        } else if k == IDLE_SLICES_BEFORE_FULL_GC {
            crate::altrep::collect_all_garbage_when_idle();
            // A worker that grew by a large task gives the memory back once idle: R frees
            // the task's garbage only at a collection, and the allocator keeps what R frees.
            let now = heap::resident_bytes();
            if now > self.resident.get().saturating_add(heap::GREW_BY) {
                crate::altrep::collect_all_garbage_now();
            }
            heap::release_freed_memory();
            self.resident.set(heap::resident_bytes());
        }
    }
}

/// Idle wait slices (see `mizu_pool::run_worker`) before an idle worker collects garbage.
const IDLE_SLICES_BEFORE_GC: u32 = 5;
/// Idle wait slices (half a second) before an idle worker holding views a young collection
/// left collects all garbage (tens of milliseconds, but off every task's path).
const IDLE_SLICES_BEFORE_FULL_GC: u32 = 250;

/// The call that installs the worker's condition handlers as the handler stack of a task's
/// top-level context: `add` (`.Internal(.addCondHands(...))` with the handlers as constants)
/// is evaluated once, in a top-level context of its own, and `now` (`.addCondHands` without
/// handlers, which returns the current stack) reads the stack it made. The stack's entries
/// are never modified by R (calling handlers keep no state in them), so every task can share
/// them.
fn handler_stack(add: &Robj, now: &Robj) -> Result<Robj> {
    // SAFETY: R's main thread; the calls are protected by their handles; the closure owns
    // nothing; the stack is held by an Robj as soon as it is returned (R_ToplevelExec restores
    // the handler stack it replaced, but the list itself lives on), and the reset call is
    // protected while it is built.
    unsafe {
        let (a, n) = (add.get(), now.get());
        let stack = try_r(move || {
            ffi::Rf_eval(a, extendr_ffi::R_BaseEnv);
            ffi::Rf_eval(n, extendr_ffi::R_BaseEnv)
        })
        .map_err(|()| rerr("run_worker: the condition handlers cannot be established"))?;
        let stack = Robj::from_sexp(stack);
        if extendr_ffi::TYPEOF(stack.get()) != extendr_ffi::SEXPTYPE::LISTSXP {
            return Err(rerr(
                "run_worker: the condition handlers were not established",
            ));
        }
        let reset = extendr_ffi::Rf_protect(ffi::Rf_lang2(
            extendr_ffi::Rf_install(c".resetCondHands".as_ptr()),
            stack.get(),
        ));
        let call = Robj::from_sexp(ffi::Rf_lang2(
            extendr_ffi::Rf_install(c".Internal".as_ptr()),
            reset,
        ));
        extendr_ffi::Rf_unprotect(1);
        Ok(call)
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn run_worker(
    token: &str,
    slot: i32,
    hands: Robj,
    dispatch: Function,
    failed: Function,
    with_warnings: Function,
    state: Robj,
    max_tasks: f64,
    xerror_parts: Function,
    xwarning_messages: Function,
) -> Result<()> {
    let slot = usize::try_from(slot).map_err(|_| rerr("bad worker slot"))?;
    let calls: Vec<Robj> = hands
        .as_list()
        .map(|l| l.values().collect())
        .unwrap_or_default();
    if !state.is_environment() || calls.len() != 2 || !calls.iter().all(Robj::is_language) {
        return Err(rerr("run_worker: bad handler calls or state environment"));
    }
    heap::keep_freed_memory();
    let exec = RExec {
        hands: handler_stack(&calls[0], &calls[1])?,
        dispatch,
        failed,
        with_warnings,
        xerror_parts,
        xwarning_messages,
        state,
        // SAFETY: R's main thread; installing a symbol only reads or extends the symbol table.
        warnings: unsafe { extendr_ffi::Rf_install(c"warnings".as_ptr()) },
        // SAFETY: as above.
        chunk: unsafe { ChunkSymbols::install() },
        max_tasks: max_tasks.max(0.0) as u64,
        tasks: Cell::new(0),
        idle_slices: Cell::new(0),
        resident: Cell::new(heap::resident_bytes()),
    };
    mizu_pool::run_worker(token, slot, &exec).map_err(rerr)
}

/// For an expression task (`list("e", expr, vars)`, or with its globals as a fourth element
/// and the packages it uses as a fifth, freshly decoded and owned here): replaces
/// `vars` by the environment the expression is evaluated in — the bindings in a new
/// environment whose parent is the global environment — and returns true. Anything else is
/// left as it is (false).
///
/// # Safety
/// R's main thread; `msg` is protected by the caller and held by nobody else.
unsafe fn bind_vars(msg: SEXP) -> bool {
    use extendr_ffi::{R_CHAR, SEXPTYPE, STRING_ELT, TYPEOF, VECTOR_ELT, XLENGTH};
    // SAFETY: types and lengths are checked before elements are read; the new environment
    // is stored in `msg` before anything else allocates.
    unsafe {
        if TYPEOF(msg) != SEXPTYPE::VECSXP || !(3..=5).contains(&XLENGTH(msg)) {
            return false;
        }
        if XLENGTH(msg) >= 4
            && !matches!(
                TYPEOF(VECTOR_ELT(msg, 3)),
                SEXPTYPE::VECSXP | SEXPTYPE::NILSXP
            )
        {
            return false;
        }
        if XLENGTH(msg) == 5 && TYPEOF(VECTOR_ELT(msg, 4)) != SEXPTYPE::STRSXP {
            return false;
        }
        let kind = VECTOR_ELT(msg, 0);
        if TYPEOF(kind) != SEXPTYPE::STRSXP
            || XLENGTH(kind) != 1
            || std::ffi::CStr::from_ptr(R_CHAR(STRING_ELT(kind, 0))) != c"e"
        {
            return false;
        }
        let vars = VECTOR_ELT(msg, 2);
        if TYPEOF(vars) != SEXPTYPE::VECSXP {
            return false;
        }
        let Ok(env) = task_env(vars) else {
            return false;
        };
        extendr_ffi::SET_VECTOR_ELT(msg, 2, env);
        true
    }
}

/// The environment a task's expression is evaluated in: the named values of `vars` bound in a
/// new environment whose parent is the global environment (unprotected).
///
/// # Safety
/// R's main thread; `vars` is a list protected by the caller.
unsafe fn task_env(vars: SEXP) -> std::result::Result<SEXP, ()> {
    // SAFETY: the caller's contract; the closure owns nothing (an allocation error is caught
    // by `try_r`); the new environment is protected while the bindings are made.
    unsafe {
        try_r(move || {
            let env = extendr_ffi::Rf_protect(ffi::R_NewEnv(extendr_ffi::R_GlobalEnv, 0, 29));
            let names = extendr_ffi::Rf_getAttrib(vars, extendr_ffi::R_NamesSymbol);
            if extendr_ffi::TYPEOF(names) == extendr_ffi::SEXPTYPE::STRSXP {
                for i in 0..extendr_ffi::XLENGTH(vars) {
                    let sym = ffi::Rf_installChar(extendr_ffi::STRING_ELT(names, i));
                    ffi::Rf_defineVar(sym, extendr_ffi::VECTOR_ELT(vars, i), env);
                }
            }
            extendr_ffi::Rf_unprotect(1);
            env
        })
    }
}

pub(crate) fn exit_if_orphaned_while_starting() {
    mizu_pool::exit_if_orphaned_while_starting();
}

pub(crate) fn in_task() -> bool {
    with_context(|c| c.is_some())
}

pub(crate) fn worker_slot() -> Option<i32> {
    with_context(|c| c.map(|c| c.worker_slot() as i32))
}
