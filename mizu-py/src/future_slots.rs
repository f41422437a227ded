//! Where a `PoolExecutor` future keeps its fields: the installed future class's `__slots__`,
//! found once (`Slots::probe`) and then read and written at a fixed place in each instance, and
//! what other modules read of a future (its task, whether anything waits on it).

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::task::Task;

/// The future class's fields, in the order of [`Slots`]: `__slots__` of the class, so that
/// the hot paths read and write them at a fixed place in the object instead of through
/// Python's attribute lookup (~190 instructions each).
pub(crate) const SLOT_NAMES: [&str; 7] = [
    "_state",
    "_result",
    "_exception",
    "_task",
    "_cond",
    "_waiter_list",
    "_callback_list",
];

/// Byte offsets of the future class's slot fields within an instance.
#[derive(Clone, Copy)]
pub(crate) struct Slots {
    pub(crate) state: usize,
    pub(crate) result: usize,
    pub(crate) exception: usize,
    pub(crate) task: usize,
    pub(crate) cond: usize,
    pub(crate) waiters: usize,
    pub(crate) callbacks: usize,
}

/// The installed future class and where its fields are.
pub(crate) static LAYOUT: PyOnceLock<(Py<PyType>, Slots)> = PyOnceLock::new();

impl Slots {
    /// Finds where each field of [`SLOT_NAMES`] lives: each must be a slot of `cls` (a member
    /// descriptor in its own dictionary); a probe instance gets a distinct marker object in
    /// each, and the one word within the instance's basic size that holds the marker is the
    /// field. (The offsets CPython keeps in its member descriptors are outside the stable
    /// ABI this module is built for; the instance's basic size is not.)
    pub(crate) fn probe(cls: &Bound<'_, PyType>) -> PyResult<Slots> {
        let py = cls.py();
        let member = PyModule::import(py, "types")?.getattr("MemberDescriptorType")?;
        let own = cls.getattr("__dict__")?;
        let basic: usize = cls.getattr("__basicsize__")?.extract()?;
        let probe = new_object(cls)?;
        let word = std::mem::size_of::<*mut ffi::PyObject>();
        let mut found = [0usize; SLOT_NAMES.len()];
        for (name, at) in SLOT_NAMES.iter().zip(found.iter_mut()) {
            let d = own.get_item(name).map_err(|_| {
                PyTypeError::new_err(format!("the future class has no slot `{name}`"))
            })?;
            if !d.is_instance(&member)? {
                return Err(PyTypeError::new_err(format!(
                    "the future class's `{name}` is not a slot"
                )));
            }
            let marker = py.get_type::<PyAny>().call0()?;
            store(&probe, &pyo3::types::PyString::new(py, name), &marker)?;
            let hits: Vec<usize> = (word..basic)
                .step_by(word)
                .filter(|&off| {
                    // SAFETY: `off + word <= basic`, the size of the instance's own memory,
                    // which is initialised (slots start null); aligned to a word as every
                    // object is.
                    let v = unsafe {
                        *probe
                            .as_ptr()
                            .cast::<u8>()
                            .add(off)
                            .cast::<*mut ffi::PyObject>()
                    };
                    v == marker.as_ptr()
                })
                .collect();
            let [off] = hits[..] else {
                return Err(PyTypeError::new_err(format!(
                    "cannot find the slot `{name}` in a future"
                )));
            };
            *at = off;
        }
        let [state, result, exception, task, cond, waiters, callbacks] = found;
        Ok(Slots {
            state,
            result,
            exception,
            task,
            cond,
            waiters,
            callbacks,
        })
    }
}

/// The field at `off` of `fut` (borrowed; None when unset).
///
/// # Safety
/// `fut` is an instance of the installed future class and `off` one of its [`Slots`].
pub(crate) unsafe fn get<'py>(fut: &Bound<'py, PyAny>, off: usize) -> Option<Bound<'py, PyAny>> {
    // SAFETY: the caller's contract: a slot field of a live instance, holding an object
    // pointer or null; the GIL is held, so no other thread changes it meanwhile.
    unsafe {
        let p = *fut
            .as_ptr()
            .cast::<u8>()
            .add(off)
            .cast::<*mut ffi::PyObject>();
        (!p.is_null()).then(|| Bound::from_borrowed_ptr(fut.py(), p))
    }
}

