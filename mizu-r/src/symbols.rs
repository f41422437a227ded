//! The symbols that decoded messages name, kept from one task to the next.
//!
//! Every expression task names its variables (and most expressions are or contain symbols):
//! making each symbol from its bytes costs two hash-table lookups in R (the string cache, then
//! the symbol table) per name per task. A worker sees the same few names task after task, so
//! the last ones decoded are kept here by their bytes. R never frees a symbol (its symbol table
//! is a garbage-collection root), so a kept `SEXP` stays valid for the life of the process.

use std::cell::RefCell;
use std::ffi::{c_char, c_int};

use extendr_ffi::{Rf_mkCharLenCE, Rf_protect, Rf_unprotect, SEXP, cetype_t};

use crate::ffi;

/// Names longer than this are made each time (they are rare, and the cache stays small).
const LONGEST: usize = 40;
/// How many names are kept; the oldest is replaced first.
const KEPT: usize = 16;

#[derive(Clone, Copy)]
struct Entry {
    kind: cetype_t,
    len: u8,
    name: [u8; LONGEST],
    sym: SEXP,
}

struct Kept {
    entries: [Option<Entry>; KEPT],
    next: usize,
}

thread_local! {
    // R's main thread only (the one that decodes messages).
    static KEPT_SYMBOLS: RefCell<Kept> = const {
        RefCell::new(Kept { entries: [None; KEPT], next: 0 })
    };
}

fn kept(kind: cetype_t, name: &[u8]) -> Option<SEXP> {
    KEPT_SYMBOLS.with_borrow(|k| {
        k.entries.iter().flatten().find_map(|e| {
            (e.kind == kind && &e.name[..usize::from(e.len)] == name).then_some(e.sym)
        })
    })
}

fn keep(kind: cetype_t, name: &[u8], sym: SEXP) {
    let Ok(len) = u8::try_from(name.len()) else {
        return;
    };
    if name.len() > LONGEST {
        return;
    }
    let mut e = Entry {
        kind,
        len,
        name: [0; LONGEST],
        sym,
    };
    e.name[..name.len()].copy_from_slice(name);
    KEPT_SYMBOLS.with_borrow_mut(|k| {
        let at = k.next;
        k.entries[at] = Some(e);
        k.next = (at + 1) % KEPT;
    });
}

/// The symbol named `name` (in encoding `kind`); `name` is not empty and has no NUL. `None`
/// for a name longer than R allows.
///
/// # Safety
/// R's main thread. May allocate: an allocation error long-jumps out (no borrow of the cache
/// is held across an R call).
pub unsafe fn symbol(kind: cetype_t, name: &[u8]) -> Option<SEXP> {
    if let Some(s) = kept(kind, name) {
        return Some(s);
    }
    let len = c_int::try_from(name.len()).ok()?;
    // SAFETY: R's main thread (the caller's contract); `name` points to `len` readable bytes,
    // which R copies; the string is protected while the symbol is made from it.
    let s = unsafe {
        let c = Rf_protect(Rf_mkCharLenCE(name.as_ptr().cast::<c_char>(), len, kind));
        let s = ffi::Rf_installChar(c);
        Rf_unprotect(1);
        s
    };
    keep(kind, name, s);
    Some(s)
}
