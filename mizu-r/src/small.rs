//! A compact encoding for small, plain R values — what most task messages and results are —
//! written and read without R's serializer, whose fixed cost (a reference table allocated per
//! call, the header) dominates small messages.
//!
//! Covered: `NULL`; logical, integer, double, complex, character and raw vectors shorter than
//! the out-of-band floor, with no attributes or only `names`; lists of those (same attribute
//! rule); symbols; calls; functions of the global environment without compiled code (in a
//! task's message also those that keep their source, which is left out: [`as_task`]).
//! Anything else — another attribute, an object bit, ALTREP vectors, other closures,
//! environments, nesting deeper than 64 — makes [`encode`] return `None`.
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
//! item) and the node's item; `R_NAMED` the names (a character vector item) then the value;
//! `R_MISSING` the missing argument; `R_CLOSURE` a varint count of formals, each its name (a
//! symbol item) and its default (`R_MISSING` for none), then the body's item.

use std::cell::Cell;
use std::ffi::{c_char, c_int};

use extendr_ffi::{
    CAR, CDR, DATAPTR_RO, LOGICAL, PRINTNAME, R_CHAR, R_MissingArg, R_NaString, R_NamesSymbol,
    R_NilValue, R_xlen_t, RAW, Rf_allocVector, Rf_cons, Rf_lcons, Rf_mkCharLenCE, Rf_protect,
    Rf_unprotect, SET_STRING_ELT, SET_TAG, SET_VECTOR_ELT, SEXP, SEXPTYPE, STRING_ELT, TAG, TYPEOF,
    XLENGTH, cetype_t,
};

use crate::ffi;
use crate::payload::FLOOR;

use mizu_pool::wire::compact::{self, MAX_DEPTH, tag};

fn varint(out: &mut Vec<u8>, v: u64) {
    compact::put_varint(out, v);
}

/// The R type codes of vector items.
mod vt {
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
        if t == SEXPTYPE::LANGSXP {
            return call(out, x, depth, oob, false);
        }
        if t == SEXPTYPE::CLOSXP {
            return closure(out, x, depth, oob);
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

/// A call: its nodes, each with its tag. In a function's code (`in_code`), the source
/// references R's parser leaves when it keeps the source — the `srcref`, `srcfile` and
/// `wholeSrcref` attributes of a `{` call, and the srcref a `function` call holds as its fourth
/// element — are left out, as `identical()` leaves them out of a function's comparison; any
/// other attribute, or one outside a function's code, is not covered.
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
    // SAFETY: reads of a live call, its nodes and its attributes (pairlists).
    unsafe {
        let attrs = ffi::ATTRIB(x);
        if attrs != R_NilValue && !(in_code && only_source_refs(attrs)) {
            return false;
        }
        let defines_function = in_code && CAR(x) == extendr_ffi::R_FunctionSymbol;
        out.push(tag::R_CALL);
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
        if TYPEOF(x) == SEXPTYPE::LANGSXP {
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
/// travel without the source R keeps of them (see [`closure`]). Anything else — a result, a
/// value sent on a channel or shared — keeps its functions' source (R's serialization
/// carries it).
pub fn as_task<T>(f: impl FnOnce() -> T) -> T {
    let _scope = TaskScope(TASK.replace(true));
    f()
}

/// A function of the global environment (which R's serialization, too, sends as a reference
/// to the receiver's): its formals and its body; in a task's message (see [`as_task`]) also
/// one that keeps its source (a `srcref` attribute), which is left out (see [`call`]). Not
/// covered — R's serialization sends them as they are — a function with another attribute (a
/// class), another environment (which travels with it), or compiled code (the receiver would
/// compile it again).
///
/// # Safety
/// As [`item`]: `x` is a live closure.
unsafe fn closure(out: &mut Vec<u8>, x: SEXP, depth: usize, oob: &mut Option<Vec<SEXP>>) -> bool {
    // SAFETY: reads of a live closure and of its formals (a pairlist).
    unsafe {
        let body = extendr_ffi::get_closure_body(x);
        let attrs = ffi::ATTRIB(x);
        let task = TASK.get();
        let srcref_only = attrs != R_NilValue
            && CDR(attrs) == R_NilValue
            && symbol_name(TAG(attrs)) == Some(b"srcref".as_slice());
        if (attrs != R_NilValue && !(task && srcref_only))
            || ffi::OBJECT(x) != 0
            || extendr_ffi::get_closure_env(x) != extendr_ffi::R_GlobalEnv
            || TYPEOF(body) == SEXPTYPE::BCODESXP
        {
            return false;
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
        out.push(tag::R_CLOSURE);
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
        value(out, body, depth + 1, oob)
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
                tag::R_CALL => {
                    let n = self.count(2)?;
                    if n == 0 {
                        return None;
                    }
                    // The head is protected; every later node hangs off it.
                    let head = Rf_protect(Rf_lcons(R_NilValue, R_NilValue));
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

    /// A function of the global environment: made as R makes one, by evaluating
    /// `function(formals) body` there (which also checks the formals).
    ///
    /// # Safety
    /// As [`Reader::item`].
    unsafe fn closure(&mut self, depth: usize) -> Option<SEXP> {
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
            let call = Rf_protect(ffi::Rf_lang4(
                extendr_ffi::R_FunctionSymbol,
                formals,
                body,
                R_NilValue,
            ));
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
fn expr_task_prefix(b: &[u8]) -> bool {
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

/// `read` on `bytes` (its `R_OOB` items `views`), inside `R_ToplevelExec`; its value if it read every
/// byte, else (malformed, or R ran out of memory) `None`. The value is unprotected.
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
