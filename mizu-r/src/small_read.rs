//! Reading the compact encoding of R values (written by [`crate::small`], whose module docs
//! describe what it covers and how): every allocation is protected while the next is made,
//! inside a top-level context, so that R running out of memory leaves nothing to drop.

use std::ffi::{c_char, c_int};

use extendr_ffi::{
    LOGICAL, R_MissingArg, R_NaString, R_NamesSymbol, R_NilValue, R_xlen_t, RAW, Rf_allocVector,
    Rf_cons, Rf_lcons, Rf_mkCharLenCE, Rf_protect, Rf_unprotect, SET_STRING_ELT, SET_TAG,
    SET_VECTOR_ELT, SEXP, SEXPTYPE, TYPEOF, XLENGTH, cetype_t,
};

use crate::ffi;
use crate::small::vt;

use mizu_pool::wire::compact::{self, MAX_DEPTH, tag};

/// Reads items (through `mizu_pool::wire::compact`); every allocation is protected while the next
/// is made. Plain data: a long-jump out of an R allocation leaves nothing to drop.
struct Reader<'a> {
    r: compact::Reader<'a>,
    /// The payload's out-of-band vectors (`R_OOB` items), made and protected by the caller.
    views: &'a [SEXP],
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        self.r.u8("item").ok()
    }

    fn varint(&mut self) -> Option<u64> {
        self.r.varint("varint").ok()
    }

    /// `n` bytes, or None when fewer remain.
    fn bytes(&mut self, n: usize) -> Option<*const u8> {
        self.r.take("bytes", n).ok().map(<[u8]>::as_ptr)
    }

    /// A count that cannot claim more elements of `size` bytes than remain.
    fn count(&mut self, size: usize) -> Option<usize> {
        self.r.len_of("count", size).ok()
    }

    /// # Safety
    /// R's main thread, inside `R_ToplevelExec` (allocation may long-jump; nothing here owns
    /// anything). The result is unprotected.
    unsafe fn item(&mut self, depth: usize) -> Option<SEXP> {
        if depth > MAX_DEPTH {
            return None;
        }
        // SAFETY: allocations are protected while further allocations happen.
        unsafe {
            let item = self.byte()?;
            let fixed = |r: &mut Reader, t: SEXPTYPE, size: usize| -> Option<SEXP> {
                let n = r.count(size)?;
                let src = r.bytes(n * size)?;
                let v = Rf_allocVector(t, n as R_xlen_t);
                if n > 0 {
                    let dst = match t {
                        SEXPTYPE::RAWSXP => RAW(v).cast::<u8>(),
                        SEXPTYPE::LGLSXP => LOGICAL(v).cast::<u8>(),
                        _ => extendr_ffi::DATAPTR(v).cast::<u8>(),
                    };
                    std::ptr::copy_nonoverlapping(src, dst, n * size);
                }
                Some(v)
            };
            match item {
                tag::NONE => Some(R_NilValue),
                tag::R_VECTOR => match self.byte()? {
                    vt::LGL => fixed(self, SEXPTYPE::LGLSXP, 4),
                    vt::INT => fixed(self, SEXPTYPE::INTSXP, 4),
                    vt::REAL => fixed(self, SEXPTYPE::REALSXP, 8),
                    vt::CPLX => fixed(self, SEXPTYPE::CPLXSXP, 16),
                    vt::RAW => fixed(self, SEXPTYPE::RAWSXP, 1),
                    vt::STR => self.strings(),
                    _ => None,
                },
                tag::LIST => {
                    let n = self.count(1)?;
                    let v = Rf_protect(Rf_allocVector(SEXPTYPE::VECSXP, n as R_xlen_t));
                    for i in 0..n {
                        let Some(e) = self.item(depth + 1) else {
                            Rf_unprotect(1);
                            return None;
                        };
                        SET_VECTOR_ELT(v, i as R_xlen_t, e);
                    }
                    Rf_unprotect(1);
                    Some(v)
                }
                // (R has no symbol without a name: installing one is an R error.)
                tag::R_SYMBOL => self.symbol(false),
                tag::R_MISSING => Some(R_MissingArg),
                tag::R_OOB => {
                    let k = usize::try_from(self.varint()?).ok()?;
                    self.views.get(k).copied()
                }
                tag::R_CALL | tag::R_PAIRLIST => {
                    let n = self.count(2)?;
                    if n == 0 {
                        return None;
                    }
                    // The head is protected; every later node hangs off it.
                    let head = Rf_protect(if item == tag::R_CALL {
                        Rf_lcons(R_NilValue, R_NilValue)
                    } else {
                        Rf_cons(R_NilValue, R_NilValue)
                    });
                    let mut last = head;
                    for i in 0..n {
                        let node = if i == 0 {
                            head
                        } else {
                            let c = Rf_cons(R_NilValue, R_NilValue);
                            extendr_ffi::SETCDR(last, c);
                            c
                        };
                        last = node;
                        let tagged = self.byte();
                        match tagged {
                            Some(0) => {}
                            Some(1) => {
                                let Some(t) = self.item(depth + 1) else {
                                    Rf_unprotect(1);
                                    return None;
                                };
                                if TYPEOF(t) != SEXPTYPE::SYMSXP {
                                    Rf_unprotect(1);
                                    return None;
                                }
                                SET_TAG(node, t);
                            }
                            _ => {
                                Rf_unprotect(1);
                                return None;
                            }
                        }
                        let Some(e) = self.item(depth + 1) else {
                            Rf_unprotect(1);
                            return None;
                        };
                        ffi::SETCAR(node, e);
                    }
                    Rf_unprotect(1);
                    Some(head)
                }
                tag::R_CLOSURE => self.closure(depth),
                tag::R_NAMED => {
                    let names = Rf_protect(self.item(depth + 1)?);
                    let Some(v) = self.item(depth + 1) else {
                        Rf_unprotect(1);
                        return None;
                    };
                    let v = Rf_protect(v);
                    // Names only on vectors (XLENGTH of anything else is an R error).
                    let ok = TYPEOF(names) == SEXPTYPE::STRSXP
                        && extendr_ffi::Rf_isVector(v) == extendr_ffi::Rboolean::TRUE
                        && XLENGTH(names) == XLENGTH(v);
                    if ok {
                        extendr_ffi::Rf_setAttrib(v, R_NamesSymbol, names);
                    }
                    Rf_unprotect(2);
                    ok.then_some(v)
                }
                _ => None,
            }
        }
    }

    /// A function of the global environment: in a task's message, the one made before from
    /// the same bytes if the worker keeps it (`crate::functions`), else made from them.
    ///
    /// # Safety
    /// As [`Reader::item`].
    unsafe fn closure(&mut self, depth: usize) -> Option<SEXP> {
        let n = self.count(1)?;
        let bytes = self.r.take("function", n).ok()?;
        let keeping = crate::functions::keeping();
        if keeping && let Some(f) = crate::functions::made(bytes) {
            return Some(f);
        }
        // (A function's bytes hold nothing out of band: the writer sends them whole.)
        let mut rd = Reader {
            r: compact::Reader::new(bytes, 0, 0),
            views: &[],
        };
        // SAFETY: as `item`; the function is protected while it is kept.
        unsafe {
            let f = rd.function(depth).filter(|_| rd.r.at_end())?;
            if keeping {
                crate::functions::keep_made(bytes, Rf_protect(f));
                Rf_unprotect(1);
            }
            Some(f)
        }
    }

    /// A function's formals and body, made as R makes a function: by evaluating
    /// `function(formals) body` in the global environment (which also checks the formals),
    /// with base's `function` itself at the head of the call (not its name, which a binding
    /// in the global environment could shadow).
    ///
    /// # Safety
    /// As [`Reader::item`].
    unsafe fn function(&mut self, depth: usize) -> Option<SEXP> {
        // SAFETY: as `item`; the formals' head, then the call, are protected while the rest
        // is made.
        unsafe {
            let n = self.count(2)?;
            let mut formals = R_NilValue;
            let mut last = R_NilValue;
            let mut held = 0;
            for _ in 0..n {
                let name = self
                    .item(depth + 1)
                    .filter(|&t| TYPEOF(t) == SEXPTYPE::SYMSXP);
                let value = name.and_then(|_| self.item(depth + 1));
                let (Some(name), Some(value)) = (name, value) else {
                    Rf_unprotect(held);
                    return None;
                };
                let node = Rf_cons(value, R_NilValue);
                SET_TAG(node, name);
                if formals == R_NilValue {
                    formals = Rf_protect(node);
                    held = 1;
                } else {
                    extendr_ffi::SETCDR(last, node);
                }
                last = node;
            }
            let Some(body) = self.item(depth + 1) else {
                Rf_unprotect(held);
                return None;
            };
            let body = Rf_protect(body);
            // (Base's bindings are never collected.)
            let function =
                extendr_ffi::Rf_findFun(extendr_ffi::R_FunctionSymbol, extendr_ffi::R_BaseEnv);
            let call = Rf_protect(ffi::Rf_lang4(function, formals, body, R_NilValue));
            let f = ffi::Rf_eval(call, extendr_ffi::R_GlobalEnv);
            Rf_unprotect(held + 2);
            Some(f)
        }
    }

    /// A character vector's length and elements.
    ///
    /// # Safety
    /// As [`Reader::item`].
    unsafe fn strings(&mut self) -> Option<SEXP> {
        // SAFETY: as `item`; the vector is protected while its elements are made.
        unsafe {
            let n = self.count(1)?;
            let v = Rf_protect(Rf_allocVector(SEXPTYPE::STRSXP, n as R_xlen_t));
            for i in 0..n {
                let Some(c) = self.charsxp(true) else {
                    Rf_unprotect(1);
                    return None;
                };
                SET_STRING_ELT(v, i as R_xlen_t, c);
            }
            Rf_unprotect(1);
            Some(v)
        }
    }

    /// # Safety
    /// As [`Reader::item`].
    unsafe fn charsxp(&mut self, kind: bool) -> Option<SEXP> {
        let k = if kind { self.byte()? } else { 2 };
        if k == 0 {
            // SAFETY: reading R's NA string constant.
            return Some(unsafe { R_NaString });
        }
        let ce = encoding(k)?;
        let s = self.text()?;
        let len = c_int::try_from(s.len()).ok()?;
        // SAFETY: `s` is `len` readable bytes; R copies them.
        Some(unsafe { Rf_mkCharLenCE(s.as_ptr().cast::<c_char>(), len, ce) })
    }

    /// A string's varint length and bytes, which hold no NUL. (R refuses a NUL inside a string
    /// with an error of its own: it is refused here instead, as malformed input; an encoder
    /// never writes one.)
    fn text(&mut self) -> Option<&[u8]> {
        let n = self.count(1)?;
        let p = self.bytes(n)?;
        // SAFETY: `bytes` checked that `n` bytes from `p` lie inside the input, which outlives
        // the reader.
        let s = unsafe { std::slice::from_raw_parts(p, n) };
        (!s.contains(&0)).then_some(s)
    }

    /// A symbol: its name as a string's bytes (after a kind byte when `kind`, else UTF-8).
    /// `None` for `NA` or an empty name, which name no symbol.
    ///
    /// # Safety
    /// As [`Reader::item`].
    unsafe fn symbol(&mut self, kind: bool) -> Option<SEXP> {
        let ce = encoding(if kind { self.byte()? } else { 2 })?;
        let name = self.text()?;
        if name.is_empty() {
            return None;
        }
        // SAFETY: the caller's contract.
        unsafe { crate::symbols::symbol(ce, name) }
    }
}

