//! A compact encoding for small, plain R values — what most task messages and results are —
//! written (here) and read (`small_read.rs`) without R's serializer, whose fixed cost (a
//! reference table allocated per call, the header) dominates small messages.
//!
//! Covered: `NULL`; logical, integer, double, complex, character and raw vectors shorter than
//! the out-of-band floor, with no attributes or only `names`; lists of those (same attribute
//! rule); symbols; calls and pairlists; functions of the global environment without compiled
//! code (in a task's message also those that keep their source, which is left out, and
//! compiled ones, as the code they were compiled from: [`as_task`]). Anything else — another
//! attribute, an object bit, ALTREP vectors, other closures, environments, nesting deeper
//! than 64 — makes [`encode`] return `None`.
//! [`encode_oob`] also takes large plain vectors and views of shared memory of ours, as
//! `R_OOB` items naming the payload's out-of-band buffers (sent by reference for views);
//! what neither covers takes R's serialization.
//!
//! The items are the wire format's compact tagged encoding (`docs/wire-format.md` §3, read and
//! written with `mizu_pool::wire::compact`): `NULL` is the shared None item and a list without
//! attributes the shared list item; the rest are R items. A vector is `R_VECTOR`, its R type
//! code (`LGLSXP` 10, `INTSXP` 13, `REALSXP` 14, `CPLXSXP` 15, `STRSXP` 16, `RAWSXP` 24), a
//! varint length, then the elements (little-endian, NA as R stores it); each element of a
//! character vector is a kind byte (0 NA, else the encoding + 1: native, UTF-8, Latin-1,
//! bytes), a varint length and the bytes. `R_SYMBOL` is a varint length and the UTF-8 name;
//! `R_CALL` a varint count, then per node a flag byte (1 when tagged, then the tag as a symbol
//! item) and the node's item, and `R_PAIRLIST` a pairlist the same way; `R_NAMED` the names
//! (a character vector item) then the value; `R_MISSING` the missing argument; `R_CLOSURE` the
//! varint byte length of the rest, a varint count of formals, each its name (a symbol item)
//! and its default (`R_MISSING` for none), then the body's item.

use std::cell::Cell;

use extendr_ffi::{
    CAR, CDR, DATAPTR_RO, PRINTNAME, R_CHAR, R_MissingArg, R_NaString, R_NamesSymbol, R_NilValue,
    R_xlen_t, SEXP, SEXPTYPE, STRING_ELT, TAG, TYPEOF, XLENGTH,
};

use crate::ffi;
use crate::payload::FLOOR;

use mizu_pool::wire::compact::{self, MAX_DEPTH, tag};

fn varint(out: &mut Vec<u8>, v: u64) {
    compact::put_varint(out, v);
}

/// The R type codes of vector items.
pub(crate) mod vt {
    pub const LGL: u8 = 10;
    pub const INT: u8 = 13;
    pub const REAL: u8 = 14;
    pub const CPLX: u8 = 15;
    pub const STR: u8 = 16;
    pub const RAW: u8 = 24;
}

