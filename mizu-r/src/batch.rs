//! Task handles, made in batches: one external pointer with a finalizer owns the tasks of up
//! to [`BATCH`] handles, which hold it through their tags (see [`task_handle`]).

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};

use extendr_ffi::{
    R_ClassSymbol, R_ClearExternalPtr, R_ExternalPtrAddr, R_ExternalPtrTag, R_MakeExternalPtr,
    R_NilValue, R_RegisterCFinalizerEx, Rboolean, Rf_protect, Rf_unprotect, SEXP, SEXPTYPE, TYPEOF,
};

use crate::handle::kept;
use crate::task::RTask;

thread_local! {
    /// The tag of batch handles: a vector made once, compared by address.
    static BATCH_TAG: Cell<Option<SEXP>> = const { Cell::new(None) };
    /// The class vector of task handles.
    static TASK_CLASS: Cell<Option<SEXP>> = const { Cell::new(None) };
}

/// Task handles per batch: the batch (one external pointer with a finalizer) owns the tasks
/// of up to this many handles, which hold it through their tags.
pub(crate) const BATCH: usize = 64;

/// The tasks of one batch of handles, in places that never move (a handle's address is its
/// place): one allocation per batch instead of one per task.
pub(crate) struct Batch {
    tasks: [OnceCell<RTask>; BATCH],
}

impl Batch {
    /// The tasks placed so far.
    pub(crate) fn tasks(&self) -> impl Iterator<Item = &RTask> {
        self.tasks.iter().map_while(OnceCell::get)
    }
}

/// A pool's batches of task handles (see [`task_handle`]).
#[derive(Default)]
pub(crate) struct BatchSlot {
    /// The batch being filled, if any, and how many of its places are taken.
    cur: RefCell<Option<(Rc<Batch>, usize)>>,
    /// The pool's batches that may still be alive and hold unfinished tasks, oldest first:
    /// `RPool::drain` looks through their tasks for finished outcomes to move out of their
    /// slots.
    all: RefCell<VecDeque<Weak<Batch>>>,
}

impl BatchSlot {
    /// The pool's live batches that may hold tasks for which `waiting` holds, oldest first.
    /// Leading batches without such tasks are forgotten first (except the one being filled,
    /// which may get more): tasks finish roughly in order, so what remains is about the tasks
    /// in flight, however many handles the program keeps.
    pub(crate) fn live(&self, waiting: impl Fn(&RTask) -> bool) -> Vec<Rc<Batch>> {
        let mut all = self.all.borrow_mut();
        while all.len() > 1 {
            match all.front().and_then(Weak::upgrade) {
                Some(b) if b.tasks().any(&waiting) => break,
                _ => {
                    all.pop_front();
                }
            }
        }
        all.iter().filter_map(Weak::upgrade).collect()
    }

    /// After the pool stopped: every task still pending lets go of the pool's shared memory
    /// now (collecting it raises `mizu_error_stopped`), rather than when R collects its
    /// handle.
    pub(crate) fn abandon_pending(&self) {
        let live: Vec<Rc<Batch>> = self.all.borrow().iter().filter_map(Weak::upgrade).collect();
        for b in live {
            for t in b.tasks() {
                t.abandon();
            }
        }
    }

    fn push(&self, b: &Rc<Batch>) {
        let mut all = self.all.borrow_mut();
        if all.len() >= 8 && all.len().is_power_of_two() {
            all.retain(|w| w.strong_count() > 0);
        }
        all.push_back(Rc::downgrade(b));
    }
}

/// Drops a batch R no longer holds: the tasks of its handles (an uncollected one frees its
/// task slot when it finishes).
unsafe extern "C" fn finalize_batch(x: SEXP) {
    // SAFETY: R calls this with the batch handle it was registered for; its address is the
    // `Box<Rc<Batch>>` made by `task_handle`, cleared below so that it is dropped once. Every
    // task handle of the batch is unreachable (each holds the batch through its tag).
    unsafe {
        let p = R_ExternalPtrAddr(x).cast::<Rc<Batch>>();
        if p.is_null() {
            return;
        }
        R_ClearExternalPtr(x);
        drop(Box::from_raw(p));
    }
}

