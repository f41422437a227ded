//! The shared futex parker: how a process sleeps until another process changes something.
//!
//! Protocol (checked by the loom model `parker_no_lost_wakeup`):
//! * waiter: snapshot `epoch` → announce (`sleepers += 1`) → SeqCst fence → re-check the
//!   condition → `futex_wait(epoch, snapshot)` for a bounded slice → `sleepers -= 1`;
//! * waker: make the condition true → SeqCst fence → only if `sleepers != 0`: bump `epoch` and
//!   `futex_wake`.
//!
//! The two fences order "condition published" against "sleeper announced": either the waker
//! sees the sleeper (and the bumped epoch makes the futex wait fail or wakes it), or the
//! waiter's re-check sees the condition. A waker that finds nobody asleep costs one fence and
//! one load of a line nobody writes while spinning — no syscall, no shared write.

use std::time::Duration;

use crate::sync::{AtomicU32, Ordering, fence, futex};

/// The futex word pair, `#[repr(C)]`, placed in shared memory on its own cache line.
#[repr(C)]
#[derive(Debug, Default)]
pub struct ParkWord {
    epoch: AtomicU32,
    sleepers: AtomicU32,
}

#[cfg(not(mizu_loom))]
// SAFETY: two atomics, repr(C), valid when zero.
unsafe impl crate::segment::ShmSafe for ParkWord {}

impl ParkWord {
    /// A word with nobody asleep.
    pub fn new() -> Self {
        ParkWord {
            epoch: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
        }
    }

    /// Wakes every sleeper, if there is one. Call after publishing the change they wait for.
    /// Returns whether a wake syscall was made.
    #[inline]
    pub fn wake_all(&self) -> bool {
        fence(Ordering::SeqCst);
        self.wake_all_fenced()
    }

    /// [`ParkWord::wake_all`] for a waker that has issued the SeqCst fence itself, after its
    /// change: one fence for several words woken for the same change.
    #[inline]
    pub fn wake_all_fenced(&self) -> bool {
        if self.sleepers.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.epoch.fetch_add(1, Ordering::Release);
        futex::wake(&self.epoch, u32::MAX);
        true
    }

    /// Bumps the epoch and wakes every sleeper unconditionally (for out-of-band events such as
    /// a peer's death, noticed by a watcher that did not change the waited-for state).
    pub fn wake_all_unconditionally(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        futex::wake(&self.epoch, u32::MAX);
    }

    /// Processes currently announced as asleep.
    pub fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::Relaxed)
    }

    /// Forgets every announced sleeper: for the word of a process that was killed (a death
    /// while parked leaves its announcement raised for good, and every waker after it would
    /// make a needless wake syscall and think the word's owner asleep). Only when no live
    /// process can be parked on the word.
    pub fn forget_sleepers(&self) {
        self.sleepers.store(0, Ordering::Relaxed);
    }

    /// One park step: snapshot, announce, re-check with `poll`, sleep at most `timeout`
    /// (forever when `None`), then poll once more. `None` means "not ready yet".
    pub fn park<T>(
        &self,
        poll: &mut impl FnMut() -> Option<T>,
        timeout: Option<Duration>,
    ) -> Option<T> {
        let snapshot = self.epoch.load(Ordering::Acquire);
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if let Some(v) = poll() {
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
            return Some(v);
        }
        futex::wait(&self.epoch, snapshot, timeout);
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        poll()
    }
}

/// A park word for one sleeper at a time that waits for one event among many — one task
/// among all of a submitter's — so that the others do not wake it for nothing (a map's caller
/// waiting for its last chunk was woken by every chunk before it, and each wake-up took a CPU
/// from a worker for a context switch and a look).
///
/// Protocol (checked by the loom models `aimed_park_*`): the sleeper stores its `aim`, then
/// parks on the word as on any [`ParkWord`] (announce, SeqCst fence, re-check); a waker makes
/// its event happen, issues the SeqCst fence, and wakes only if a sleeper is announced and aims
/// at its event ([`ANY`]: every event), or when it `force`s the wake. The aim is stored before
/// the sleeper's fence, so a waker that sees the sleeper sees its aim. A stale aim left by an
/// earlier wait at most wakes nobody while nobody sleeps, or wakes once too often.
#[repr(C)]
#[derive(Debug, Default)]
pub struct AimedPark {
    word: ParkWord,
    aim: AtomicU32,
}

/// The aim of a sleeper that wants every event.
pub const ANY: u32 = u32::MAX;

#[cfg(not(mizu_loom))]
// SAFETY: repr(C) atomics, valid when zero.
unsafe impl crate::segment::ShmSafe for AimedPark {}

impl AimedPark {
    /// A word with nobody asleep.
    pub fn new() -> Self {
        AimedPark {
            word: ParkWord::new(),
            aim: AtomicU32::new(ANY),
        }
    }

