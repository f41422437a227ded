//! What every kind of view (plain, lazy, string) shares: where it came from ([`Source`]),
//! what it shares with its sender ([`Shared`]), the bytes it holds ([`account`], [`released`])
//! and its ALTREP object's ownership ([`new_view`]); and when R's collector runs for views
//! (R cannot see the shared memory a view holds).

use std::cell::{Cell, OnceCell};

use arrow_buffer::Buffer;
use extendr_api::prelude::*;
use extendr_ffi::{
    R_ExternalPtrAddr, R_MakeExternalPtr, R_NilValue, R_RegisterCFinalizerEx, R_altrep_class_t,
    R_new_altrep, Rboolean, Rf_protect, Rf_unprotect, SEXP,
};

/// Where a view came from, to be sent on by reference: the encoded value as it sits in the
/// payload, and for a column of a record batch its index.
#[derive(Clone)]
pub struct Source {
    /// The encoded value.
    pub bytes: Buffer,
    /// The column, for a record batch.
    pub col: Option<u32>,
}

thread_local! {
    /// Views not finalized yet, and their bytes (as [`account`] counts them).
    static LIVE: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// A view of the `bytes` at `at` is being made — of a new copy, or (`copy` false) of a region
/// re-sent by reference — which may make a collection due before the next payload is read
/// (see [`collect_garbage_now_and_then`]).
///
/// Returns the bytes counted as held for it (to give back with [`released`]): a view by
/// reference counts as at most [`REF_WEIGHT`] here. Counted whole, a
/// few views of a large shared object that a young collection found still in use (the task
/// that just ran, the one being read) outgrew the budget and made every young collection a
/// full one.
pub fn account(bytes: usize, copy: bool, at: *const u8) -> usize {
    let weight = if copy { bytes } else { ref_weight(bytes, at) };
    collect_garbage_now_and_then(copy, weight);
    let counted = if copy { bytes } else { bytes.min(REF_WEIGHT) };
    LIVE.with(|l| {
        let (n, b) = l.get();
        l.set((n + 1, b + counted as u64));
    });
    counted
}

/// A view of `bytes` was finalized.
pub fn released(bytes: usize) {
    LIVE.with(|l| {
        let (n, b) = l.get();
        l.set((n.saturating_sub(1), b.saturating_sub(bytes as u64)));
    });
}

/// What the external pointer of a view (of any kind) owns: the bytes it counts towards
/// [`account`], released when R finalizes it.
pub(crate) trait Owned {
    /// The bytes counted for it.
    fn bytes(&self) -> usize;
}

unsafe extern "C" fn finalize<S: Owned>(p: SEXP) {
    // SAFETY: `p` is an external pointer made by `new_view::<S>`, finalized once by R.
    unsafe {
        let s = R_ExternalPtrAddr(p).cast::<S>();
        if !s.is_null() {
            released((*s).bytes());
            drop(Box::from_raw(s));
            extendr_ffi::R_ClearExternalPtr(p);
        }
    }
}

/// A new ALTREP object of `class` whose `data1` is an external pointer owning `state` (its
/// finalizer frees it and releases its bytes, once R collects the view).
pub(crate) fn new_view<S: Owned>(class: R_altrep_class_t, state: S) -> Robj {
    let st = Box::into_raw(Box::new(state));
    // SAFETY: R's main thread; the external pointer owns `st` (freed by `finalize::<S>`) and
    // is protected while the ALTREP object that keeps it as data1 is made.
    unsafe {
        let p = Rf_protect(R_MakeExternalPtr(st.cast(), R_NilValue, R_NilValue));
        R_RegisterCFinalizerEx(p, Some(finalize::<S>), Rboolean::TRUE);
        let v = R_new_altrep(class, p, R_NilValue);
        let r = Robj::from_sexp(v);
        Rf_unprotect(1);
        r
    }
}

thread_local! {
    /// Bytes of views of new copies made since R's last collection we asked for.
    static SINCE_GC: Cell<usize> = const { Cell::new(0) };
    /// Bytes of all views (copies and references) made since then.
    static SINCE_ANY: Cell<usize> = const { Cell::new(0) };
    /// Bytes of views alive right after the last full collection.
    static BASELINE: Cell<u64> = const { Cell::new(0) };
    /// A collection is due, at the start of the next payload's decoding.
    static DUE: Cell<bool> = const { Cell::new(false) };
}

/// R's collector cannot see the shared memory a view holds (a view is a small object to it),
/// so views nobody uses any more would keep regions — and the sender's data segments — alive
/// until R happens to collect.
///
/// Collections are run before the next task is submitted or payload is decoded
/// ([`collect_garbage_if_due`]), not while one is read (its views would survive and be
/// promoted).
///
/// * After every [`young_every`] bytes of views of new copies, a young-generation collection
///   (`gc(full = FALSE)`: a millisecond or more here) reclaims those made and dropped since the
///   last one. Views of regions re-sent by reference do not count there: the sender's own view
///   usually pins the same region, and collecting for each of them would put a collection on
///   every re-send.
/// * Every [`budget`] bytes of views of either kind (a view by reference weighed by
///   [`ref_weight`]), a young collection too.
/// * Views alive at a young collection are promoted and wait for an older one, so when, after
///   a young collection, the views alive still grew by more than [`budget`] since the last
///   full collection (promoted garbage may be holding that much), a full one follows (tens of
///   milliseconds here). Views the program really holds do not count against the budget, only
///   growth does.
///
/// A data frame of a few MB per task made 16 MiB collect every five tasks, which doubled the
/// cost of such tasks; 64 MiB (at most half the budget) keeps collections off most of them.
fn young_every() -> usize {
    (budget() / 2).min(64 << 20) as usize
}

/// How much the bytes held by views may grow between full collections: an eighth of
/// `/dev/shm` (`mizu_pool::machine::shm_capacity`), at most 128 MiB.
fn budget() -> u64 {
    thread_local! {
        static BUDGET: OnceCell<u64> = const { OnceCell::new() };
    }
    BUDGET.with(|b| *b.get_or_init(|| (mizu_pool::machine::shm_capacity() / 8).min(128 << 20)))
}

/// `/dev/shm` is full: a full collection frees the views nobody uses, and with them regions
/// of this process and of the processes that sent them. Called where no payload is being read
/// or written (R's main thread, between a failed send and its retry).
pub fn collect_under_pressure() {
    collect_all_garbage_now();
}

/// What a view of a region re-sent by reference counts against the budget, whatever its size:
/// the sender's own view (a shared object, say) pins the region anyway, so collecting for its
/// size would put a collection on every few tasks reading a large shared object, and freeing
/// such views frees little; an idle worker's full collection reclaims them.
const REF_WEIGHT: usize = 64 << 10;

thread_local! {
    /// The regions views by reference were made of since the last collection (see
    /// [`ref_weight`]).
    static REGIONS_SEEN: std::cell::RefCell<SeenRegions> = std::cell::RefCell::default();
}

/// Regions by where they start in this process (a region given back and another made at the
/// same place before the next collection counts as seen: this only paces collections).
type SeenRegions =
    std::collections::HashSet<usize, std::hash::BuildHasherDefault<rustc_hash::FxHasher>>;

/// Regions remembered by [`ref_weight`] between collections, at most (past that,
/// every view by reference counts again: a collection is then near anyway).
const SEEN_MAX: usize = 4096;

/// What a view by reference of the `bytes` at `at` counts towards the next collection:
/// nothing when its region had a view since the last collection (later views of the same
/// region pin nothing more when they die: a loop of tasks reading one shared object made a
/// young collection every 2 048 tasks for views that, collected, freed nothing); the region's
/// size (at most [`young_every`]) when this process wrote it, as a task's input comes back
/// by reference in its result: its views are then all that pins this process's own memory, and
/// a loop of data frame round trips grew `/dev/shm` by 3 MB per task until R collected; else
/// at most [`REF_WEIGHT`] (a region of another process that it, too, holds).
fn ref_weight(bytes: usize, at: *const u8) -> usize {
    let Some((region, offset)) = mizu_pool::wire::Region::containing(at) else {
        return bytes.min(REF_WEIGHT);
    };
    let first = REGIONS_SEEN.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() >= SEEN_MAX {
            s.clear();
        }
        s.insert(at as usize - offset)
    });
    match (first, region.made_here()) {
        (false, _) => 0,
        (true, true) => region.len().min(young_every()),
        (true, false) => bytes.min(REF_WEIGHT),
    }
}