/// A new task handle owning `t`: an external pointer of class `mizu_task` whose address is the
/// task and whose tag is its batch. A finalizer per handle would cost ~3 µs per task (R
/// allocates a weak reference for each, and every collection walks them all); a finalizer
/// per [`BATCH`] handles costs 64 times less. The batch being filled is kept in the pool
/// handle's `prot` field, so it lives while the pool handle or any of its task handles does;
/// an uncollected task whose handle was dropped therefore keeps its slot until the rest of
/// its batch is gone (slot pressure is relieved by moving finished outcomes out of their
/// slots, see `RPool::drain`).
///
/// # Safety
/// R's main thread; `pool` is a live, protected pool handle and `slot` its batch slot. The
/// result is unprotected.
pub(crate) unsafe fn task_handle(pool: SEXP, slot: &BatchSlot, t: RTask) -> SEXP {
    // SAFETY: R's main thread; a new batch handle is reachable from the pool handle before
    // anything else allocates; the task handle is protected while its class is set; a task's
    // place in its batch never moves (its address stays valid while the batch lives, which
    // the handle's tag guarantees).
    unsafe {
        let tag = kept(&BATCH_TAG, "mizu_task_batch");
        let class = kept(&TASK_CLASS, "mizu_task");
        let mut cur = slot.cur.borrow_mut();
        if cur.as_ref().is_none_or(|(_, n)| *n >= BATCH) {
            let b = Rc::new(Batch {
                tasks: std::array::from_fn(|_| OnceCell::new()),
            });
            slot.push(&b);
            let owner: Box<Rc<Batch>> = Box::new(b.clone());
            let bx = R_MakeExternalPtr(Box::into_raw(owner).cast(), tag, R_NilValue);
            extendr_ffi::R_SetExternalPtrProtected(pool, bx);
            R_RegisterCFinalizerEx(bx, Some(finalize_batch), Rboolean::FALSE);
            *cur = Some((b, 0));
        }
        let Some((b, n)) = cur.as_mut() else {
            unreachable!("set above")
        };
        let place = &b.tasks[*n];
        *n += 1;
        let bx = extendr_ffi::R_ExternalPtrProtected(pool);
        let task: *const RTask = place.get_or_init(|| t);
        let x = Rf_protect(R_MakeExternalPtr(task.cast_mut().cast(), bx, R_NilValue));
        // The class attribute as `class<-` leaves it on a fresh object (its own attribute
        // list, the object bit), without `Rf_setAttrib`'s checks of what the class names.
        let attr = extendr_ffi::Rf_cons(class, R_NilValue);
        extendr_ffi::SET_TAG(attr, R_ClassSymbol);
        extendr_ffi::SET_ATTRIB(x, attr);
        extendr_ffi::SET_OBJECT(x, 1);
        Rf_unprotect(1);
        x
    }
}

/// Lets go of the batch being filled: the next task handle starts a new one, and the pool
/// handle no longer holds this one, so a collection drops it once its handles are garbage
/// (with the outcomes of tasks dropped uncollected, and the shared memory they reference).
///
/// # Safety
/// R's main thread; `pool` is the live, protected pool handle whose batch slot is `slot`.
pub(crate) unsafe fn seal_batch(pool: SEXP, slot: &BatchSlot) {
    *slot.cur.borrow_mut() = None;
    // SAFETY: the caller's contract; the batch stays alive through its task handles' tags.
    unsafe { extendr_ffi::R_SetExternalPtrProtected(pool, R_NilValue) };
}

/// The task behind handle `x`, if `x` is a live task handle.
///
/// # Safety
/// R's main thread; `x` is a live SEXP that stays protected while the reference is used.
pub(crate) unsafe fn task_ref<'a>(x: SEXP) -> Option<&'a RTask> {
    // SAFETY: type and tags are checked before the address is read (the batch tag is compared
    // by address: only `task_handle` makes such handles); the task lives while its batch does,
    // which `x` holds.
    unsafe {
        if TYPEOF(x) != SEXPTYPE::EXTPTRSXP {
            return None;
        }
        let b = R_ExternalPtrTag(x);
        let tag = BATCH_TAG.get()?;
        if TYPEOF(b) != SEXPTYPE::EXTPTRSXP || R_ExternalPtrTag(b) != tag {
            return None;
        }
        R_ExternalPtrAddr(x).cast::<RTask>().cast_const().as_ref()
    }
}
