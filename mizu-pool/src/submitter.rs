//! Submitting tasks and collecting their results: what the controller, attached processes and
//! workers (for nested tasks) share.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mizu_queue::{OwnedDeque, OwnedProducer, SlotState};

use crate::error::{PoolError, Result, TaskError};
use crate::layout::{PoolView, TaskId, wstate};
use crate::records;
use crate::shared::{Fill, Shared};

/// Why collecting a result did not return it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollectError {
    /// Not finished within the timeout; the handle stays valid.
    #[error("the task did not finish within the timeout")]
    Timeout,
    /// The task finished without a result.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// The result was already collected through this handle.
    #[error("the result was already collected")]
    AlreadyCollected,
}

struct Inner {
    /// Our rings, by worker (a worker's own record has rings to a few workers only).
    producers: Vec<Option<OwnedProducer>>,
    /// Worker queues with written but unpublished task ids (batched submission).
    pending: Vec<bool>,
    /// The last task id pushed to each worker queue (0: none).
    last: Vec<u64>,
    next_worker: usize,
    next_slot: usize,
    /// The wide slot to look at next (see [`SubmitterCore::slot_for`]).
    next_wide: usize,
    /// A worker's own deque, for its nested submissions (see [`SubmitterCore::for_worker`]).
    deque: Option<OwnedDeque>,
    /// Task ids pushed to `deque` and not yet announced to idle workers (batches).
    deque_unannounced: usize,
}

/// One submitter of a pool in this process (thread-safe).
pub struct SubmitterCore {
    inner: Mutex<Inner>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) index: usize,
    pub(crate) spin: Duration,
    /// The spin budget (ns) the last wait for an outcome ended with: the next wait starts
    /// from it, so a caller collecting long tasks one after another stops spinning the full
    /// `spin` on each (a map of millisecond chunks spent a sixth of the caller's time there,
    /// taken from the workers on a 2-CPU machine), while one in a fast stream keeps the full
    /// budget (an outcome caught while spinning restores it).
    pub(crate) learned_spin: AtomicU64,
    /// Whether a wait may watch (see [`crate::watch`], which also keeps worker processes from
    /// watching): cleared by a watch that the task outlasted, set again by an outcome that
    /// came sooner than a watch lasts. Never with a zero `spin`.
    pub(crate) watch_pays: AtomicBool,
    /// Waits for outcomes that ended while watching, and times such waits slept.
    pub(crate) watched: AtomicU64,
    pub(crate) parks: AtomicU64,
    /// Whether a thread of this process waits on the submitter's aimed word (one may).
    pub(crate) aimed_taken: AtomicBool,
    /// Whether this submitter woke a sleeping worker since one of its waits last parked (see
    /// [`SubmitterCore::before_parking`]).
    pub(crate) woke: AtomicBool,
    pub(crate) last_freed: std::sync::atomic::AtomicUsize,
    /// The thread that owns `Inner::deque` (only it may push there).
    pub(crate) owner: Option<std::thread::ThreadId>,
}

impl SubmitterCore {
    /// The submitter with record `index` of the pool in `shared`.
    pub fn new(shared: Arc<Shared>, index: usize, spin: Duration) -> Result<Arc<Self>> {
        let v = shared.view();
        let producers: Vec<Option<OwnedProducer>> = (0..v.params.max_workers as usize)
            .map(|w| {
                if !v.has_ring(index, w) {
                    return Ok(None);
                }
                // SAFETY: ring (index, w) has one producer: the holder of submitter record
                // `index` (taken by CAS, or held by role), which makes one SubmitterCore.
                unsafe {
                    OwnedProducer::new(shared.segment_arc(), |s| {
                        PoolView::for_handle(s).and_then(|pv| pv.ring(index, w))
                    })
                }
                .map(Some)
            })
            .collect::<Result<_>>()?;
        v.submitter(index)
            .rec
            .hold(std::process::id(), shared.segment().me().nonce);
        Ok(Arc::new(SubmitterCore {
            inner: Mutex::new(Inner {
                pending: vec![false; producers.len()],
                last: vec![0; producers.len()],
                producers,
                next_worker: 0,
                next_slot: 0,
                next_wide: 0,
                deque: None,
                deque_unannounced: 0,
            }),
            shared,
            index,
            spin,
            learned_spin: AtomicU64::new(spin.as_nanos() as u64),
            watch_pays: AtomicBool::new(!spin.is_zero()),
            watched: AtomicU64::new(0),
            parks: AtomicU64::new(0),
            aimed_taken: AtomicBool::new(false),
            woke: AtomicBool::new(false),
            last_freed: std::sync::atomic::AtomicUsize::new(usize::MAX),
            owner: None,
        }))
    }

