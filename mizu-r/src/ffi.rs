//! R C-API functions and structures that extendr-ffi does not declare (checked against
//! R 4.2's `Rinternals.h` and `R_ext/Memory.h`).

#![allow(non_camel_case_types, non_snake_case)]
// SEXP points to an opaque R object (extendr declares its target non-exhaustive).
#![allow(improper_ctypes)]

use std::ffi::{c_int, c_void};

use extendr_ffi::SEXP;

/// `R_pstream_binary_format`: native byte order (both ends run on this machine).
pub const R_PSTREAM_BINARY_FORMAT: c_int = 2;

/// `struct R_outpstream_st`.
#[repr(C)]
pub struct R_outpstream_st {
    pub data: *mut c_void,
    pub type_: c_int,
    pub version: c_int,
    pub OutChar: Option<unsafe extern "C" fn(*mut R_outpstream_st, c_int)>,
    pub OutBytes: Option<unsafe extern "C" fn(*mut R_outpstream_st, *mut c_void, c_int)>,
    pub OutPersistHookFunc: Option<unsafe extern "C" fn(SEXP, SEXP) -> SEXP>,
    pub OutPersistHookData: SEXP,
}

/// `struct R_inpstream_st` (with room to spare after it, in case a later R adds fields).
#[repr(C)]
pub struct R_inpstream_st {
    pub data: *mut c_void,
    pub type_: c_int,
    pub InChar: Option<unsafe extern "C" fn(*mut R_inpstream_st) -> c_int>,
    pub InBytes: Option<unsafe extern "C" fn(*mut R_inpstream_st, *mut c_void, c_int)>,
    pub InPersistHookFunc: Option<unsafe extern "C" fn(SEXP, SEXP) -> SEXP>,
    pub InPersistHookData: SEXP,
    pub native_encoding: [u8; 64],
    pub nat2nat_obj: *mut c_void,
    pub nat2utf8_obj: *mut c_void,
    pub spare: [u8; 256],
}

unsafe extern "C" {
    pub fn R_InitOutPStream(
        stream: *mut R_outpstream_st,
        data: *mut c_void,
        type_: c_int,
        version: c_int,
        outchar: Option<unsafe extern "C" fn(*mut R_outpstream_st, c_int)>,
        outbytes: Option<unsafe extern "C" fn(*mut R_outpstream_st, *mut c_void, c_int)>,
        phook: Option<unsafe extern "C" fn(SEXP, SEXP) -> SEXP>,
        pdata: SEXP,
    );
    pub fn R_InitInPStream(
        stream: *mut R_inpstream_st,
        data: *mut c_void,
        type_: c_int,
        inchar: Option<unsafe extern "C" fn(*mut R_inpstream_st) -> c_int>,
        inbytes: Option<unsafe extern "C" fn(*mut R_inpstream_st, *mut c_void, c_int)>,
        phook: Option<unsafe extern "C" fn(SEXP, SEXP) -> SEXP>,
        pdata: SEXP,
    );
    pub fn R_Serialize(s: SEXP, ops: *mut R_outpstream_st);
    pub fn R_Unserialize(ips: *mut R_inpstream_st) -> SEXP;
    pub fn ATTRIB(x: SEXP) -> SEXP;
    pub fn OBJECT(x: SEXP) -> c_int;
    pub fn Rf_eval(e: SEXP, env: SEXP) -> SEXP;
    pub fn Rf_lang2(f: SEXP, a: SEXP) -> SEXP;
    pub fn Rf_lang4(f: SEXP, a: SEXP, b: SEXP, c: SEXP) -> SEXP;
    pub fn R_ParseEvalString(code: *const std::ffi::c_char, env: SEXP) -> SEXP;
    pub fn SETCAR(x: SEXP, y: SEXP) -> SEXP;
    pub fn Rf_getCharCE(x: SEXP) -> c_int;
    pub fn Rf_installChar(x: SEXP) -> SEXP;
    pub fn R_NewEnv(enclos: SEXP, hash: c_int, size: c_int) -> SEXP;
    pub fn Rf_defineVar(symbol: SEXP, value: SEXP, rho: SEXP);
    pub fn Rf_findVarInFrame(rho: SEXP, symbol: SEXP) -> SEXP;
    pub fn Rf_GetOption1(tag: SEXP) -> SEXP;
    pub fn Rf_ScalarLogical(x: std::ffi::c_int) -> SEXP;
    pub fn Rf_ScalarReal(x: f64) -> SEXP;
    /// `Rboolean` (an `int` in C).
    pub fn Rf_inherits(x: SEXP, name: *const std::ffi::c_char) -> std::ffi::c_int;
    /// A closure's body as R code (for a compiled closure, the expression it was compiled
    /// from, as `body()` shows it).
    pub fn R_ClosureExpr(x: SEXP) -> SEXP;
}

// The package's C routines (`pkg/src/shims.c`, `pkg/src/globals.c`, `pkg/src/packages.c`),
// linked into the same
// shared library.
unsafe extern "C" {
    /// [`crate::fast::mizu_rs_submit_expr`], raising its failures.
    pub fn mizu_submit_shim(pool: SEXP, expr: SEXP, vars: SEXP, frame: SEXP) -> SEXP;
    /// `mizu_submit_shim` with its arguments taken from `mizu_submit`'s frame (an
    /// `.External2` routine: R passes the call, the primitive, the arguments and the frame).
    pub fn mizu_submit_frame(call: SEXP, op: SEXP, args: SEXP, frame: SEXP) -> SEXP;
    /// [`crate::fast::mizu_rs_collect_value`], turning an outcome into a value or a condition.
    pub fn mizu_collect_shim(task: SEXP, timeout: SEXP) -> SEXP;
    /// The common chunk of a map on a worker: the loop of its elements, as lapply runs it,
    /// the failing element's position recorded in the worker's state.
    pub fn mizu_chunk_each(f: SEXP, xs: SEXP, dots: SEXP, start: SEXP, st: SEXP) -> SEXP;
    /// The messages of a map's chunks (`starts`, `lens`: the plan), or NULL for an `xs` the
    /// R code slices itself.
    pub fn mizu_chunk_msgs(starts: SEXP, lens: SEXP, xs: SEXP, common: SEXP) -> SEXP;
    /// `wrapper` with the symbol `hole` in its calls replaced by `expr` (`future.c`).
    pub fn mizu_fill_hole(wrapper: SEXP, hole: SEXP, expr: SEXP) -> SEXP;
    /// Binds a task's globals in the global environment; what they replaced.
    pub fn mizu_bind_globals(globals: SEXP) -> SEXP;
    /// Puts back what `mizu_bind_globals` replaced.
    pub fn mizu_unbind_globals(bound: SEXP) -> SEXP;
    /// An expression task's message with the globals it uses from where it was written.
    pub fn mizu_expr_message(expr: SEXP, vars: SEXP, env: SEXP) -> SEXP;
    /// The globals of a map's function, as a named list.
    pub fn mizu_function_globals(f: SEXP) -> SEXP;
    /// Makes a worker's search path agree with the caller's packages a task lists.
    pub fn mizu_attach_packages(pkgs: SEXP) -> SEXP;
    /// The position of the first cache entry whose key is identical to a key, or 0.
    pub fn mizu_find_identical(entries: SEXP, key: SEXP) -> SEXP;
}
