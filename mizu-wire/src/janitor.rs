//! Gives back shared memory nobody uses: a thread of its own, started by the first data
//! segment this process creates or keeps mapped, asks every registered holder (the
//! [`crate::DataPool`]s and [`crate::Mapper`]s of this process) twice a second to let go of
//! what has been idle long enough.
//!
//! When `/dev/shm` is nearly full (less than a quarter free) every idle thing goes at the next
//! look, so that an allocation waiting for room in another process gets it.
//!
//! Holders are registered as weak references, so a dropped pool or mapper costs nothing
//! here; the thread never touches a language runtime, only this crate's own locked state.

use std::sync::{Arc, Mutex, Once, Weak};
use std::time::{Duration, Instant};

/// What holds segments or mappings that can be given back.
pub(crate) trait Trim: Send + Sync {
    /// Lets go of what has been unused since before `now - idle`.
    fn trim(&self, now: Instant);
}

/// How often the janitor looks.
const TICK: Duration = Duration::from_millis(500);

fn holders() -> &'static Mutex<Vec<Weak<dyn Trim>>> {
    static H: Mutex<Vec<Weak<dyn Trim>>> = Mutex::new(Vec::new());
    &H
}

/// Adds a holder for the janitor to ask (from now on, as long as it lives).
pub(crate) fn register(h: Weak<dyn Trim>) {
    let mut g = holders().lock().unwrap_or_else(|p| p.into_inner());
    g.retain(|w| w.strong_count() > 0);
    g.push(h);
}

/// Starts the janitor's thread if it does not run yet (a process that never holds a segment
/// never gets one).
pub(crate) fn ensure_running() {
    static START: Once = Once::new();
    START.call_once(|| {
        // A thread that cannot be started leaves idle memory in place until exit, as before
        // there was a janitor: nothing to report to anyone.
        let _ = std::thread::Builder::new()
            .name("mizu-janitor".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(TICK);
                    // With `/dev/shm` nearly full, what is idle goes at once: another process
                    // may be waiting for room (see `DataPool::alloc`).
                    let pressed = mizu_shm::space::available() < mizu_shm::space::capacity() / 4;
                    sweep(if pressed {
                        far_future()
                    } else {
                        Instant::now()
                    });
                }
            });
    });
}

/// Lets go at once of everything this process keeps only for reuse (idle segments of every
/// pool, mappings kept): for an allocation that found `/dev/shm` full. Returns once it is all
/// gone, also what the janitor's thread was letting go of at the time.
pub(crate) fn release_idle_now() {
    sweep(far_future());
}

/// A moment by which everything idle has been idle long enough.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(24 * 3600)
}

/// Asks every live holder to trim (outside the registry's lock: a trim unmaps and unlinks).
///
/// One sweep at a time: a trim drops what it lets go of after releasing its holder's lock, so
/// a sweep running beside another could find nothing left to do and return while the other
/// still unmaps. The caller that then looks at `/dev/shm` (a pool just stopped) would still see
/// this process's lock file, held by a mapping about to go.
fn sweep(now: Instant) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let live: Vec<Arc<dyn Trim>> = {
        let mut g = holders().lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|w| w.strong_count() > 0);
        g.iter().filter_map(Weak::upgrade).collect()
    };
    for h in live {
        h.trim(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::mpsc;

    /// A holder whose first trim is slow to let go: the window in which another sweep runs.
    struct SlowFirst {
        calls: AtomicU32,
        started: Mutex<Option<mpsc::Sender<()>>>,
        let_go: AtomicBool,
    }

    impl Trim for SlowFirst {
        fn trim(&self, _now: Instant) {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                if let Some(tx) = self.started.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                std::thread::sleep(Duration::from_millis(300));
                self.let_go.store(true, Ordering::SeqCst);
            }
        }
    }

    #[test]
    fn giving_back_now_waits_for_a_sweep_in_flight() {
        let (tx, rx) = mpsc::channel();
        let h = Arc::new(SlowFirst {
            calls: AtomicU32::new(0),
            started: Mutex::new(Some(tx)),
            let_go: AtomicBool::new(false),
        });
        register(Arc::downgrade(&h) as Weak<dyn Trim>);
        let other = std::thread::spawn(|| sweep(Instant::now()));
        rx.recv().unwrap();
        release_idle_now();
        assert!(
            h.let_go.load(Ordering::SeqCst),
            "returned while another sweep was still letting go"
        );
        other.join().unwrap();
    }
}