    /// Sets the event the next park waits for (before parking on [`AimedPark::word`]; only
    /// the one thread that sleeps here may aim).
    #[inline]
    pub fn aim(&self, event: u32) {
        self.aim.store(event, Ordering::Relaxed);
    }

    /// The word to park on once aimed.
    pub fn word(&self) -> &ParkWord {
        &self.word
    }

    /// After a SeqCst fence that follows the event (see [`ParkWord::wake_all_fenced`]): wakes
    /// the sleeper if it aims at `event` or at every event, or if `force`. Returns whether a
    /// wake syscall was made.
    #[inline]
    pub fn wake_fenced(&self, event: u32, force: bool) -> bool {
        if self.word.sleepers.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let aim = self.aim.load(Ordering::Relaxed);
        if !force && aim != event && aim != ANY {
            return false;
        }
        self.word.epoch.fetch_add(1, Ordering::Release);
        futex::wake(&self.word.epoch, u32::MAX);
        true
    }

    /// Wakes the sleeper whatever it aims at (after an event every waiter must see: a death,
    /// a cancel, the pool stopping).
    pub fn wake(&self) -> bool {
        fence(Ordering::SeqCst);
        self.wake_fenced(ANY, true)
    }
}

#[cfg(not(mizu_loom))]
pub use waiter::{WaitError, Waiter};

#[cfg(not(mizu_loom))]
mod waiter {
    use super::ParkWord;
    use std::time::{Duration, Instant};

    /// Why [`Waiter::wait`] returned without the condition.
    #[derive(Debug, PartialEq, Eq)]
    pub enum WaitError<E> {
        /// The timeout passed.
        TimedOut,
        /// The caller's `check` (peer death, interrupt, ...) asked to stop.
        Aborted(E),
    }

    /// Process-local waiting strategy: adaptive spin, then bounded park slices.
    #[derive(Debug, Clone)]
    pub struct Waiter {
        spin: Duration,
        max_spin: Duration,
        slice: Duration,
        parks: u64,
        /// The next wait parks without spinning (see [`Waiter::park_next_at_once`]).
        park_at_once: bool,
    }

    const MIN_SPIN: Duration = Duration::from_micros(1);
    /// Clock-free polls before a wait starts timing (~2 µs with a ~25 ns `pause`).
    pub const BURST_POLLS: u32 = 64;

    impl Waiter {
        /// Spins at most `max_spin` before parking; parks in slices of `slice`, after each of
        /// which the caller's `check` runs.
        pub fn new(max_spin: Duration, slice: Duration) -> Self {
            Waiter {
                spin: max_spin,
                max_spin,
                slice: slice.max(Duration::from_micros(100)),
                parks: 0,
                park_at_once: false,
            }
        }

        /// The next [`Waiter::wait`] parks without spinning, and leaves the spin budget as it
        /// is: its peer cannot run while this thread spins (the kernel queued it behind this
        /// thread), and later waits are not about that.
        pub fn park_next_at_once(&mut self) {
            self.park_at_once = true;
        }

        /// This waiter with the spin budget another one learned (see [`Waiter::spin_budget`]),
        /// kept between 1 µs and `max_spin`: a caller that waits again and again (a collect
        /// per task) keeps what the last wait taught instead of spinning the full budget each
        /// time.
        pub fn with_spin(mut self, spin: Duration) -> Self {
            self.spin = spin.max(MIN_SPIN).min(self.max_spin);
            self
        }

        /// How many times this waiter went to sleep in the kernel.
        pub fn parks(&self) -> u64 {
            self.parks
        }

        /// The current spin budget (adapts between 1 µs and `max_spin`).
        pub fn spin_budget(&self) -> Duration {
            self.spin
        }

        /// Polls `BURST_POLLS` times without reading the clock (nothing when the spin
        /// budget is zero). A peer in a busy stream answers within a few hundred
        /// nanoseconds, and a clock read costs ~30 ns in a VM: a round trip would pay
        /// several of them on each side before its answer arrives.
        pub fn burst<T>(&self, mut poll: impl FnMut() -> Option<T>) -> Option<T> {
            if self.max_spin.is_zero() {
                return None;
            }
            for _ in 0..BURST_POLLS {
                std::hint::spin_loop();
                if let Some(v) = poll() {
                    return Some(v);
                }
            }
            None
        }