/// The caller has waited a whole slice for a task while `/dev/shm` is nearly full (less than
/// a quarter free): the worker may be waiting for room that views this session no longer uses
/// hold (R's collector knows nothing of their size). A full collection frees them, when views
/// were made since the last one. Called from a wait, where no payload is being read or written.
pub fn collect_if_pressed() {
    if LIVE.with(Cell::get).1 > BASELINE.with(Cell::get)
        && mizu_pool::machine::shm_available() < mizu_pool::machine::shm_capacity() / 4
    {
        collect_under_pressure();
    }
}

/// `weight`: what the view counts against the budget (its bytes for a new copy, see
/// [`ref_weight`] for a view by reference).
fn collect_garbage_now_and_then(copy: bool, weight: usize) {
    let young = SINCE_GC.with(Cell::get) + if copy { weight } else { 0 };
    let any = SINCE_ANY.with(Cell::get) + weight;
    SINCE_GC.with(|c| c.set(young));
    SINCE_ANY.with(|c| c.set(any));
    if young >= young_every() || (any as u64) >= budget() {
        // Not now, while the views of the payload being read are alive: a collection would
        // promote them, only a full one could free them later, and each such straggler pins
        // a whole data segment (a loop of 3 MB data frames grew to 40 segments, each new one
        // costing milliseconds to make and to map). The next payload's decoding starts with
        // it, when only what the program holds is alive.
        DUE.with(|d| d.set(true));
    }
}

