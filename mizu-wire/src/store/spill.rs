//! Saying once that values spilled: the first data segment a process puts in the spill
//! directory (`mizu_shm::place::spill_dir`, because `/dev/shm` had no room) leaves a notice
//! here, which the binding takes and shows its user in its language's way (a Python warning,
//! an R warning; a worker prints it), naming how much `/dev/shm` holds and how to enlarge it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

static SAID: AtomicBool = AtomicBool::new(false);
static NOTICE: Mutex<Option<String>> = Mutex::new(None);

/// A value of `len` bytes was spilled (only the first time counts).
pub(super) fn spilled(len: u64) {
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    let dir = mizu_shm::place::spill_dir().map_or_else(String::new, |d| d.display().to_string());
    let msg = format!(
        "mizu: /dev/shm ({:.0} MiB, {:.0} MiB free) has no room for a value of {:.1} MiB: it \
         and values like it go to files in {dir}, mapped shared — slower than shared memory. \
         Enlarge /dev/shm (`docker run --shm-size=2g`), set MIZU_SPILL_DIR to choose the \
         directory, or MIZU_SPILL_DIR=none to get an error instead.",
        mib(mizu_shm::space::capacity()),
        mib(mizu_shm::space::available()),
        mib(len),
    );
    *NOTICE.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg);
}

/// The notice of this process's first spill, once (None before it, and after it was taken).
pub fn take_spill_notice() -> Option<String> {
    if !SAID.load(Ordering::Relaxed) {
        return None;
    }
    NOTICE.lock().unwrap_or_else(|p| p.into_inner()).take()
}
