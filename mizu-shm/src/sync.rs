//! The one switch between real atomics and loom's model-checked ones.
//!
//! Every atomic protocol in mizu (here and in `mizu-queue`) takes its atomics, fences, futex
//! calls and shared byte regions from this module, so the same algorithm code runs across
//! processes on a segment and, under `--cfg mizu_loom`, inside a loom model on the heap.

#[cfg(not(mizu_loom))]
pub use core::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering, fence};
#[cfg(mizu_loom)]
pub use loom::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering, fence};

/// Runs a loom model of `f` with preemption bound `bound` (`None`: every interleaving; a set
/// `LOOM_MAX_PREEMPTIONS` wins) and prints how many interleavings it explored under `name`.
#[cfg(mizu_loom)]
pub fn model(name: &str, bound: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = bound;
    }
    let shown = b
        .preemption_bound
        .map_or("none".to_owned(), |n| n.to_string());
    let counted = runs.clone();
    b.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        f();
    });
    println!(
        "loom model {name}: {} interleavings (preemption bound {shown})",
        runs.load(Ordering::Relaxed)
    );
}

/// Tells the CPU (or loom's scheduler) that we are busy-waiting.
#[inline]
pub fn spin_loop() {
    #[cfg(not(mizu_loom))]
    core::hint::spin_loop();
    #[cfg(mizu_loom)]
    loom::thread::yield_now();
}

/// Shared (never private) futex operations on a word that may live in another process's
/// mapping too.
pub mod futex {
    use super::AtomicU32;
    use std::time::Duration;

    /// Sleeps while `*word == expected`, at most `timeout` (forever when `None`).
    ///
    /// Returns on a wake, a changed value, a signal or the timeout; callers re-check their
    /// condition in every case.
    #[cfg(not(mizu_loom))]
    pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
        use rustix::thread::futex;
        let ts = timeout.map(|d| futex::Timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        // Flags::empty() = a shared futex, keyed by the physical page, so a waker in another
        // process finds us. EAGAIN (value changed), EINTR and ETIMEDOUT are all "re-check".
        let _ = futex::wait(word, futex::Flags::empty(), expected, ts.as_ref());
    }

    /// Wakes up to `n` sleepers on `word`; returns how many were woken.
    #[cfg(not(mizu_loom))]
    pub fn wake(word: &AtomicU32, n: u32) -> usize {
        use rustix::thread::futex;
        futex::wake(word, futex::Flags::empty(), n).unwrap_or(0)
    }

    // Under loom the kernel futex is emulated by one mutex + condvar: the value check and the
    // enqueue happen under the lock, exactly as the kernel does them under its bucket lock, so a
    // lost wake-up shows as a loom deadlock. Timeouts are ignored on purpose: a protocol must be
    // correct without relying on them.
    #[cfg(mizu_loom)]
    loom::lazy_static! {
        static ref FUTEX: (loom::sync::Mutex<u64>, loom::sync::Condvar) =
            (loom::sync::Mutex::new(0), loom::sync::Condvar::new());
    }

    /// Loom emulation of `FUTEX_WAIT` (the timeout is ignored).
    #[cfg(mizu_loom)]
    pub fn wait(word: &AtomicU32, expected: u32, _timeout: Option<Duration>) {
        let (lock, cv) = &*FUTEX;
        let mut generation = lock.lock().unwrap();
        if word.load(super::Ordering::SeqCst) != expected {
            return;
        }
        let start = *generation;
        while *generation == start {
            generation = cv.wait(generation).unwrap();
        }
    }

    /// Loom emulation of `FUTEX_WAKE` (wakes everyone; callers tolerate spurious wakes).
    #[cfg(mizu_loom)]
    pub fn wake(_word: &AtomicU32, _n: u32) -> usize {
        let (lock, cv) = &*FUTEX;
        *lock.lock().unwrap() += 1;
        cv.notify_all();
        1
    }
}

pub use bytes::{HeapBytes, SharedBytes};

#[cfg(not(mizu_loom))]
mod bytes {
    use std::marker::PhantomData;
    use std::ptr::NonNull;