/// The encoding a string's kind byte names (0, `NA`, names none).
fn encoding(kind: u8) -> Option<cetype_t> {
    match kind {
        1 => Some(cetype_t::CE_NATIVE),
        2 => Some(cetype_t::CE_UTF8),
        3 => Some(cetype_t::CE_LATIN1),
        4 => Some(cetype_t::CE_BYTES),
        _ => None,
    }
}

impl Reader<'_> {
    /// The rest of an expression task after its kind (see [`decode_expr_task_in_context`]):
    /// the expression and the environment of its bindings, both protected (the caller
    /// unprotects two), or `None` with nothing left protected.
    ///
    /// # Safety
    /// As [`Reader::item`].
    unsafe fn expr_task(&mut self) -> Option<(SEXP, SEXP)> {
        // SAFETY: as `item`; each value is protected as soon as it is made.
        unsafe {
            let expr = Rf_protect(self.item(1)?);
            let env = Rf_protect(ffi::R_NewEnv(extendr_ffi::R_GlobalEnv, 0, 29));
            if self.bindings_into(env) {
                Some((expr, env))
            } else {
                Rf_unprotect(2);
                None
            }
        }
    }

    /// Reads the bindings of an expression task into `env`: whether they were read.
    ///
    /// # Safety
    /// As [`Reader::item`]; `env` is a protected environment.
    unsafe fn bindings_into(&mut self, env: SEXP) -> bool {
        // SAFETY: as `item`; every value is protected until bound in `env` (protected).
        unsafe {
            match self.byte() {
                // `list()`: no bindings.
                Some(tag::LIST) => self.varint() == Some(0),
                // Names (a character vector item), then the list of values.
                Some(tag::R_NAMED) => {
                    if self.byte() != Some(tag::R_VECTOR) || self.byte() != Some(vt::STR) {
                        return false;
                    }
                    let Some(n) = self.count(2) else {
                        return false;
                    };
                    // The symbols are kept on the stack: an allocation error long-jumps out of
                    // here, over nothing that needs dropping. More bindings than this take the
                    // general path.
                    let mut syms = [R_NilValue; 16];
                    let Some(syms) = syms.get_mut(..n) else {
                        return false;
                    };
                    for sym in syms.iter_mut() {
                        // `NA` or "" names no variable: the general path decides.
                        let Some(s) = self.symbol(true) else {
                            return false;
                        };
                        *sym = s;
                    }
                    if self.byte() != Some(tag::LIST) || self.count(1) != Some(n) {
                        return false;
                    }
                    for &sym in syms.iter() {
                        let Some(v) = self.item(2) else {
                            return false;
                        };
                        let v = Rf_protect(v);
                        ffi::Rf_defineVar(sym, v, env);
                        Rf_unprotect(1);
                    }
                    true
                }
                _ => false,
            }
        }
    }
}