/// Sets the field at `off` of `fut` to `value`, as a member descriptor's store does.
///
/// # Safety
/// As for [`get`].
pub(crate) unsafe fn set(fut: &Bound<'_, PyAny>, off: usize, value: &Bound<'_, PyAny>) {
    // SAFETY: the caller's contract; the new value's reference moves into the field, and the
    // old one is released after the store, as CPython's own member store does.
    unsafe {
        let at = fut
            .as_ptr()
            .cast::<u8>()
            .add(off)
            .cast::<*mut ffi::PyObject>();
        let old = std::mem::replace(&mut *at, value.clone().into_ptr());
        if !old.is_null() {
            ffi::Py_DecRef(old);
        }
    }
}

/// Where the fields of `fut` are, if it is an instance of the installed class.
pub(crate) fn slots_of(fut: &Bound<'_, PyAny>) -> PyResult<Option<Slots>> {
    let Some((cls, slots)) = LAYOUT.get(fut.py()) else {
        return Ok(None);
    };
    Ok(fut.is_instance(cls.bind(fut.py()))?.then_some(*slots))
}

/// The task of `fut` if it is a future of the installed class holding one; None for any
/// other object.
pub(crate) fn task_of<'py>(fut: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, Task>>> {
    let Some(slots) = slots_of(fut)? else {
        return Ok(None);
    };
    // SAFETY: `fut` is an instance of the installed class (`slots_of`).
    let task = unsafe { get(fut, slots.task) };
    Ok(task.and_then(|t| t.cast_into::<Task>().ok()))
}

/// Whether `fut` is a future of the installed class without a condition: no waiter or
/// callback was ever installed on it.
pub(crate) fn has_no_condition(fut: &Bound<'_, PyAny>) -> PyResult<bool> {
    let Some(slots) = slots_of(fut)? else {
        return Ok(false);
    };
    // SAFETY: `fut` is an instance of the installed class (`slots_of`).
    Ok(unsafe { get(fut, slots.cond) }.is_none_or(|c| c.is_none()))
}

/// Stores `value` as the attribute `name` of the future `fut` the way `object.__setattr__`
/// does, past the class's `__setattr__` (which tracks the future for the garbage collector:
/// the caller tracks it itself when `value` needs it).
pub(crate) fn store(
    fut: &Bound<'_, PyAny>,
    name: &Bound<'_, pyo3::types::PyString>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    // SAFETY: three live objects held by the caller; a generic store returns 0, or -1 with an
    // error set.
    let r = unsafe { ffi::PyObject_GenericSetAttr(fut.as_ptr(), name.as_ptr(), value.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(PyErr::fetch(fut.py()))
    }
}

/// A new instance of `cls`, from the type's allocator (what `object.__new__` calls, less
/// setting up attribute values inline for a dictionary: every field a future uses is a slot,
/// and an attribute a user stores makes the dictionary then).
pub(crate) fn new_object<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    // SAFETY: `cls` is a live type object; a heap type always has its `tp_alloc` slot.
    let alloc = unsafe { ffi::PyType_GetSlot(cls.as_ptr().cast(), ffi::Py_tp_alloc) };
    if alloc.is_null() {
        return Err(PyTypeError::new_err("the future class has no allocator"));
    }
    // SAFETY: the slot holds an `allocfunc` (the type of `tp_alloc`).
    let alloc: ffi::allocfunc = unsafe { std::mem::transmute(alloc) };
    // SAFETY: `cls` is a live, fixed-size type whose instances its allocator makes (zeroed:
    // every slot null until set); a new reference or null with an error set.
    unsafe { Bound::from_owned_ptr_or_err(py, alloc(cls.as_ptr().cast(), 0)) }
}
