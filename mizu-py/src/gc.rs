//! Objects the garbage collector does not track until they could be part of a cycle. Tasks
//! and executor futures come by the thousand in a pipelined loop and hold nothing that could
//! refer back to them until an outcome is stored in them; tracked, every collection meanwhile
//! would walk them all. Whoever stores something in one that the collector tracks tracks the
//! holder again ([`track_holder`]), so cycles through it are still collected.

use pyo3::ffi;
use pyo3::prelude::*;

/// Whether the collector tracks `obj`.
pub(crate) fn is_tracked(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: a live object held by the caller; reading its flag needs only the GIL.
    unsafe { ffi::PyObject_GC_IsTracked(obj.as_ptr()) != 0 }
}

/// Stops tracking `obj`, a new object of a garbage-collected type no other code has seen.
pub(crate) fn untrack_new(obj: &Bound<'_, PyAny>) {
    // SAFETY: a live object (the caller's contract says of a collected type); untracking is
    // always allowed, and its deallocation untracks only if tracked.
    unsafe { ffi::PyObject_GC_UnTrack(obj.as_ptr().cast()) };
}

/// Tracks `obj` again if it is of a garbage-collected type and untracked.
pub(crate) fn track(obj: &Bound<'_, PyAny>) {
    // SAFETY: a live object (held by the caller) and the GIL held, which serialises every
    // tracking change; only objects of collected types are tracked, and only when they are not
    // already.
    unsafe {
        let gc = ffi::PyType_GetFlags(ffi::Py_TYPE(obj.as_ptr())) & ffi::Py_TPFLAGS_HAVE_GC != 0;
        if gc && ffi::PyObject_GC_IsTracked(obj.as_ptr()) == 0 {
            ffi::PyObject_GC_Track(obj.as_ptr().cast());
        }
    }
}

/// `holder` now holds `value` (or hands it out): tracked again if `value` is tracked, since
/// `value` could come to refer to it.
pub(crate) fn track_holder(holder: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) {
    if is_tracked(value) {
        track(holder);
    }
}

/// Tracks `obj` for the garbage collector again if it was made untracked (an executor
/// future, when Python code stores something in it).
#[pyfunction]
pub fn gc_track(obj: &Bound<'_, PyAny>) {
    track(obj);
}
