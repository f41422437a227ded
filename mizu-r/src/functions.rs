//! A script's functions, kept from one task to the next on both sides: a caller keeps the
//! bytes it sent each function as (an `R_CLOSURE` item of the compact encoding,
//! `crate::small`), and a worker keeps the function it made from those bytes.
//!
//! A script's function travels with every task that calls it. Without these, a caller walks
//! its whole body for every task, and a worker reads the body back (every symbol and call of
//! it) and runs it as R's interpreter reads it or, when R's JIT finds it worth compiling,
//! after a lookup in the JIT's cache. Kept, a function is encoded once by its caller and made
//! once by each worker; later tasks get the same function, which R's JIT compiles in place on
//! its second call and which then stays compiled.
//!
//! Sharing one function between tasks is invisible to them: a function of the global
//! environment has no state of its own, and R copies a function referred to twice before any
//! change (`environment<-`, `body<-`, attributes) — which also keeps a function the caller
//! holds here as it was encoded. Only tasks' messages go through here ([`in_task`],
//! `small::as_task`); values sent otherwise (results, channels) are encoded and made afresh.
//!
//! Both sides hold their functions in a list preserved when the package loads ([`init`]), so
//! that keeping one never allocates: the encoder and the reader run where an R allocation
//! error must not long-jump.

use std::cell::{Cell, RefCell};

use extendr_ffi::{
    R_NilValue, R_PreserveObject, R_xlen_t, Rf_allocVector, SET_VECTOR_ELT, SEXP, SEXPTYPE,
};
use rustc_hash::FxHashMap;

/// The most functions a worker keeps; when full, it lets all of them go and starts again (a
/// stream of tasks that keeps changing its functions gains nothing from keeping them).
const MADE: usize = 1024;
/// The most functions a caller keeps the encodings of; the oldest goes first.
const SENT: usize = 64;

struct Made {
    /// The position in `list` of each function, by its bytes.
    at: FxHashMap<Box<[u8]>, usize>,
    /// A preserved list of `MADE` slots (null before [`init`]).
    list: SEXP,
}

struct Sent {
    /// Each function kept, the depth it was encoded at and its encoding (the whole
    /// `R_CLOSURE` item); the function is also in `list` at the same position, which keeps
    /// its address from naming another.
    entries: Vec<(SEXP, usize, Box<[u8]>)>,
    /// Where the next one goes once `entries` is full.
    next: usize,
    /// A preserved list of `SENT` slots (null before [`init`]).
    list: SEXP,
}

thread_local! {
    // R's main thread only (the one that encodes and reads messages).
    static MADE_FUNCTIONS: RefCell<Made> = RefCell::new(Made {
        at: FxHashMap::default(),
        list: std::ptr::null_mut(),
    });
    static SENT_FUNCTIONS: RefCell<Sent> = const {
        RefCell::new(Sent { entries: Vec::new(), next: 0, list: std::ptr::null_mut() })
    };
    /// Whether the value being read is a task's message (see [`in_task`]).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// Makes the lists that hold the kept functions. Until it has run, nothing is kept.
///
/// # Safety
/// R's main thread, where an allocation error may long-jump (the package's load).
pub unsafe fn init() {
    // SAFETY: R's main thread; each list is preserved before the next allocation
    // (R_PreserveObject protects it while it allocates its own cell).
    let (made, sent) = unsafe {
        let made = Rf_allocVector(SEXPTYPE::VECSXP, MADE as R_xlen_t);
        R_PreserveObject(made);
        let sent = Rf_allocVector(SEXPTYPE::VECSXP, SENT as R_xlen_t);
        R_PreserveObject(sent);
        (made, sent)
    };
    MADE_FUNCTIONS.with_borrow_mut(|m| m.list = made);
    SENT_FUNCTIONS.with_borrow_mut(|s| s.list = sent);
}

/// Clears [`IN_TASK`] when the read ends, however it ends. (Reads of tasks' messages do not
/// nest. A long-jump out of R skips it: the flag then stays set until the next task's read
/// ends, which only makes the functions of values read meanwhile shared, invisibly.)
struct Scope;

impl Drop for Scope {
    fn drop(&mut self) {
        IN_TASK.set(false);
    }
}

/// `f()`, whose reads are of a task's message: its functions are looked up and kept here.
pub fn in_task<T>(f: impl FnOnce() -> T) -> T {
    IN_TASK.set(true);
    let _scope = Scope;
    f()
}

/// Whether functions read now are kept (a task's message is being read).
pub fn keeping() -> bool {
    IN_TASK.get()
}

/// The function made before from `bytes` (an `R_CLOSURE` item's content), if it is kept.
pub fn made(bytes: &[u8]) -> Option<SEXP> {
    MADE_FUNCTIONS.with_borrow(|m| {
        let &i = m.at.get(bytes)?;
        // SAFETY: `list` is a preserved list of `MADE` slots once anything is in `at`, and
        // `i` is below `MADE`; reading an element neither allocates nor raises errors.
        Some(unsafe { extendr_ffi::VECTOR_ELT(m.list, i as R_xlen_t) })
    })
}

/// Keeps function `f`, made from `bytes`.
///
/// # Safety
/// R's main thread; `f` is a live function (protected by the caller).
pub unsafe fn keep_made(bytes: &[u8], f: SEXP) {
    MADE_FUNCTIONS.with_borrow_mut(|m| {
        if m.list.is_null() {
            return;
        }
        if m.at.len() == MADE {
            for &i in m.at.values() {
                // SAFETY: a preserved list of `MADE` slots; setting an element never
                // allocates.
                unsafe { SET_VECTOR_ELT(m.list, i as R_xlen_t, R_NilValue) };
            }
            m.at.clear();
        }
        let i = m.at.len();
        // SAFETY: as above; `f` is live, and from now on held by the list.
        unsafe { SET_VECTOR_ELT(m.list, i as R_xlen_t, f) };
        m.at.insert(bytes.into(), i);
    });
}

/// Appends the encoding kept of function `f` to `out`; whether one was kept for a place at
/// least as deep as `depth` (its nesting stays within the reader's limit).
pub fn sent(f: SEXP, depth: usize, out: &mut Vec<u8>) -> bool {
    SENT_FUNCTIONS.with_borrow(|s| {
        s.entries
            .iter()
            .find(|(g, d, _)| *g == f && depth <= *d)
            .map(|(_, _, bytes)| out.extend_from_slice(bytes))
            .is_some()
    })
}

/// Keeps `bytes` as the encoding of function `f` (the whole `R_CLOSURE` item) at `depth`.
///
/// # Safety
/// R's main thread; `f` is a live function (protected by its caller).
pub unsafe fn keep_sent(f: SEXP, depth: usize, bytes: &[u8]) {
    SENT_FUNCTIONS.with_borrow_mut(|s| {
        if s.list.is_null() {
            return;
        }
        let i = if s.entries.len() < SENT {
            s.entries.push((f, depth, bytes.into()));
            s.entries.len() - 1
        } else {
            let i = s.next;
            s.entries[i] = (f, depth, bytes.into());
            s.next = (i + 1) % SENT;
            i
        };
        // SAFETY: a preserved list of `SENT` slots; setting an element never allocates; `f`
        // is live, and from now on held by the list (which lets go of the one it replaces).
        unsafe { SET_VECTOR_ELT(s.list, i as R_xlen_t, f) };
    });
}
