//! Collecting outcomes: a task's wait (a burst of polls, an adaptive spin, a watch while a CPU
//! is free, then parking in slices), taking the outcome out of its slot, cancelling and
//! abandoning; the `Task` handle and the waits over several tasks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arrow_buffer::Buffer;
use mizu_queue::SlotState;
use mizu_shm::{WaitError, Waiter};

use crate::error::TaskError;
use crate::layout::{TaskId, reason};
use crate::outcome::OutcomeBytes;
use crate::submitter::{CollectError, SubmitterCore, Task, abandon, cancel};
use crate::watch::{Unwatched, WATCH, watch};

impl SubmitterCore {
    /// The task's state now.
    pub fn state(&self, id: TaskId) -> Option<SlotState> {
        let (g, st) = self.shared.view().task(id.submitter, id.slot).state.load();
        if g == id.generation {
            st
        } else {
            Some(SlotState::Collected)
        }
    }

    /// Waits until the task is final (or `timeout`).
    fn wait_final(
        &self,
        id: TaskId,
        timeout: Option<Duration>,
        help: &mut dyn FnMut() -> bool,
    ) -> Result<SlotState, CollectError> {
        let v = self.shared.view();
        let hdr = v.task(id.submitter, id.slot);
        let poll = || {
            let (g, st) = hdr.state.load();
            if g != id.generation {
                return Some(Err(CollectError::AlreadyCollected));
            }
            st.filter(|s| s.is_final()).map(Ok)
        };
        if let Some(r) = poll() {
            return r;
        }
        let mut w = self.waiter(park_slice());
        let r = self.wait_outcome(&mut w, id.slot, timeout, help, poll);
        self.learn(&w);
        r
    }