/// The bytes of `list("e", ...)`'s start: a list of three, then the one-element character
/// vector "e" (native or UTF-8).
const EXPR_TASK_PREFIX: usize = 8;
/// Whether `b` starts as the compact encoding of `list("e", expr, vars)` does: what
/// [`decode_expr_task_in_context`] takes, told before a top-level context is opened for it.
pub(crate) fn expr_task_prefix(b: &[u8]) -> bool {
    b.len() >= EXPR_TASK_PREFIX
        && b[..5] == [tag::LIST, 3, tag::R_VECTOR, vt::STR, 1]
        && matches!(b[5], 1 | 2)
        && b[6..8] == [1, b'e']
}

/// For the compact encoding of an expression task, `list("e", expr, vars)` (what
/// `mizu_submit` sends): the expression and a new environment (parent: the global
/// environment) holding its bindings — what [`decode`] and then `worker::bind_vars` would
/// make, without the message list, the kind string, the names vector and the list of values.
/// `None` for any other payload, or one this path does not take (unusual names, malformed):
/// [`decode`] then handles it. Both values are protected (the caller unprotects two).
///
/// # Safety
/// R's main thread, inside a top-level context (`R_ToplevelExec`) that the caller opened: this
/// allocates, and an allocation error long-jumps to that context.
pub unsafe fn decode_expr_task_in_context(bytes: &[u8]) -> Option<(SEXP, SEXP)> {
    if !expr_task_prefix(bytes) {
        return None;
    }
    let mut rd = Reader {
        r: compact::Reader::new(bytes, EXPR_TASK_PREFIX, 0),
        views: &[],
    };
    // SAFETY: the caller's contract (R's main thread, inside a top-level context).
    let (expr, env) = unsafe { rd.expr_task() }?;
    if rd.r.at_end() {
        Some((expr, env))
    } else {
        // SAFETY: the two values `expr_task` protected.
        unsafe { Rf_unprotect(2) };
        None
    }
}