        /// Waits until `poll` yields a value, the timeout passes, or `check` fails.
        pub fn wait<T, E>(
            &mut self,
            word: &ParkWord,
            mut poll: impl FnMut() -> Option<T>,
            timeout: Option<Duration>,
            mut check: impl FnMut() -> Result<(), E>,
        ) -> Result<T, WaitError<E>> {
            if let Some(v) = poll() {
                return Ok(v);
            }
            let at_once = std::mem::take(&mut self.park_at_once);
            if !at_once && let Some(v) = self.burst(&mut poll) {
                return Ok(v);
            }
            let start = Instant::now();
            let deadline = timeout.map(|t| start + t);
            let spin_until = start + self.spin.min(timeout.unwrap_or(Duration::MAX));
            // (Told to park at once: no spin.)
            if !at_once {
                let mut n = 0u32;
                loop {
                    std::hint::spin_loop();
                    if let Some(v) = poll() {
                        // Caught while spinning: the budget is right or too small.
                        self.spin = self.max_spin.min(self.spin.max(start.elapsed() * 2));
                        return Ok(v);
                    }
                    n = n.wrapping_add(1);
                    if n.is_multiple_of(64) && Instant::now() >= spin_until {
                        break;
                    }
                }
            }
            check().map_err(WaitError::Aborted)?;
            loop {
                let now = Instant::now();
                let slice = match deadline {
                    Some(d) if now >= d => {
                        // The peer is busy for longer than a spin: spin less next time (a
                        // caller waiting in slices would otherwise spin the full budget at the
                        // start of every slice).
                        if !at_once {
                            self.spin = MIN_SPIN.max(self.spin / 2).min(self.max_spin);
                        }
                        return poll().ok_or(WaitError::TimedOut);
                    }
                    Some(d) => self.slice.min(d - now),
                    None => self.slice,
                };
                self.parks += 1;
                if let Some(v) = word.park(&mut poll, Some(slice)) {
                    if at_once {
                        return Ok(v);
                    }
                    // Spinning a little longer would have avoided this park: spin the full
                    // budget next time; otherwise the peer is idle, so spin less.
                    self.spin = if start.elapsed() < self.max_spin {
                        self.max_spin
                    } else {
                        MIN_SPIN.max(self.spin / 2)
                    };
                    return Ok(v);
                }
                check().map_err(WaitError::Aborted)?;
            }
        }
    }
}

#[cfg(all(test, not(mizu_loom)))]
mod tests {
    use std::time::Duration;

    use super::{ParkWord, WaitError, Waiter};

    #[test]
    fn a_learned_budget_is_kept_within_bounds() {
        let max = Duration::from_micros(50);
        let w = Waiter::new(max, Duration::from_millis(1));
        assert_eq!(w.spin_budget(), max);
        let w = w.with_spin(Duration::from_micros(10));
        assert_eq!(w.spin_budget(), Duration::from_micros(10));
        let w = w.with_spin(Duration::from_secs(1));
        assert_eq!(w.spin_budget(), max);
        let w = w.with_spin(Duration::ZERO);
        assert_eq!(w.spin_budget(), Duration::from_micros(1));
        let none = Waiter::new(Duration::ZERO, Duration::from_millis(1))
            .with_spin(Duration::from_micros(10));
        assert_eq!(none.spin_budget(), Duration::ZERO);
    }

    #[test]
    fn a_wait_told_to_park_at_once_does_not_spin_and_leaves_the_budget() {
        let max = Duration::from_millis(50);
        let mut w = Waiter::new(max, Duration::from_millis(1));
        let word = ParkWord::new();
        // A wait of 2 ms with nothing coming: spinning, it would time out without parking.
        let wait = |w: &mut Waiter| {
            let r = w.wait(
                &word,
                || None::<()>,
                Some(Duration::from_millis(2)),
                || Ok::<(), ()>(()),
            );
            assert!(matches!(r, Err(WaitError::TimedOut)));
        };
        w.park_next_at_once();
        wait(&mut w);
        // It parked, and its budget is as it was.
        let parks = w.parks();
        assert!(parks >= 1);
        assert_eq!(w.spin_budget(), max);
        // The next wait spins again: it times out within its spin, without parking.
        wait(&mut w);
        assert_eq!(w.parks(), parks);
    }

    #[test]
    fn waits_that_time_out_spin_less_and_a_quick_answer_restores_the_budget() {
        let max = Duration::from_micros(64);
        let mut w = Waiter::new(max, Duration::from_millis(1));
        let word = ParkWord::new();
        let mut budgets = Vec::new();
        for _ in 0..3 {
            let r = w.wait(
                &word,
                || None::<()>,
                Some(Duration::from_millis(1)),
                || Ok::<(), ()>(()),
            );
            assert!(matches!(r, Err(WaitError::TimedOut)));
            budgets.push(w.spin_budget());
        }
        assert_eq!(
            budgets,
            [32, 16, 8].map(Duration::from_micros).to_vec(),
            "each timed-out wait halves the budget"
        );
        // An answer caught while spinning (after the burst's polls) keeps spinning worthwhile.
        let mut polls = 0;
        let r = w.wait(
            &word,
            || {
                polls += 1;
                (polls > 100).then_some(7)
            },
            None,
            || Ok::<(), ()>(()),
        );
        assert_eq!(r.ok(), Some(7));
        assert!(w.spin_budget() >= Duration::from_micros(8));
    }
}