    /// A run of equally sized granules (ring slots, say) in memory that other processes map
    /// too. Access goes through closures so that no reference outlives the protocol step that
    /// owns the granule.
    #[derive(Clone, Copy, Debug)]
    pub struct SharedBytes<'a> {
        base: NonNull<u8>,
        count: usize,
        granule: usize,
        _life: PhantomData<&'a [u8]>,
    }

    // SAFETY: SharedBytes is a plain address range; exclusive use of each granule is up to the
    // protocol on top, which is exactly why `with`/`with_mut` are unsafe.
    unsafe impl Send for SharedBytes<'_> {}
    // SAFETY: as above.
    unsafe impl Sync for SharedBytes<'_> {}

    impl<'a> SharedBytes<'a> {
        /// Wraps `count * granule` bytes at `base`.
        ///
        /// # Safety
        /// The range must stay mapped and writable for `'a` and be used by no other Rust code
        /// except through this type.
        pub unsafe fn from_raw(base: NonNull<u8>, count: usize, granule: usize) -> Self {
            SharedBytes {
                base,
                count,
                granule,
                _life: PhantomData,
            }
        }

        /// Number of granules.
        pub fn count(&self) -> usize {
            self.count
        }

        /// Size of one granule in bytes.
        pub fn granule(&self) -> usize {
            self.granule
        }

        /// Runs `f` on granule `i` for writing.
        ///
        /// # Safety
        /// The caller's protocol must make this the only access to granule `i` while `f` runs.
        pub unsafe fn with_mut<R>(&self, i: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
            assert!(i < self.count, "granule index out of range");
            // SAFETY: i < count, so the granule lies inside the range from_raw was given; the
            // caller guarantees exclusivity for the duration of f.
            let s = unsafe {
                std::slice::from_raw_parts_mut(
                    self.base.as_ptr().add(i * self.granule),
                    self.granule,
                )
            };
            f(s)
        }

        /// Runs `f` on granule `i` for reading.
        ///
        /// # Safety
        /// The caller's protocol must guarantee that nobody writes granule `i` while `f` runs.
        pub unsafe fn with<R>(&self, i: usize, f: impl FnOnce(&[u8]) -> R) -> R {
            assert!(i < self.count, "granule index out of range");
            // SAFETY: in range as above; the caller guarantees no concurrent writer.
            let s = unsafe {
                std::slice::from_raw_parts(self.base.as_ptr().add(i * self.granule), self.granule)
            };
            f(s)
        }
    }

    /// Heap-owned granules, for property tests of the same code that runs on segments.
    pub struct HeapBytes {
        words: Box<[std::cell::UnsafeCell<u64>]>,
        count: usize,
        granule: usize,
    }

    // SAFETY: access is only through SharedBytes, whose unsafe methods carry the contract.
    unsafe impl Sync for HeapBytes {}

    impl HeapBytes {
        /// `count` zeroed granules of `granule` bytes (a multiple of 8).
        pub fn new(count: usize, granule: usize) -> Self {
            assert!(
                granule.is_multiple_of(8) && granule > 0,
                "granule must be a positive multiple of 8"
            );
            let words = (0..count * granule / 8)
                .map(|_| std::cell::UnsafeCell::new(0))
                .collect();
            HeapBytes {
                words,
                count,
                granule,
            }
        }

        /// A view for the protocol code.
        pub fn view(&self) -> SharedBytes<'_> {
            let base = NonNull::new(self.words.as_ptr() as *mut u8).unwrap_or(NonNull::dangling());
            // SAFETY: the allocation holds count*granule bytes and lives as long as &self.
            unsafe { SharedBytes::from_raw(base, self.count, self.granule) }
        }
    }
}

#[cfg(mizu_loom)]
mod bytes {
    use loom::cell::UnsafeCell;

    /// Loom version: each granule is a tracked cell, so loom reports unsynchronised access.
    #[derive(Clone, Copy)]
    pub struct SharedBytes<'a> {
        cells: &'a [UnsafeCell<Vec<u8>>],
        granule: usize,
    }

    impl SharedBytes<'_> {
        /// Number of granules.
        pub fn count(&self) -> usize {
            self.cells.len()
        }
        /// Size of one granule in bytes.
        pub fn granule(&self) -> usize {
            self.granule
        }
        /// Runs `f` on granule `i` for writing.
        ///
        /// # Safety
        /// As for the real version: exclusive access by protocol.
        pub unsafe fn with_mut<R>(&self, i: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
            // SAFETY: loom checks the exclusivity the caller promises.
            self.cells[i].with_mut(|p| f(unsafe { &mut *p }))
        }
        /// Runs `f` on granule `i` for reading.
        ///
        /// # Safety
        /// As for the real version: no concurrent writer by protocol.
        pub unsafe fn with<R>(&self, i: usize, f: impl FnOnce(&[u8]) -> R) -> R {
            // SAFETY: loom checks the absence of a concurrent writer.
            self.cells[i].with(|p| f(unsafe { &*p }))
        }
    }

    /// Heap-owned, loom-tracked granules.
    pub struct HeapBytes {
        cells: Box<[UnsafeCell<Vec<u8>>]>,
        granule: usize,
    }

    impl HeapBytes {
        /// `count` zeroed granules of `granule` bytes.
        pub fn new(count: usize, granule: usize) -> Self {
            let cells = (0..count)
                .map(|_| UnsafeCell::new(vec![0u8; granule]))
                .collect();
            HeapBytes { cells, granule }
        }
        /// A view for the protocol code.
        pub fn view(&self) -> SharedBytes<'_> {
            SharedBytes {
                cells: &self.cells,
                granule: self.granule,
            }
        }
    }
}
