//! `Signal`: the event of a `concurrent.futures` waiter (what `wait` and `as_completed`
//! block on) once the waiter is installed on a `PoolExecutor` future.
//!
//! The standard library's waiter blocks on a `threading.Event` that the thread settling a
//! future sets. For a pymizu future that thread is the executor's collector, which must first
//! be woken itself: two thread wake-ups between a worker finishing and the waiter running.
//! A thread waiting on a `Signal` instead parks where the pool's outcomes wake it (the
//! submitter's futex, as `result()` does) and settles the finished future itself: one
//! wake-up. Whoever else sets the signal (a future of another kind finishing, a
//! cancellation, a broken executor) wakes it there too: the flag is published first, then
//! the parked waiters are woken, as the parker's protocol requires.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use pyo3::prelude::*;

use crate::task::Task;
use crate::waits::{park_any, ready, wait_loop};

/// A settable flag that a thread can wait on together with pool tasks.
#[pyclass(module = "pymizu", name = "Signal", frozen)]
#[derive(Default)]
pub struct Signal {
    flag: AtomicBool,
    /// Serialises `set` with a sleep on `woken` (a wait with no pending task).
    sleep: Mutex<()>,
    woken: Condvar,
    /// Where waiting threads are parked (on a pool's submitter), one entry per waiting thread.
    parked: Mutex<Vec<(u64, mizu_pool::Wakeup)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Identifies a waiting thread's entry in [`Signal::parked`].
fn thread_key() -> u64 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static KEY: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    KEY.with(|k| *k)
}

#[pymethods]
impl Signal {
    #[new]
    fn new() -> Self {
        Signal::default()
    }

    /// Sets the flag and wakes every thread waiting on it.
    fn set(&self) {
        self.flag.store(true, Ordering::SeqCst);
        // Taking the lock orders this store before any sleeper's check of the flag.
        drop(lock(&self.sleep));
        self.woken.notify_all();
        for (_, w) in lock(&self.parked).iter() {
            w.wake();
        }
    }

    fn clear(&self) {
        self.flag.store(false, Ordering::SeqCst);
    }

    fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Waits (GIL released, signals checked) until the flag is set (-1) or one of `tasks` is
    /// done (its position); None after `timeout` seconds.
    #[pyo3(signature = (tasks, timeout=None))]
    fn wait(
        &self,
        py: Python<'_>,
        tasks: Vec<Py<Task>>,
        timeout: Option<f64>,
    ) -> PyResult<Option<isize>> {
        let found = || {
            if self.is_set() {
                Some(-1)
            } else {
                ready(&tasks).map(|i| i as isize)
            }
        };
        wait_loop(py, timeout, found, |slice| {
            if tasks.is_empty() {
                self.sleep_for(slice)
            } else {
                let key = thread_key();
                park_any(&tasks, slice, &|| self.is_set(), &mut |w| {
                    let mut parked = lock(&self.parked);
                    parked.retain(|(k, _)| *k != key);
                    parked.extend(w.map(|w| (key, w)));
                })
            }
        })
    }
}

impl Signal {
    /// Sleeps until the flag is set, at most `slice`.
    fn sleep_for(&self, slice: Duration) -> Option<()> {
        let g = lock(&self.sleep);
        let (_g, r) = self
            .woken
            .wait_timeout_while(g, slice, |_| !self.is_set())
            .unwrap_or_else(|p| p.into_inner());
        (!r.timed_out()).then_some(())
    }
}