thread_local! {
    /// The buffer of the last compact encoding, given back when its payload was sent (see
    /// [`give_back`]): every task encodes one message or result, and a fresh buffer each time
    /// cost a `malloc` and a `free` on the round trip's path.
    static SPARE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A buffer for an encoding: the spare one (emptied), or a new one.
fn buffer() -> Vec<u8> {
    let mut out = SPARE.take();
    out.clear();
    out.reserve(64);
    out
}

/// Keeps `buf` (an encoding that was sent) for the next encoding; a large one is let go.
pub fn give_back(buf: Vec<u8>) {
    if buf.capacity() <= 64 << 10 {
        SPARE.set(buf);
    }
}

/// What an encoding that failed returns: nothing, its buffer kept for the next one.
fn failed(out: Vec<u8>) -> Option<Vec<u8>> {
    give_back(out);
    None
}

/// The compact encoding of `x`, or `None` when it is not covered (see the module docs).
pub fn encode(x: SEXP) -> Option<Vec<u8>> {
    let mut out = buffer();
    // SAFETY: `x` is live (protected by the caller); only reads, no allocation.
    if unsafe { item(&mut out, x, 0, &mut None) } {
        Some(out)
    } else {
        failed(out)
    }
}

/// The compact encoding of `x` with its large vectors and views of shared memory out of band
/// (each an `R_OOB` item with its index in the returned list, which the caller sends as the
/// payload's buffers); `None` when something else is not covered.
pub fn encode_oob(x: SEXP) -> Option<(Vec<u8>, Vec<SEXP>)> {
    let mut out = buffer();
    let mut oob = Some(Vec::new());
    // SAFETY: `x` is live (protected by the caller); only reads, no R allocation.
    if unsafe { item(&mut out, x, 0, &mut oob) } {
        Some((out, oob.unwrap_or_default()))
    } else {
        give_back(out);
        None
    }
}

/// The compact encoding of the list `list(a, b, c)` (no names), without the list, with large
/// vectors and views of shared memory out of band: what [`encode_oob`] makes of it (the same
/// bytes as [`encode`] when nothing goes out of band), or `None` when an element is not
/// covered.
pub fn encode_list3(a: SEXP, b: SEXP, c: SEXP) -> Option<(Vec<u8>, Vec<SEXP>)> {
    let mut out = buffer();
    out.push(tag::LIST);
    varint(&mut out, 3);
    let mut oob = Some(Vec::new());
    // SAFETY: the elements are live (protected by the caller); only reads, no allocation.
    if unsafe {
        item(&mut out, a, 1, &mut oob)
            && item(&mut out, b, 1, &mut oob)
            && item(&mut out, c, 1, &mut oob)
    } {
        Some((out, oob.unwrap_or_default()))
    } else {
        give_back(out);
        None
    }
}

/// # Safety
/// `x` is a live SEXP; nothing here allocates or can raise an R error.
unsafe fn item(out: &mut Vec<u8>, x: SEXP, depth: usize, oob: &mut Option<Vec<SEXP>>) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    // SAFETY: reads of a live object (the caller's contract).
    unsafe {
        let t = TYPEOF(x);
        if t == SEXPTYPE::NILSXP {
            out.push(tag::NONE);
            return true;
        }
        if t == SEXPTYPE::SYMSXP {
            if x == R_MissingArg {
                out.push(tag::R_MISSING);
                return true;
            }
            out.push(tag::R_SYMBOL);
            return string(out, PRINTNAME(x), false);
        }
        if t == SEXPTYPE::LANGSXP || t == SEXPTYPE::LISTSXP {
            return call(out, x, depth, oob, false);
        }
        if t == SEXPTYPE::CLOSXP {
            return closure(out, x, depth);
        }
        // Vectors: no attributes, or only names; never ALTREP (reading one may run code).
        if !matches!(
            t,
            SEXPTYPE::LGLSXP
                | SEXPTYPE::INTSXP
                | SEXPTYPE::REALSXP
                | SEXPTYPE::CPLXSXP
                | SEXPTYPE::RAWSXP
                | SEXPTYPE::STRSXP
                | SEXPTYPE::VECSXP
        ) {
            return false;
        }
        let attrs = ffi::ATTRIB(x);
        let altrep = extendr_ffi::ALTREP(x) != 0;
        if ffi::OBJECT(x) != 0 || (altrep && oob.is_none()) {
            return false;
        }
        if attrs != R_NilValue {
            if TAG(attrs) != R_NamesSymbol || CDR(attrs) != R_NilValue {
                return false;
            }
            out.push(tag::R_NAMED);
            if !item(out, CAR(attrs), depth + 1, oob) {
                return false;
            }
        }
        let n = XLENGTH(x) as usize;
        // Out of band (when the caller takes buffers): a large plain vector, or a view of
        // shared memory of ours (sent by reference). Any other ALTREP vector is not covered.
        if let Some(list) = oob.as_mut() {
            let size = match t {
                SEXPTYPE::LGLSXP | SEXPTYPE::INTSXP => 4,
                SEXPTYPE::REALSXP => 8,
                SEXPTYPE::CPLXSXP => 16,
                SEXPTYPE::RAWSXP => 1,
                _ => 0,
            };
            let ours = altrep && crate::view::shared(x).is_some();
            if size > 0 && (ours || (!altrep && n * size >= FLOOR)) {
                // The same vector twice travels once (and arrives as one view).
                let k = list.iter().position(|&v| v == x).unwrap_or_else(|| {
                    list.push(x);
                    list.len() - 1
                });
                out.push(tag::R_OOB);
                varint(out, k as u64);
                return true;
            }
            if altrep {
                return false;
            }
        }
        let fixed = |out: &mut Vec<u8>, code: u8, size: usize| {
            if n * size >= FLOOR {
                return false;
            }
            out.extend_from_slice(&[tag::R_VECTOR, code]);
            varint(out, n as u64);
            if n > 0 {
                out.extend_from_slice(std::slice::from_raw_parts(
                    DATAPTR_RO(x).cast::<u8>(),
                    n * size,
                ));
            }
            true
        };
        match t {
            SEXPTYPE::LGLSXP => fixed(out, vt::LGL, 4),
            SEXPTYPE::INTSXP => fixed(out, vt::INT, 4),
            SEXPTYPE::REALSXP => fixed(out, vt::REAL, 8),
            SEXPTYPE::CPLXSXP => fixed(out, vt::CPLX, 16),
            SEXPTYPE::RAWSXP => fixed(out, vt::RAW, 1),
            SEXPTYPE::STRSXP => {
                // Long character vectors go out of band (see strview.rs).
                if n * 8 >= FLOOR {
                    return false;
                }
                out.extend_from_slice(&[tag::R_VECTOR, vt::STR]);
                varint(out, n as u64);
                (0..n).all(|i| string(out, STRING_ELT(x, i as R_xlen_t), true))
            }
            SEXPTYPE::VECSXP => {
                out.push(tag::LIST);
                varint(out, n as u64);
                (0..n).all(|i| {
                    item(
                        out,
                        extendr_ffi::VECTOR_ELT(x, i as R_xlen_t),
                        depth + 1,
                        oob,
                    )
                })
            }
            _ => false,
        }
    }
}