/// Decodes a compact item that fills `bytes` exactly; `None` when malformed (or R ran out
/// of memory).
pub fn decode(bytes: &[u8]) -> Option<SEXP> {
    decode_with(bytes, &[])
}

/// [`decode`] of an encoding whose `R_OOB` items are `views` (the caller keeps them
/// protected).
pub fn decode_with(bytes: &[u8], views: &[SEXP]) -> Option<SEXP> {
    // SAFETY: `read_all` calls this on R's main thread inside `R_ToplevelExec`, as the
    // reader's methods require.
    read_all(bytes, views, |rd| unsafe { rd.item(0) })
}

/// `read` on `bytes` (its `R_OOB` items `views`), inside `R_ToplevelExec`; its value if it read
/// every byte, else (malformed, or R ran out of memory) `None`. The value is unprotected.
///
/// `read` runs inside the top-level context: it may allocate (an allocation error long-jumps
/// back here) and must own nothing that needs dropping.
fn read_all(bytes: &[u8], views: &[SEXP], read: fn(&mut Reader) -> Option<SEXP>) -> Option<SEXP> {
    let mut ok = false;
    let okp = std::ptr::from_mut(&mut ok);
    // SAFETY: R's main thread; the closure owns nothing (the reader is plain data on its own
    // frame); `bytes` outlives the call.
    let r = unsafe {
        crate::rtry::try_r(move || {
            let mut rd = Reader {
                r: compact::Reader::new(bytes, 0, 0),
                views,
            };
            match read(&mut rd) {
                Some(v) if rd.r.at_end() => {
                    *okp = true;
                    v
                }
                _ => R_NilValue,
            }
        })
    };
    match r {
        Ok(v) if ok => Some(v),
        _ => None,
    }
}