/// Runs the collection the accounting asked for, if any (see [`account`]): called before a
/// payload is decoded.
pub fn collect_garbage_if_due() {
    if DUE.with(Cell::get) {
        collect_garbage();
    }
}

/// A worker with nothing to do: if it made views since the last collection (the inputs of
/// the tasks it ran, now most likely unused), collect them now rather than during a later
/// task, so the senders can reuse their shared memory at once.
pub fn collect_garbage_when_idle() {
    if SINCE_GC.with(Cell::get) >= IDLE_GC_MIN {
        collect_garbage();
    }
}

/// A worker idle for a while: views that a young collection could not reclaim (promoted
/// because a collection ran while their task was still using them) are reclaimed by a full
/// one — when views are held beyond what the last full collection left — so a sender's shared
/// memory goes back after a pause rather than at the next large task.
pub fn collect_all_garbage_when_idle() {
    if LIVE.with(Cell::get).1 > BASELINE.with(Cell::get) {
        collect_all_garbage_now();
    }
}

/// A full collection now, which also does any young one that was due (and an idle worker
/// that grew runs, see `worker::RExec::idle`).
pub fn collect_all_garbage_now() {
    SINCE_GC.with(|c| c.set(0));
    SINCE_ANY.with(|c| c.set(0));
    REGIONS_SEEN.with(|s| s.borrow_mut().clear());
    DUE.with(|d| d.set(false));
    full_collection();
}

/// Idle workers collect once they hold this many bytes of views made since the last time.
const IDLE_GC_MIN: usize = 1 << 20;

thread_local! {
    /// Collections this module ran (young and full), for tests.
    static COLLECTIONS: Cell<u64> = const { Cell::new(0) };
}

fn collect_garbage() {
    COLLECTIONS.with(|c| c.set(c.get() + 1));
    SINCE_GC.with(|c| c.set(0));
    SINCE_ANY.with(|c| c.set(0));
    REGIONS_SEEN.with(|s| s.borrow_mut().clear());
    DUE.with(|d| d.set(false));
    r_gc(c"base::gc(FALSE, FALSE, FALSE)");
    let held = || LIVE.with(Cell::get).1;
    // Views the program let go of since the last full collection lower what it holds.
    BASELINE.with(|b| b.set(b.get().min(held())));
    if held().saturating_sub(BASELINE.with(Cell::get)) > budget() {
        full_collection();
    }
}

fn full_collection() {
    COLLECTIONS.with(|c| c.set(c.get() + 1));
    r_gc(c"base::gc(FALSE, FALSE, TRUE)");
    // What survived a full collection is held by the program.
    BASELINE.with(|b| b.set(LIVE.with(Cell::get).1));
}

/// Runs R's collector through `code` (a call of `base::gc`).
fn r_gc(code: &std::ffi::CStr) {
    // SAFETY: R's main thread, between allocations (the caller's values are protected); the
    // closure owns nothing; an error (there should be none) is caught.
    let _ = unsafe {
        crate::rtry::try_r(|| crate::ffi::R_ParseEvalString(code.as_ptr(), extendr_ffi::R_BaseEnv))
    };
}

/// What an unmodified view of ours shares with its sender.
pub enum Shared {
    /// Its elements, in R's layout.
    Elements(Buffer),
    /// The encoded Arrow value it came in (and its column).
    Arrow(Source),
}

pub(crate) fn view_collections() -> f64 {
    COLLECTIONS.with(Cell::get) as f64
}

pub(crate) fn view_live() -> Vec<f64> {
    let (n, b) = LIVE.with(Cell::get);
    vec![n as f64, b as f64]
}
