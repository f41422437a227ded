//! Telling the user, once, that a value `/dev/shm` had no room for went to the spill directory
//! (the runtime's notice, `mizu_pool::machine::take_spill_notice`), as an R warning.

use extendr_ffi::{Rf_protect, Rf_unprotect};

use crate::handle::mk_string;

/// Shows the user this process's first spill (`mizu_pool::machine::take_spill_notice`: a
/// value `/dev/shm` had no room for went to files) as an R warning, after the operation that
/// spilled. Called from entries R called, between allocations.
pub(crate) fn warn_if_spilled() {
    let Some(notice) = mizu_pool::machine::take_spill_notice() else {
        return;
    };
    let (at, len) = (notice.as_ptr(), notice.len());
    // SAFETY: R's main thread (the callers are entries R called); the closure owns nothing (a
    // pointer and length into `notice`, valid UTF-8 that outlives the call); what it makes is
    // protected until evaluated; a warning made an error (`options(warn = 2)`) is caught.
    let _ = unsafe {
        crate::rtry::try_r(move || {
            let text = std::str::from_utf8_unchecked(std::slice::from_raw_parts(at, len));
            let msg = Rf_protect(mk_string(text));
            let call = Rf_protect(crate::ffi::Rf_lang2(
                extendr_ffi::Rf_install(c"warning".as_ptr()),
                msg,
            ));
            crate::ffi::Rf_eval(call, extendr_ffi::R_BaseEnv);
            Rf_unprotect(2);
            extendr_ffi::R_NilValue
        })
    };
}
