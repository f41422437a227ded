//! An event loop's own watch over a task's outcome (`mizu_pool::Watch`, as `pymizu`'s loops
//! use it).

use std::sync::Mutex;

use pyo3::prelude::*;

/// A caller's watch over a task's outcome while a CPU is free for it: an event loop looks
/// once per round while `go_on()` holds, instead of sleeping until another thread wakes it (a
/// wake-up costs tens of microseconds in a VM). No other thread of the process watches
/// meanwhile; `close()` (or dropping it) ends it.
#[pyclass(module = "pymizu._native", frozen)]
pub struct Watch(pub(crate) Mutex<Option<mizu_pool::Watch>>);

#[pymethods]
impl Watch {
    /// Whether to look again: a CPU is still free and the watch has time left.
    fn go_on(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|w| w.go_on())
    }

    /// Ends the watch.
    fn close(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}