    /// The submitter of worker `slot`'s nested tasks, called on the thread that runs its
    /// tasks: what that thread submits goes to the worker's own deque, where the worker pops
    /// it (when it helps while it collects, or next) and idle workers steal it. Other threads,
    /// and a full deque, use the rings.
    pub(crate) fn for_worker(
        shared: Arc<Shared>,
        slot: usize,
        spin: Duration,
    ) -> Result<Arc<Self>> {
        let mut core = Arc::into_inner(SubmitterCore::new(shared, 1 + slot, spin)?)
            .expect("a new submitter is not shared yet");
        let d = OwnedDeque::new(core.shared.segment_arc(), |s| {
            PoolView::for_handle(s).and_then(|pv| pv.deque(slot))
        })?;
        core.inner
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .deque = Some(d);
        core.owner = Some(std::thread::current().id());
        Ok(Arc::new(core))
    }

    /// The shared pool state.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// This submitter's record index.
    pub fn index(&self) -> usize {
        self.index
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Submits one task; blocks only while every worker's queue from us is full (at most
    /// `timeout`).
    pub fn submit(self: &Arc<Self>, payload: &dyn Fill, timeout: Option<Duration>) -> Result<Task> {
        self.shared.origin.check()?;
        let mut g = self.lock();
        let id = self.stage(&mut g, payload)?;
        if let Err(e) = self.push(&mut g, id, timeout, false) {
            self.unstage(id);
            return Err(e);
        }
        Ok(Task {
            core: self.clone(),
            id,
            done: false,
        })
    }

    /// Submits several tasks with one publication per worker queue.
    pub fn submit_batch<'p>(
        self: &Arc<Self>,
        payloads: impl IntoIterator<Item = &'p dyn Fill>,
        timeout: Option<Duration>,
    ) -> Result<Vec<Task>> {
        let (tasks, res) = self.submit_batch_partial(payloads, timeout);
        res.map(|()| tasks)
    }