    /// The right to park on this submitter's aimed word, aimed at the task in `slot` — when no
    /// other thread of this process waits there (those park on the word every outcome wakes).
    fn aim(&self, slot: usize) -> Option<Aim<'_>> {
        self.aimed_taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        self.shared
            .view()
            .submitter(self.index)
            .aimed
            .aim(slot as u32);
        Some(Aim(self))
    }

    /// Before a wait parks: a caller that woke sleeping workers since it last parked leaves
    /// its CPU to one of them the kernel queued behind another (see
    /// `worker::placement::hand_over`). Not in a worker process, whose CPU is a worker's.
    fn before_parking(&self) {
        if self.woke.load(Ordering::Relaxed) {
            self.woke.store(false, Ordering::Relaxed);
            if !crate::origin::in_worker_process() {
                crate::worker::placement::hand_over(self.shared.view());
            }
        }
    }

    /// A waiter for outcomes of this submitter, with the spin budget the last one learned —
    /// or none when every CPU runs a worker (outside a worker process): spinning then takes
    /// a CPU from a worker, and a map of real work is as much slower as its caller spins.
    /// `slice`: how long it sleeps in the kernel before it looks again by itself.
    pub(crate) fn waiter(&self, slice: Duration) -> Waiter {
        if !crate::origin::in_worker_process() && !crate::watch::room(self.shared.view()) {
            return Waiter::new(Duration::ZERO, slice);
        }
        Waiter::new(self.spin, slice).with_spin(Duration::from_nanos(
            self.learned_spin.load(Ordering::Relaxed),
        ))
    }

    /// Keeps the spin budget `w` ended with for the next wait (not a crowded wait's none).
    pub(crate) fn learn(&self, w: &Waiter) {
        if !w.spin_budget().is_zero() {
            self.learned_spin
                .store(w.spin_budget().as_nanos() as u64, Ordering::Relaxed);
        }
        if w.parks() > 0 {
            self.parks.fetch_add(w.parks(), Ordering::Relaxed);
        }
    }

    /// Waits for outcomes (in this process) that ended while watching, and the times such
    /// waits slept in the kernel.
    pub fn waits(&self) -> (u64, u64) {
        (
            self.watched.load(Ordering::Relaxed),
            self.parks.load(Ordering::Relaxed),
        )
    }

    /// Watches for `poll` through the rest of a running task while a CPU is free for it (see
    /// [`crate::watch`]), for at most `timeout`; None when the caller should park.
    fn watch_for<T>(
        &self,
        timeout: Option<Duration>,
        poll: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        if !self.watch_pays.load(Ordering::Relaxed) {
            return None;
        }
        let limit = timeout.map_or(WATCH, |t| t.min(WATCH));
        match watch(self.shared.view(), limit, poll) {
            Ok(found) => {
                self.watched.fetch_add(1, Ordering::Relaxed);
                Some(found)
            }
            Err(Unwatched::Outlasted) if limit == WATCH => {
                self.outlasted();
                None
            }
            Err(_) => None,
        }
    }

    /// Whether waits on this submitter's tasks watch (see [`crate::watch`]).
    pub(crate) fn watch_pays(&self) -> bool {
        self.watch_pays.load(Ordering::Relaxed)
    }

    /// A task outlasted a whole watch: the next waits park straight away.
    pub(crate) fn outlasted(&self) {
        self.watch_pays.store(false, Ordering::Relaxed);
    }

    /// A parked wait that began at `start` got its outcome: had it come within a watch, the
    /// next waits watch again; had it not, they park straight away, as after a watch that ran
    /// out — also when the watch stopped early for want of a CPU, so that whether the next
    /// wait watches follows how long the tasks take, not how busy the machine was for a moment.
    fn parked_until(&self, start: Instant) {
        let within = start.elapsed() < WATCH && !self.spin.is_zero();
        if self.watch_pays.load(Ordering::Relaxed) != within {
            self.watch_pays.store(within, Ordering::Relaxed);
        }
    }

    /// [`SubmitterCore::wait_final`]'s wait for the task in `slot`, once the first poll found
    /// nothing.
    pub(crate) fn wait_outcome(
        &self,
        w: &mut Waiter,
        slot: usize,
        timeout: Option<Duration>,
        help: &mut dyn FnMut() -> bool,
        poll: impl Fn() -> Option<Result<SlotState, CollectError>> + Copy,
    ) -> Result<SlotState, CollectError> {
        let v = self.shared.view();
        // A result in a busy stream is a few hundred ns away: poll for it before timing the
        // wait (not when the caller only wants a look).
        if timeout.is_none_or(|t| t >= self.spin)
            && let Some(r) = w.burst(poll)
        {
            return r;
        }
        let start = Instant::now();
        // Nested collects run other tasks while they wait (never sleep with work around).
        while help() {
            if let Some(r) = poll() {
                return r;
            }
        }
        if let Some(r) = self.watch_for(timeout.map(|t| t.saturating_sub(start.elapsed())), poll) {
            return r;
        }
        self.before_parking();
        // A worker queued behind the caller runs only once the caller leaves the CPU.
        if !crate::origin::in_worker_process() && crate::watch::worker_here(v) {
            w.park_next_at_once();
        }
        // Parked aimed at this task, other outcomes of the submitter do not wake the caller.
        let aim = self.aim(slot);
        let rec = v.submitter(self.index);
        let word = if aim.is_some() {
            rec.aimed.word()
        } else {
            &rec.park
        };
        loop {
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            match w.wait(word, poll, left.map(|l| l.min(park_slice())), || {
                Ok::<(), ()>(())
            }) {
                Ok(r) => {
                    self.parked_until(start);
                    return r;
                }
                Err(WaitError::TimedOut) | Err(WaitError::Aborted(())) => {
                    if left.is_some_and(|l| l.is_zero()) {
                        return Err(CollectError::Timeout);
                    }
                    while help() {
                        if let Some(r) = poll() {
                            return r;
                        }
                    }
                }
            }
        }
    }

    /// Collects the task's outcome (exactly once), freeing its slot.
    pub(crate) fn collect(
        &self,
        id: TaskId,
        timeout: Option<Duration>,
        help: &mut dyn FnMut() -> bool,
    ) -> Result<OutcomeBytes, CollectError> {
        let st = self.wait_final(id, timeout, help)?;
        let out = self.outcome(id, st);
        let hdr = self.shared.view().task(id.submitter, id.slot);
        if hdr.state.collect_and_free(id.generation, st).is_err() {
            return Err(CollectError::AlreadyCollected);
        }
        // The next submit reuses this slot first: its lines are hot in both processes.
        self.last_freed.store(id.slot, Ordering::Relaxed);
        self.shared
            .view()
            .submitter(self.index)
            .rec
            .collected
            .fetch_add(1, Ordering::Relaxed);
        out
    }

    fn outcome(&self, id: TaskId, st: SlotState) -> Result<OutcomeBytes, CollectError> {
        let (s, k) = (id.submitter, id.slot);
        let hdr = self.shared.view().task(s, k);
        let runner = hdr.runner.load(Ordering::Relaxed);
        let (slot, pid) = ((runner >> 32) as usize, runner as u32);
        let why = hdr.reason.load(Ordering::Relaxed);
        match st {
            SlotState::Ok => self.shared.take_outcome(s, k).map_err(|e| {
                CollectError::Task(TaskError::Runtime(format!(
                    "mizu: cannot read the result: {e}"
                )))
            }),
            SlotState::Err => Err(match self.shared.take_payload(s, k) {
                Ok(b) if why == reason::RUNTIME => {
                    TaskError::Runtime(String::from_utf8_lossy(&b).into_owned())
                }
                Ok(b) => TaskError::Failed(b.to_vec()),
                Err(e) => TaskError::Runtime(format!("mizu: cannot read the error: {e}")),
            }
            .into()),
            SlotState::Died => {
                self.shared.discard_payload(s, k);
                Err(match why {
                    reason::TIMEOUT => TaskError::ExecTimeout { slot, pid },
                    reason::STOPPED => TaskError::Stopped,
                    _ => TaskError::WorkerDied { slot, pid },
                }
                .into())
            }
            _ => {
                self.shared.discard_payload(s, k);
                Err(if why == reason::STOPPED {
                    TaskError::Stopped
                } else {
                    TaskError::Cancelled
                }
                .into())
            }
        }
    }

    /// Cancels a task that has not started; true if it will never run.
    pub fn cancel(&self, id: TaskId) -> bool {
        cancel(&self.shared, id)
    }

    fn abandon(&self, id: TaskId) {
        abandon(&self.shared, id);
    }
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Task({:?})", self.id)
    }
}