/// A call, or a pairlist (the formals of a `function` call): its nodes, each with its tag. In
/// a function's code (`in_code`), the source references R's parser leaves when it keeps the
/// source — the `srcref`, `srcfile` and `wholeSrcref` attributes of a `{` call, and the srcref
/// a `function` call holds as its fourth element — are left out; any other attribute, or one
/// outside a function's code, is not covered.
///
/// # Safety
/// As [`item`]: `x` is a live call.
unsafe fn call(
    out: &mut Vec<u8>,
    x: SEXP,
    depth: usize,
    oob: &mut Option<Vec<SEXP>>,
    in_code: bool,
) -> bool {
    // SAFETY: reads of a live call or pairlist, its nodes and its attributes (pairlists).
    unsafe {
        let attrs = ffi::ATTRIB(x);
        if attrs != R_NilValue && !(in_code && only_source_refs(attrs)) {
            return false;
        }
        let is_call = TYPEOF(x) == SEXPTYPE::LANGSXP;
        let defines_function = in_code && is_call && CAR(x) == extendr_ffi::R_FunctionSymbol;
        out.push(if is_call {
            tag::R_CALL
        } else {
            tag::R_PAIRLIST
        });
        let mut n = 0u64;
        let mut p = x;
        while p != R_NilValue {
            n += 1;
            p = CDR(p);
        }
        varint(out, n);
        let mut p = x;
        let mut i = 0;
        while p != R_NilValue {
            let tag = TAG(p);
            if tag == R_NilValue {
                out.push(0);
            } else {
                out.push(1);
                if !item(out, tag, depth + 1, oob) {
                    return false;
                }
            }
            let v = CAR(p);
            let written = if defines_function && i == 3 {
                out.push(tag::NONE);
                true
            } else if in_code {
                code(out, v, depth + 1, oob)
            } else {
                item(out, v, depth + 1, oob)
            };
            if !written {
                return false;
            }
            p = CDR(p);
            i += 1;
            if p != R_NilValue && TYPEOF(p) != SEXPTYPE::LISTSXP {
                return false;
            }
        }
        true
    }
}

/// Whether every attribute in `attrs` (an attribute pairlist) is a source reference.
///
/// # Safety
/// `attrs` is a live pairlist.
unsafe fn only_source_refs(attrs: SEXP) -> bool {
    // SAFETY: reads of a live pairlist and of its tags' names.
    unsafe {
        let mut a = attrs;
        while a != R_NilValue {
            if !matches!(
                symbol_name(TAG(a)),
                Some(b"srcref" | b"srcfile" | b"wholeSrcref")
            ) {
                return false;
            }
            a = CDR(a);
        }
        true
    }
}

/// The name of `sym` when it is a symbol.
///
/// # Safety
/// `sym` is a live object.
unsafe fn symbol_name<'a>(sym: SEXP) -> Option<&'a [u8]> {
    // SAFETY: a symbol's name is a CHARSXP, NUL-terminated, kept for the session.
    unsafe {
        (TYPEOF(sym) == SEXPTYPE::SYMSXP)
            .then(|| std::ffi::CStr::from_ptr(R_CHAR(PRINTNAME(sym))).to_bytes())
    }
}

/// A value in a function's code (its body, or a default): as [`item`], calls without their
/// source references (see [`call`]).
///
/// # Safety
/// As [`item`].
unsafe fn code(out: &mut Vec<u8>, x: SEXP, depth: usize, oob: &mut Option<Vec<SEXP>>) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    // SAFETY: the caller's contract.
    unsafe {
        if matches!(TYPEOF(x), SEXPTYPE::LANGSXP | SEXPTYPE::LISTSXP) {
            call(out, x, depth, oob, true)
        } else {
            item(out, x, depth, oob)
        }
    }
}

thread_local! {
    /// Whether the value being encoded is a task's message (see [`as_task`]).
    static TASK: Cell<bool> = const { Cell::new(false) };
}

/// Resets [`TASK`] when the encoding ends, however it ends.
struct TaskScope(bool);

