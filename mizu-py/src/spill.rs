//! Telling the user, once, that a value `/dev/shm` had no room for went to the spill directory
//! (the runtime's notice, `mizu_pool::machine::take_spill_notice`), as a Python warning.

use pyo3::prelude::*;

/// Shows the user this process's first spill (`mizu_pool::machine::take_spill_notice`) as a
/// `RuntimeWarning`, after the operation that spilled. A warning filter that makes it an
/// error cannot undo what was done: the exception is reported as unraisable instead.
pub(crate) fn warn_if_spilled(py: Python<'_>) {
    if let Some(notice) = mizu_pool::machine::take_spill_notice() {
        let msg = std::ffi::CString::new(notice.replace('\0', " ")).unwrap_or_default();
        let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
        if let Err(e) = PyErr::warn(py, &category, &msg, 1) {
            e.write_unraisable(py, None);
        }
    }
}