impl Task {
    /// The submitter the task belongs to.
    pub(crate) fn core(&self) -> &Arc<SubmitterCore> {
        &self.core
    }

    /// The task's id.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The result, waiting at most `timeout` (forever when `None`); on timeout the handle
    /// stays valid. A result is returned once.
    pub fn result(&mut self, timeout: Option<Duration>) -> Result<Buffer, CollectError> {
        self.outcome(timeout).map(Buffer::from)
    }

    /// [`Task::result`], a small result by value (no allocation; see [`OutcomeBytes`]).
    pub fn outcome(&mut self, timeout: Option<Duration>) -> Result<OutcomeBytes, CollectError> {
        self.outcome_helping(timeout, &mut || false)
    }

    /// Like [`Task::result`], but runs other tasks while waiting (`help` returns whether it
    /// ran one): nested collects use this so they never deadlock.
    pub fn result_helping(
        &mut self,
        timeout: Option<Duration>,
        help: &mut dyn FnMut() -> bool,
    ) -> Result<Buffer, CollectError> {
        self.outcome_helping(timeout, help).map(Buffer::from)
    }

    /// [`Task::result_helping`], a small result by value.
    pub fn outcome_helping(
        &mut self,
        timeout: Option<Duration>,
        help: &mut dyn FnMut() -> bool,
    ) -> Result<OutcomeBytes, CollectError> {
        if self.done {
            return Err(CollectError::AlreadyCollected);
        }
        let r = self.core.collect(self.id, timeout, help);
        if r != Err(CollectError::Timeout) {
            self.done = true;
        }
        r
    }

    /// Cancels the task if it has not started; true if it will never run.
    pub fn cancel(&self) -> bool {
        !self.done && self.core.cancel(self.id)
    }

    /// The task's state.
    pub fn state(&self) -> Option<SlotState> {
        if self.done {
            Some(SlotState::Collected)
        } else {
            self.core.state(self.id)
        }
    }

    /// Whether the task has an outcome to collect.
    pub fn is_done(&self) -> bool {
        self.state().is_some_and(|s| s.is_final())
    }

    /// Whether a caller polling for the outcome should stop: a busy worker of the pool says it
    /// runs on this thread's CPU, so it is queued behind the caller (the rule of the runtime's
    /// own waits, see [`crate::watch`]). A binding's own poll before it collects asks this now
    /// and then: two tasks of 25 µs submitted together took ~150 µs on 2 CPUs while a Python
    /// caller polled 20 µs with the second one's worker waiting for its CPU.
    pub fn worker_queued_here(&self) -> bool {
        !crate::origin::in_worker_process() && crate::watch::worker_here(self.core.shared.view())
    }

    /// A handle that wakes whoever waits in [`wait_until`] on this task's submitter.
    pub fn wakeup(&self) -> Wakeup {
        Wakeup {
            core: self.core.clone(),
        }
    }
}

/// Wakes the threads parked in [`wait_until`] on one submitter so that they poll again: for a
/// waiter whose `poll` also watches something of its own (a flag another thread sets). Set
/// that first, then [`Wakeup::wake`]: the parker's protocol (announce, fence, re-check) then
/// lets no waiter sleep through it.
#[derive(Clone)]
pub struct Wakeup {
    core: Arc<SubmitterCore>,
}