impl Drop for TaskScope {
    fn drop(&mut self) {
        TASK.set(self.0);
    }
}

/// `f()`, whose encodings are of a task's message: the functions in it are there to run, and
/// travel without the source R keeps of them or the byte code R compiled (see [`closure`]).
/// Anything else — a result, a value sent on a channel or shared — keeps its functions'
/// source and byte code (R's serialization carries them).
pub fn as_task<T>(f: impl FnOnce() -> T) -> T {
    let _scope = TaskScope(TASK.replace(true));
    f()
}

/// A function of the global environment (which R's serialization, too, sends as a reference
/// to the receiver's): its formals and its body. In a task's message (see [`as_task`]) also
/// one that keeps its source (a `srcref` attribute), which is left out (see [`call`]), and one
/// R has compiled, as the code it was compiled from: a worker's JIT compiles that body once
/// and finds it in its cache for later tasks, where R's serialization of the byte code cost
/// more than the rest of the round trip; such a function's bytes are kept for the next task
/// that sends it (`crate::functions`). Not covered — R's serialization sends them as they
/// are — a function with another attribute (a class), another environment (which travels
/// with it), or, outside a task's message, compiled code (a value keeps it).
///
/// # Safety
/// As [`item`]: `x` is a live closure.
unsafe fn closure(out: &mut Vec<u8>, x: SEXP, depth: usize) -> bool {
    // SAFETY: reads of a live closure and of its formals (a pairlist).
    unsafe {
        let mut body = extendr_ffi::get_closure_body(x);
        let attrs = ffi::ATTRIB(x);
        let task = TASK.get();
        let srcref_only = attrs != R_NilValue
            && CDR(attrs) == R_NilValue
            && symbol_name(TAG(attrs)) == Some(b"srcref".as_slice());
        if (attrs != R_NilValue && !(task && srcref_only))
            || ffi::OBJECT(x) != 0
            || extendr_ffi::get_closure_env(x) != extendr_ffi::R_GlobalEnv
            || (TYPEOF(body) == SEXPTYPE::BCODESXP && !task)
        {
            return false;
        }
        if TYPEOF(body) == SEXPTYPE::BCODESXP {
            // (The expression is one of the byte code's constants: reachable, not allocated.)
            body = ffi::R_ClosureExpr(x);
            if TYPEOF(body) == SEXPTYPE::BCODESXP {
                return false;
            }
        }
        let formals = extendr_ffi::get_closure_formals(x);
        let mut n = 0u64;
        let mut p = formals;
        while p != R_NilValue {
            if TYPEOF(p) != SEXPTYPE::LISTSXP || TYPEOF(TAG(p)) != SEXPTYPE::SYMSXP {
                return false;
            }
            n += 1;
            p = CDR(p);
        }
        // A function this caller sent before in a task: the same bytes (`crate::functions`).
        if task && crate::functions::sent(x, depth, out) {
            return true;
        }
        let item_start = out.len();
        out.push(tag::R_CLOSURE);
        // The byte length of the rest goes first (written when known): a receiver finds a
        // function it has made before by these bytes without reading them as values.
        let start = out.len();
        // (Nothing in it goes out of band: its bytes are the whole function.)
        let oob = &mut None;
        varint(out, n);
        let mut p = formals;
        // Outside a task's message, source references are not covered: the function takes R's
        // serialization.
        let value = if task { code } else { item };
        while p != R_NilValue {
            if !item(out, TAG(p), depth + 1, oob) || !value(out, CAR(p), depth + 1, oob) {
                return false;
            }
            p = CDR(p);
        }
        if !value(out, body, depth + 1, oob) {
            return false;
        }
        let (len, k) = compact::varint((out.len() - start) as u64);
        out.splice(start..start, len[..k].iter().copied());
        if task {
            crate::functions::keep_sent(x, depth, &out[item_start..]);
        }
        true
    }
}

/// A CHARSXP: with its kind byte when `kind`, else (a symbol name) UTF-8 only.
///
/// # Safety
/// `c` is a live CHARSXP.
unsafe fn string(out: &mut Vec<u8>, c: SEXP, kind: bool) -> bool {
    // SAFETY: reads of a live CHARSXP.
    unsafe {
        if c == R_NaString {
            if !kind {
                return false;
            }
            out.push(0);
            return true;
        }
        let ce = ffi::Rf_getCharCE(c);
        let k: u8 = match ce {
            0 | 99 => 1,
            1 => 2,
            2 => 3,
            3 => 4,
            _ => return false,
        };
        if kind {
            out.push(k);
        } else if k != 1 && k != 2 {
            return false;
        }
        let len = XLENGTH(c) as usize;
        varint(out, len as u64);
        out.extend_from_slice(std::slice::from_raw_parts(R_CHAR(c).cast::<u8>(), len));
        true
    }
}