    /// [`SubmitterCore::submit_batch`] that keeps what was submitted before an error (e.g.
    /// every slot taken): those tasks are returned with the error, so the caller can collect
    /// some and submit the rest.
    pub fn submit_batch_partial<'p>(
        self: &Arc<Self>,
        payloads: impl IntoIterator<Item = &'p dyn Fill>,
        timeout: Option<Duration>,
    ) -> (Vec<Task>, Result<()>) {
        if let Err(e) = self.shared.origin.check() {
            return (Vec::new(), Err(e));
        }
        let mut g = self.lock();
        let _staging = Staging::new(&self.shared.view().submitter(self.index).rec.staging);
        let mut tasks = Vec::new();
        let mut res = Ok(());
        for p in payloads {
            let id = match self.stage(&mut g, p) {
                Ok(id) => id,
                Err(e) => {
                    res = Err(e);
                    break;
                }
            };
            if let Err(e) = self.push(&mut g, id, timeout, true) {
                self.unstage(id);
                res = Err(e);
                break;
            }
            tasks.push(Task {
                core: self.clone(),
                id,
                done: false,
            });
        }
        // One publication and at most one wake per worker queue for the whole batch (before
        // `_staging` ends: a worker that reads it ended finds the tasks queued).
        self.flush(&mut g);
        (tasks, res)
    }

    /// Publishes every deferred queue write and wakes those workers (if they sleep).
    fn flush(&self, g: &mut Inner) {
        let v = self.shared.view();
        let n = std::mem::take(&mut g.deque_unannounced);
        self.announce(n);
        for w in 0..g.pending.len() {
            if std::mem::take(&mut g.pending[w])
                && let Some(p) = &mut g.producers[w]
            {
                p.with(|p| p.publish_quiet());
                self.note_wake(records::wake_for_work(v.worker(w)));
            }
        }
    }

    /// Remembers that a push woke a sleeping worker (`woke`), for the next wait that parks.
    #[inline]
    fn note_wake(&self, woke: bool) {
        if woke && !self.woke.load(Ordering::Relaxed) {
            self.woke.store(true, Ordering::Relaxed);
        }
    }

    /// Finds a free slot, writes the payload, publishes `Pending`.
    fn stage(&self, g: &mut Inner, payload: &dyn Fill) -> Result<TaskId> {
        let v = self.shared.view();
        if v.stopped() {
            return Err(PoolError::Stopped);
        }
        let k = self.slot_for(g, payload.size())?;
        let hdr = v.task(self.index, k);
        let (generation, _) = hdr.state.load();
        self.shared.write_payload_with(self.index, k, payload)?;
        hdr.reason.store(0, Ordering::Relaxed);
        hdr.runner.store(0, Ordering::Relaxed);
        hdr.abandoned.store(0, Ordering::Relaxed);
        hdr.state
            .transition(generation, SlotState::Free, SlotState::Pending)
            .map_err(|e| {
                PoolError::Layout(format!("slot {k} changed under its submitter: {e:?}"))
            })?;
        // Only this submitter writes it, under its lock: no locked read-modify-write needed
        // on every submit.
        let submitted = &v.submitter(self.index).rec.submitted;
        submitted.store(submitted.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        Ok(TaskId {
            submitter: self.index,
            slot: k,
            generation,
        })
    }

    /// A free slot for a payload of `len` bytes: the one freed last (its lines are hot) if
    /// its data area holds the payload, else a wide slot for a payload only a wide one holds
    /// (a few looked at, so that a stream of them with every wide slot taken does not walk
    /// them all each time), else the next free one. A task in a wide slot also has room for
    /// an outcome of up to `wide_bytes` inline, so a small payload moves to a free wide slot
    /// when the one freed last is narrow: a caller with a few tasks in flight ends up using
    /// only wide slots.
    fn slot_for(&self, g: &mut Inner, len: usize) -> Result<usize> {
        /// Wide slots looked at for a payload that needs one.
        const WIDE_PROBES: usize = 4;
        let v = self.shared.view();
        let n = v.slots_of(self.index);
        let wide = v.wide_of(self.index);
        let needs_wide = len > v.params.slot_bytes as usize && len <= v.params.wide_bytes as usize;
        let free = |k: usize| v.task(self.index, k).state.load().1 == Some(SlotState::Free);
        let first = self.last_freed.swap(usize::MAX, Ordering::Relaxed);
        if first < n && (first < wide || wide == 0) && free(first) {
            return Ok(first);
        }
        if wide > 0 {
            // Any other payload looks at one, and only when a task was just freed (a caller
            // collecting as it submits, not one filling the slots with a batch).
            let probes = match () {
                _ if needs_wide => WIDE_PROBES.min(wide),
                _ if first < n => 1,
                _ => 0,
            };
            if let Some(k) = (0..probes)
                .map(|i| (g.next_wide + i) % wide)
                .find(|&k| free(k))
            {
                g.next_wide = k + 1;
                return Ok(k);
            }
        }
        let k = std::iter::once(first)
            .filter(|&k| k < n)
            .chain((0..n).map(|i| (g.next_slot + i) % n))
            .find(|&k| free(k))
            .ok_or(PoolError::SlotsExhausted(n))?;
        g.next_slot = k + 1;
        Ok(k)
    }

    /// Undoes a stage whose push failed.
    fn unstage(&self, id: TaskId) {
        if self.cancel(id) {
            reclaim_if_final(&self.shared, id);
        }
    }

    /// Tells up to `n` idle workers that our worker's deque holds work.
    fn announce(&self, n: usize) {
        let v = self.shared.view();
        crate::records::announce(v.workers(), self.index.checked_sub(1), n);
    }

    /// Puts the task id on a worker's queue: on the thread running a worker's tasks, that
    /// worker's own deque; else an idle worker first, else any live one with room; one
    /// publication and at most one wake syscall (only if that worker sleeps).
    fn push(
        &self,
        g: &mut Inner,
        id: TaskId,
        timeout: Option<Duration>,
        defer: bool,
    ) -> Result<usize> {
        let v = self.shared.view();
        let word = id.pack();
        if let Some(d) = &g.deque
            && self.owner == Some(std::thread::current().id())
            && push_own(&d.get(), v, word)
        {
            if defer {
                g.deque_unannounced += 1;
            } else {
                self.announce(1);
            }
            return Ok(self.index - 1);
        }
        let nw = v.params.max_workers as usize;
        // Read the clock only once there is something to wait for (a read costs ~30 ns).
        let mut start = None;
        loop {
            // An idle worker that spins (no wake needed) first; then one that has taken
            // everything we gave it and is between two tasks or finishing one whose outcome
            // is already out (it looks at its queues next: a round trip finds the worker that
            // ran the previous task there, and waking a sleeping one instead would cost
            // microseconds); then any idle one; then any.
            // In a batch, an idle worker that already got part of it counts as busy: the
            // batch is spread over every worker instead of filling the queue of the one that
            // happened to spin (the others would only get work by stealing, after an idle
            // slice).
            for pass in 0..4 {
                for i in 0..nw {
                    let w = (g.next_worker + i) % nw;
                    if pass < 3 && defer && g.pending[w] {
                        continue;
                    }
                    let rec = &v.worker(w).rec;
                    let st = rec.state.load(Ordering::Acquire);
                    let ok = match pass {
                        0 => {
                            st == wstate::READY
                                && rec.idle.load(Ordering::Relaxed) == 1
                                && v.worker(w).park.sleepers() == 0
                        }
                        1 => {
                            st == wstate::READY
                                && rec.idle.load(Ordering::Relaxed) == 0
                                && !pending(v, g.last[w])
                                && finishing(v, rec.current.load(Ordering::Acquire))
                        }
                        // (A worker woken for a task reads busy from then on — see
                        // `records::wake_for_work` — so a stream's next task goes elsewhere.)
                        2 => st == wstate::READY && rec.idle.load(Ordering::Relaxed) != 0,
                        _ => wstate::coming(st),
                    };
                    if !ok {
                        continue;
                    }
                    let Some(producer) = &mut g.producers[w] else {
                        continue;
                    };
                    let written = producer.with(|p| {
                        let ok = p
                            .write_with(|b| {
                                b[..8].copy_from_slice(&word.to_le_bytes());
                                8
                            })
                            .is_ok();
                        if ok && !defer {
                            p.publish_quiet();
                        }
                        ok
                    });
                    if written {
                        g.last[w] = word;
                        if defer {
                            g.pending[w] = true;
                        } else {
                            self.note_wake(records::wake_for_work(v.worker(w)));
                        }
                        // A single task's next search starts at this worker: round trips keep
                        // to one worker, whose spin budget stays warm (moving on would leave
                        // it to cool and park, then wake the next one, every time). Batches
                        // and busy pools move on, to spread the work.
                        g.next_worker = if defer || pass == 3 { w + 1 } else { w };
                        return Ok(w);
                    }
                }
            }
            // Never wait for space with our own writes unpublished: the workers could not
            // drain what they cannot see.
            self.flush(g);
            if v.stopped() {
                return Err(PoolError::Stopped);
            }
            let start = *start.get_or_insert_with(Instant::now);
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return Err(PoolError::SubmitTimeout(timeout.unwrap_or_default()));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Says a batch is being staged (`SubmitterRec::staging`) until dropped, on every way out.
struct Staging<'a>(&'a mizu_shm::sync::AtomicU64);

impl<'a> Staging<'a> {
    fn new(word: &'a mizu_shm::sync::AtomicU64) -> Self {
        word.store(1, Ordering::Relaxed);
        Staging(word)
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

/// Cancels a task that has not started; true if it will never run.
pub(crate) fn cancel(shared: &Shared, id: TaskId) -> bool {
    let hdr = shared.view().task(id.submitter, id.slot);
    if crate::claim::cancel(hdr, id.generation) {
        shared.discard_payload(id.submitter, id.slot);
        // Another thread may wait for it (a thread waiting for any outcome is woken too).
        shared.view().submitter(id.submitter).wake_every();
        true
    } else {
        false
    }
}

/// Drops interest in a task: a queued one never runs, and its slot is freed as soon as it is
/// final, by the caller or by the worker that finishes it.
pub(crate) fn abandon(shared: &Shared, id: TaskId) {
    cancel(shared, id);
    let hdr = shared.view().task(id.submitter, id.slot);
    if mizu_queue::abandon(&hdr.state, &hdr.abandoned, id.generation).is_some() {
        free_claimed(shared, id);
    }
}

/// Frees a task's slot if it is final (nobody will collect it).
pub(crate) fn reclaim_if_final(shared: &Shared, id: TaskId) {
    let hdr = shared.view().task(id.submitter, id.slot);
    if mizu_queue::claim_final(&hdr.state, id.generation).is_some() {
        free_claimed(shared, id);
    }
}

/// The worker's half of the abandon handshake, after the task went final.
pub(crate) fn reclaim_if_abandoned(shared: &Shared, id: TaskId) {
    let hdr = shared.view().task(id.submitter, id.slot);
    if mizu_queue::after_finish(&hdr.state, &hdr.abandoned, id.generation).is_some() {
        free_claimed(shared, id);
    }
}

/// Releases the payload of a slot this caller moved to `Collected`, then frees the slot.
pub(crate) fn free_claimed(shared: &Shared, id: TaskId) {
    shared.discard_payload(id.submitter, id.slot);
    let _ = shared
        .view()
        .task(id.submitter, id.slot)
        .state
        .free(id.generation);
}

/// A submitted task. Dropping it uncollected frees its slot (now, or when it finishes).
pub struct Task {
    pub(crate) core: Arc<SubmitterCore>,
    pub(crate) id: TaskId,
    pub(crate) done: bool,
}

/// The state of the task with id word `word`, if that task is still in its slot.
fn state_of(v: &crate::layout::PoolView<'_>, word: u64) -> Option<Option<SlotState>> {
    let (s, k, g32) = TaskId::unpack(word)?;
    if s >= v.params.submitters as usize || k >= v.slots_of(s) {
        return None;
    }
    let (g, st) = v.task(s, k).state.load();
    (g as u32 == g32).then_some(st)
}

/// Pushes `word` on a worker's own deque (on the thread running its tasks). A full deque is
/// first rid of the ids of tasks no longer queued (cancelled while there): a task that
/// cancels the nested tasks it no longer wants (the rest of a search, say) leaves their ids
/// behind, and once they filled the deque and the worker's rings, its next submission found
/// nowhere to go — with no other worker to drain them, for ever. Live ids alone never fill it
/// (it has room for every slot of the worker's record).
fn push_own(d: &mizu_queue::Deque<'_>, v: &crate::layout::PoolView<'_>, word: u64) -> bool {
    d.push(word).is_ok() || (d.retain(|w| pending(v, w)) > 0 && d.push(word).is_ok())
}

/// Whether the task with id word `word` (0: none) waits in a queue.
fn pending(v: &crate::layout::PoolView<'_>, word: u64) -> bool {
    state_of(v, word).is_some_and(|st| st == Some(SlotState::Pending))
}

/// Whether a worker whose claim record reads `current` runs no task, or one whose outcome is
/// already out (it is in the few hundred nanoseconds after a reply).
fn finishing(v: &crate::layout::PoolView<'_>, current: u64) -> bool {
    current == 0 || state_of(v, current).is_none_or(|st| st.is_some_and(|st| st.is_final()))
}