impl std::fmt::Debug for Wakeup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Wakeup(submitter {})", self.core.index)
    }
}

impl Wakeup {
    /// Wakes the parked waiters, if any (no system call when none sleeps).
    pub fn wake(&self) {
        self.core
            .shared
            .view()
            .submitter(self.core.index)
            .park
            .wake_all();
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.core.shared.origin.is_here() {
            self.core.abandon(self.id);
        } else {
            // A forked child's copy: the slot is the parent's to free, and the submitter's
            // last reference here must not tear down what the parent still uses.
            std::mem::forget(self.core.clone());
        }
    }
}

/// Collects every task in order; the first failure by position is returned with its index.
pub fn collect_all(
    tasks: &mut [Task],
    timeout: Option<Duration>,
) -> Result<Vec<Buffer>, (usize, CollectError)> {
    let start = Instant::now();
    let mut out = Vec::with_capacity(tasks.len());
    for (i, t) in tasks.iter_mut().enumerate() {
        let left = timeout.map(|d| d.saturating_sub(start.elapsed()));
        out.push(t.result(left).map_err(|e| (i, e))?);
    }
    Ok(out)
}

/// Waits until any of the not-yet-collected tasks is done; returns its index.
pub fn collect_any(tasks: &[Task], timeout: Option<Duration>) -> Option<usize> {
    let probe = tasks.first()?;
    wait_until(probe, timeout, || {
        tasks.iter().position(|t| !t.done && t.is_done())
    })
}

/// How long a wait for one task's outcome sleeps in the kernel before it looks again by
/// itself. Every event it waits for wakes it (the outcome, a death, a cancel, the pool
/// stopping), so outside a worker a slice only bounds the wait for one that no live process
/// could signal; shorter slices ending in a map of milliseconds were wake-ups that each took a
/// worker's CPU. In a worker process a nested collect runs queued tasks between slices (its
/// `help`), so they stay short there.
pub(crate) fn park_slice() -> Duration {
    if crate::origin::in_worker_process() {
        LOOK
    } else {
        Duration::from_millis(50)
    }
}

/// The slices of waits that also watch something no outcome signals (see [`wait_until`]).
const LOOK: Duration = Duration::from_millis(2);

/// A thread's hold on its submitter's aimed word (see [`SubmitterCore::aim`]).
struct Aim<'a>(&'a SubmitterCore);

impl Drop for Aim<'_> {
    fn drop(&mut self) {
        self.0.aimed_taken.store(false, Ordering::Release);
    }
}

/// Waits until `poll` returns something, parked on the submitter of `probe` (which every
/// outcome of its tasks wakes): for callers that keep their tasks apart (e.g. behind locks).
/// Inside a task it runs other tasks of its worker meanwhile, as a nested collect does: what
/// it waits for may be queued behind the task that waits, on the same worker.
pub fn wait_until<T>(
    probe: &Task,
    timeout: Option<Duration>,
    mut poll: impl FnMut() -> Option<T>,
) -> Option<T> {
    let start = Instant::now();
    let core = probe.core.clone();
    let park = &core.shared.view().submitter(core.index).park;
    let mut w = core.waiter(LOOK);
    if let Some(found) = poll().or_else(|| help_while_none(&mut poll)) {
        return Some(found);
    }
    if let Some(found) = core.watch_for(timeout, &mut poll) {
        return Some(found);
    }
    core.before_parking();
    let slice = park_slice();
    let found = loop {
        let left = timeout.map(|d| d.saturating_sub(start.elapsed()));
        match w.wait(
            park,
            &mut poll,
            Some(left.map_or(slice, |l| l.min(slice))),
            || Ok::<(), ()>(()),
        ) {
            Ok(i) => {
                core.parked_until(start);
                break Some(i);
            }
            Err(_) if left.is_some_and(|l| l.is_zero()) => break None,
            Err(_) => {
                if let Some(found) = help_while_none(&mut poll) {
                    break Some(found);
                }
            }
        }
    };
    core.learn(&w);
    found
}

/// On a thread running a task: runs other tasks of its worker (or steals some) while there
/// are any and `poll` finds nothing. None elsewhere.
fn help_while_none<T>(poll: &mut impl FnMut() -> Option<T>) -> Option<T> {
    crate::context::with_current_task(|ctx| {
        let help = ctx?.help;
        while help() {
            if let Some(found) = poll() {
                return Some(found);
            }
        }
        None
    })
}
