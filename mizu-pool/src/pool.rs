//! The controller: creates the pool segment, launches workers, watches them (death → reap →
//! respawn; execution timeout → kill), stops and tears down.

use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_buffer::Buffer;
use mizu_queue::SlotState;

use crate::claim;
use crate::error::{PoolError, Result};
use crate::layout::{self, Params, reason, wstate};
use crate::shared::Shared;
use crate::submitter::{CollectError, SubmitterCore, Task};
use crate::worker::reap_worker;

mod workers;
pub use workers::Launcher;
pub(crate) use workers::exited;
use workers::{Bell, Children};

/// Pool settings; [`PoolConfig::validate`] explains what is wrong.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Workers started now.
    pub workers: usize,
    /// Worker slots (≥ `workers`; room to spawn more later). 0 means `workers`.
    pub max_workers: usize,
    /// Start workers beyond `workers`, up to `max_workers`, as work needs them: whenever a
    /// submission leaves this controller more tasks in flight (submitted, not yet collected)
    /// than workers running or starting. An idle worker is so reused before another starts
    /// (`ProcessPoolExecutor`'s behaviour since Python 3.9).
    pub on_demand: bool,
    /// Submitter records for other processes that attach by token.
    pub extra_submitters: usize,
    /// In-flight task slots of this controller and of each process that attaches.
    pub slots: u32,
    /// In-flight task slots of each worker's own tasks (nested submissions; at most
    /// `slots`, and fewer in pools of more than 32 worker slots: see `geometry.rs`). More wait
    /// for room as any submission does (`retry`). Each slot costs its 128-byte header and
    /// `slot_bytes` of `/dev/shm` in every worker record, so a pool of many workers stays
    /// small where `/dev/shm` is (a container's 64 MiB).
    pub nested_slots: u32,
    /// Bytes a task payload may have to travel inline (larger ones use data segments).
    pub slot_bytes: u32,
    /// How many of each submitter's slots (the first ones, at most `slots`) have a data area
    /// of `wide_bytes`: a payload (an input or an outcome) of up to that size in one of them
    /// travels inline rather than through a data segment region, which costs ~1 µs each way.
    /// The submitter puts such inputs there when one is free, and a submitter with a few
    /// tasks in flight uses them for every task (so mid-size outcomes are inline too).
    pub wide_slots: u32,
    /// Bytes of a wide slot's data area.
    pub wide_bytes: u32,
    /// Task ids each submitter may queue per worker (the controller and attached processes;
    /// fewer in pools of more than 64 worker slots: see `geometry.rs`). A worker's own nested
    /// tasks go to its deque; its rings, to a few workers, hold 16.
    pub ring_capacity: u32,
    /// How long a waiting side spins before it parks.
    pub spin: Duration,
    /// Kill and replace a worker whose task runs longer than this.
    pub exec_timeout: Option<Duration>,
    /// Replace workers that die.
    pub respawn: bool,
    /// How long to wait for launched workers to join.
    pub start_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            workers: mizu_shm::affinity::available_cpus_all().len().max(1),
            max_workers: 0,
            on_demand: false,
            extra_submitters: 4,
            slots: 1024,
            nested_slots: 256,
            slot_bytes: 256,
            wide_slots: 16,
            wide_bytes: 4096,
            ring_capacity: 256,
            spin: Duration::from_micros(50),
            exec_timeout: None,
            respawn: true,
            start_timeout: Duration::from_secs(60),
        }
    }
}

/// The most workers a pool can have (`PoolConfig::max_workers`).
pub const MAX_WORKERS: usize = 1024;
/// The most task slots a submitter can have (`PoolConfig::slots`; a task id has 20 bits for
/// the slot).
pub const MAX_SLOTS: u32 = 1 << 20;

impl PoolConfig {
    /// Checks every field; the message names the field and the accepted range.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(PoolError::Config(m));
        let maxw = self.max_workers.max(self.workers);
        if self.workers == 0 || maxw > MAX_WORKERS {
            return bad(format!(
                "workers must be 1..={MAX_WORKERS} (max_workers {maxw})"
            ));
        }
        if maxw + 1 + self.extra_submitters >= 1 << 11 {
            return bad("max_workers + extra_submitters must stay below 2047".into());
        }
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return bad(format!("slots must be 1..={MAX_SLOTS}, got {}", self.slots));
        }
        if self.nested_slots == 0 {
            return bad("nested_slots must be at least 1".into());
        }
        if self.slot_bytes < 128 || !self.slot_bytes.is_multiple_of(64) || self.slot_bytes > 1 << 20
        {
            return bad(format!(
                "slot_bytes must be a multiple of 64 in 128..=1048576, got {}",
                self.slot_bytes
            ));
        }
        if self.wide_bytes < self.slot_bytes
            || !self.wide_bytes.is_multiple_of(64)
            || self.wide_bytes > 1 << 20
        {
            return bad(format!(
                "wide_bytes must be a multiple of 64 in slot_bytes ({})..=1048576, got {}",
                self.slot_bytes, self.wide_bytes
            ));
        }
        if !self.ring_capacity.is_power_of_two() || self.ring_capacity > 1 << 20 {
            return bad(format!(
                "ring_capacity must be a power of two up to 2^20, got {}",
                self.ring_capacity
            ));
        }
        if self.spin > Duration::from_millis(100) {
            return bad("spin must be at most 100 ms".into());
        }
        Ok(())
    }
}

/// One worker as the status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStatus {
    /// Slot.
    pub slot: usize,
    /// Process id (0 if none; a worker still starting shows the process launched for it).
    pub pid: u32,
    /// `starting`, `ready`, `exiting`, `dead` or `empty`.
    pub state: &'static str,
    /// Whether it is running a task now.
    pub busy: bool,
    /// Tasks run.
    pub tasks: u64,
    /// Tasks stolen.
    pub steals: u64,
    /// Times it slept in the kernel.
    pub parks: u64,
    /// Whether it sleeps in the kernel now.
    pub asleep: bool,
}

/// One submitter's task slots as the status reports them: the controller (index 0), a
/// worker's nested tasks (index 1 + its slot), an attached process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitterStatus {
    /// Submitter record index.
    pub index: usize,
    /// Process id of the submitter (0 if none yet).
    pub pid: u32,
    /// Tasks waiting to run.
    pub queued: usize,
    /// Tasks running.
    pub running: usize,
    /// Finished tasks whose outcome nobody has taken yet.
    pub finished: usize,
}

/// A snapshot of the pool.
#[derive(Debug, Clone)]
pub struct PoolStatus {
    /// Every worker slot that was ever used.
    pub workers: Vec<WorkerStatus>,
    /// Every submitter that ever attached, or that holds task slots.
    pub submitters: Vec<SubmitterStatus>,
    /// Tasks submitted by this controller.
    pub submitted: u64,
    /// Tasks collected by this controller.
    pub collected: u64,
    /// Workers replaced after dying.
    pub respawns: u64,
    /// This controller's waits for outcomes that ended while it watched for them (see
    /// [`crate::WATCH`]).
    pub watched: u64,
    /// Times this controller's waits for outcomes slept in the kernel.
    pub parks: u64,
}

/// The next [`Pool::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A pool of worker processes; this process is its controller and first submitter.
pub struct Pool {
    core: Arc<SubmitterCore>,
    shared: Arc<Shared>,
    children: Arc<Mutex<Children>>,
    launcher: Launcher,
    stopping: Arc<AtomicBool>,
    /// This pool's number in this process (the key of its kept copies, `repeats`).
    id: u64,
    /// Workers that died on their own (not retired, recycled, timed out or stopped).
    deaths: Arc<AtomicU64>,
    monitor: Option<JoinHandle<()>>,
    cfg: PoolConfig,
    /// An on-demand pool with slots not started yet ([`PoolConfig::on_demand`]).
    may_grow: AtomicBool,
    /// Held while a worker is started on demand (two submitters must not pick one slot).
    growing: Mutex<()>,
    /// Submissions that failed before reaching a queue ([`Pool::submission_failed`]).
    unqueued: AtomicU64,
}

impl Pool {
    /// Creates the pool and waits until its workers have joined.
    pub fn new(cfg: PoolConfig, launcher: Launcher) -> Result<Pool> {
        Self::new_interruptible(cfg, launcher, &mut || true)
    }

    /// [`Pool::new`] that asks `keep_waiting` every 50 ms or so, while the workers start,
    /// whether to go on (a binding checks for Ctrl-C there: a worker importing a large program
    /// can take seconds). `false` stops what was started and returns
    /// [`PoolError::Interrupted`].
    pub fn new_interruptible(
        cfg: PoolConfig,
        launcher: Launcher,
        keep_waiting: &mut dyn FnMut() -> bool,
    ) -> Result<Pool> {
        cfg.validate()?;
        // What dead pools left (a controller killed together with its workers has nobody
        // left to clean up): only segments whose owner's lock says it is gone.
        mizu_wire::ledger::release_dead(None);
        let _ = mizu_shm::prune();
        let maxw = cfg.max_workers.max(cfg.workers);
        let me = mizu_shm::liveness::current()?;
        let sized = crate::geometry::scaled(
            maxw as u32,
            cfg.slots,
            cfg.nested_slots,
            cfg.wide_slots,
            cfg.ring_capacity,
        );
        let params = Params {
            magic: 0,
            max_workers: maxw as u32,
            submitters: (1 + maxw + cfg.extra_submitters) as u32,
            slots: cfg.slots,
            nested_slots: sized.nested_slots,
            slot_bytes: cfg.slot_bytes,
            wide_slots: cfg.wide_slots.min(cfg.slots),
            nested_wide_slots: sized.nested_wide_slots,
            wide_bytes: cfg.wide_bytes,
            ring_capacity: sized.ring_capacity,
            nested_ring_capacity: sized.nested_ring_capacity,
            nested_ring_span: sized.nested_ring_span,
            spin_us: cfg.spin.as_micros() as u32,
            timed: u32::from(cfg.exec_timeout.is_some()),
            deque_capacity: sized.nested_slots.next_power_of_two(),
            controller: me.id(),
        };
        // A full /dev/shm: what this process keeps idle goes, and the others' janitors give
        // theirs back, for a moment; then the binding's garbage is collected.
        let seg = crate::pressure::with_room(
            || layout::create(params),
            |e| matches!(e, PoolError::Shm(mizu_shm::ShmError::NoSpace { .. })),
        )?;
        let shared = Shared::new(seg)?;
        let core = SubmitterCore::new(shared.clone(), 0, cfg.spin)?;
        let children = Arc::new(Mutex::new(Children {
            procs: (0..maxw).map(|_| None).collect(),
            pidfds: vec![None; maxw],
            bell: Arc::new(Bell::new()),
            kill_reason: vec![0; maxw],
            respawns: 0,
            launched: Vec::new(),
        }));
        let mut pool = Pool {
            core,
            shared,
            children,
            launcher,
            stopping: Arc::new(AtomicBool::new(false)),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            deaths: Arc::new(AtomicU64::new(0)),
            monitor: None,
            may_grow: AtomicBool::new(cfg.on_demand && maxw > cfg.workers),
            growing: Mutex::new(()),
            unqueued: AtomicU64::new(0),
            cfg,
        };
        for slot in 0..pool.cfg.workers {
            pool.launch(slot)?;
        }
        if let Err(e) = pool.wait_ready(0..pool.cfg.workers, keep_waiting) {
            if matches!(e, PoolError::Interrupted) {
                // Workers still starting would only see the stop once they joined.
                pool.stop(Duration::ZERO);
            }
            return Err(e);
        }
        pool.start_monitor();
        Ok(pool)
    }

    /// This process's data segments for the pool (where large payloads go): for regions the
    /// caller fills or hands out itself, such as a map's output written by the workers.
    pub fn data_pool(&self) -> &mizu_wire::DataPool {
        &self.shared.data_pool
    }

    /// This pool's number, unique in this process (the key of the copies `repeats` keeps for
    /// it).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The token other processes use to attach (workers, extra submitters).
    pub fn token(&self) -> &str {
        self.shared.segment().token()
    }

    /// Submits a task (opaque bytes for the workers' executor).
    pub fn submit(&self, payload: &[u8]) -> Result<Task> {
        self.grown(self.core.submit(&payload, None))
    }

    /// Submits a payload that writes itself in place (see [`crate::Fill`]); `timeout` bounds the
    /// wait for queue space (forever when `None`).
    pub fn submit_with(
        &self,
        payload: &dyn crate::Fill,
        timeout: Option<Duration>,
    ) -> Result<Task> {
        self.grown(self.core.submit(payload, timeout))
    }

    /// [`Pool::submit_batch`] for payloads that write themselves in place; what was submitted
    /// before an error (every slot taken, or `SubmitTimeout` after waiting `timeout` for queue
    /// space for one payload) is returned with it.
    pub fn submit_batch_with<'p>(
        &self,
        payloads: impl IntoIterator<Item = &'p dyn crate::Fill>,
        timeout: Option<Duration>,
    ) -> (Vec<Task>, Result<()>) {
        self.grown(self.core.submit_batch_partial(payloads, timeout))
    }

    /// Submits a task, waiting at most `timeout` for queue space.
    pub fn submit_timeout(&self, payload: &[u8], timeout: Duration) -> Result<Task> {
        self.grown(self.core.submit(&payload, Some(timeout)))
    }

    /// Submits several tasks with one publication (and at most one wake) per worker queue.
    pub fn submit_batch<'p>(
        &self,
        payloads: impl IntoIterator<Item = &'p [u8]>,
    ) -> Result<Vec<Task>> {
        let payloads: Vec<&[u8]> = payloads.into_iter().collect();
        self.grown(
            self.core
                .submit_batch(payloads.iter().map(|p| p as &dyn crate::Fill), None),
        )
    }

    /// Cancels the task whose id packs to `word` ([`TaskId::pack`](crate::TaskId::pack)) if
    /// no worker has started it; true if it will never run. For a caller without the task's
    /// handle (another thread holds it, waiting for the outcome): that thread is woken and
    /// finds the task cancelled. A word that names no task slot of the pool, or a slot that
    /// has gone on to another task, is false.
    pub fn cancel_packed(&self, word: u64) -> bool {
        let v = self.shared.view();
        let Some((submitter, slot, g32)) = crate::TaskId::unpack(word) else {
            return false;
        };
        if submitter >= v.submitter_count() || slot >= v.slots_of(submitter) {
            return false;
        }
        // (The slot's generation now, if its low half is the word's: 2^32 tasks cannot pass
        // through one slot while a caller holds an id of it.)
        let (generation, _) = v.task(submitter, slot).state.load();
        generation as u32 == g32
            && crate::submitter::cancel(
                &self.shared,
                crate::TaskId {
                    submitter,
                    slot,
                    generation,
                },
            )
    }

    /// Runs one task and returns its result (submit + collect).
    pub fn call(&self, payload: &[u8]) -> std::result::Result<Buffer, CollectError> {
        self.submit(payload)
            .map_err(|e| CollectError::Task(crate::TaskError::Runtime(e.to_string())))?
            .result(None)
    }

    /// Runs every input through the workers' executor as one map (see [`crate::map`]).
    pub fn map(
        &self,
        inputs: &[&[u8]],
        opts: &crate::map::MapOptions,
    ) -> std::result::Result<crate::map::MapOutput, crate::map::MapError> {
        crate::map::map(&self.core, inputs, opts, &mut || false, &mut || false)
    }

    /// [`Pool::map`] that can be stopped: `stop` is polled while waiting (every 20 ms);
    /// once it returns true, elements not started are skipped and the
    /// map ends with [`crate::map::MapError::Stopped`] (for Ctrl-C in a binding).
    pub fn map_until(
        &self,
        inputs: &[&[u8]],
        opts: &crate::map::MapOptions,
        stop: &mut dyn FnMut() -> bool,
    ) -> std::result::Result<crate::map::MapOutput, crate::map::MapError> {
        crate::map::map(&self.core, inputs, opts, &mut || false, stop)
    }

    /// A snapshot of workers and counters.
    pub fn status(&self) -> PoolStatus {
        let v = self.shared.view();
        // A worker that has not joined yet has published no pid: its process's, as launched.
        let launched: Vec<u32> = self
            .children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .procs
            .iter()
            .map(|c| c.as_ref().map_or(0, Child::id))
            .collect();
        let workers = (0..v.params.max_workers as usize)
            .filter_map(|w| {
                let r = &v.worker(w).rec;
                let state = match r.state.load(Ordering::Acquire) {
                    wstate::STARTING | wstate::JOINING => "starting",
                    wstate::READY => "ready",
                    wstate::EXITING | wstate::RECYCLE => "exiting",
                    wstate::DEAD => "dead",
                    _ => return None,
                };
                let pid = match r.pid.load(Ordering::Relaxed) {
                    0 if state == "starting" => launched.get(w).copied().unwrap_or(0),
                    p => p,
                };
                Some(WorkerStatus {
                    slot: w,
                    pid,
                    state,
                    busy: r.current.load(Ordering::Relaxed) != 0,
                    tasks: r.tasks.load(Ordering::Relaxed),
                    steals: r.steals.load(Ordering::Relaxed),
                    parks: r.parks.load(Ordering::Relaxed),
                    asleep: v.worker(w).park.sleepers() != 0,
                })
            })
            .collect();
        let submitters = (0..v.params.submitters as usize)
            .filter_map(|i| {
                let rec = &v.submitter(i).rec;
                let mut st = SubmitterStatus {
                    index: i,
                    pid: rec.pid(),
                    queued: 0,
                    running: 0,
                    finished: 0,
                };
                for k in 0..v.slots_of(i) {
                    match v.task(i, k).state.load().1 {
                        Some(SlotState::Pending) => st.queued += 1,
                        Some(SlotState::Running) => st.running += 1,
                        Some(x) if x.is_final() => st.finished += 1,
                        _ => {}
                    }
                }
                let used = st.pid != 0 || st.queued + st.running + st.finished > 0;
                used.then_some(st)
            })
            .collect();
        let s = &v.submitter(0).rec;
        let respawns = self
            .children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .respawns;
        let (watched, parks) = self.core.waits();
        PoolStatus {
            workers,
            submitters,
            submitted: s.submitted.load(Ordering::Relaxed),
            collected: s.collected.load(Ordering::Relaxed),
            respawns,
            watched,
            parks,
        }
    }

    /// How many workers died on their own so far: killed, crashed or exited while serving —
    /// not retired, recycled after their task quota, killed for the execution timeout or
    /// stopped. A binding that treats a death as fatal (as `ProcessPoolExecutor` does) compares
    /// it with the count it saw before.
    pub fn deaths(&self) -> u64 {
        self.deaths.load(Ordering::Acquire)
    }

    /// Stops the pool: queued tasks are cancelled, workers are asked to leave and killed if
    /// they have not within `grace`, running tasks fail, every collector wakes, the segment
    /// name is removed.
    ///
    /// Everything the pool's workers left goes with it: the references their ledgers list
    /// are given back, their leftover segments and lock files are removed, and the data
    /// segments this process kept idle for reuse are given back at once. In a forked child
    /// of the pool's process this does nothing (the workers are the parent's).
    pub fn stop(&mut self, grace: Duration) {
        if !self.shared.origin.is_here() || self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        let v = self.shared.view();
        v.set_stop();
        for s in 0..v.params.submitters as usize {
            for k in 0..v.slots_of(s) {
                let hdr = v.task(s, k);
                let (g, st) = hdr.state.load();
                if st == Some(SlotState::Pending) && claim::stop_pending(hdr, g) {
                    self.shared.discard_payload(s, k);
                }
            }
        }
        for w in 0..v.params.max_workers as usize {
            v.worker(w).park.wake_all_unconditionally();
        }
        if let Some(m) = self.monitor.take() {
            self.children
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .bell
                .ring();
            let _ = m.join();
        }
        let deadline = Instant::now() + grace;
        let mut ch = self.children.lock().unwrap_or_else(|p| p.into_inner());
        for (w, c) in ch.procs.iter_mut().enumerate() {
            let Some(child) = c.as_mut() else { continue };
            loop {
                if exited(child) {
                    break;
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            reap_worker(&self.shared, w, child.id(), reason::STOPPED);
            v.worker(w).rec.state.store(wstate::DEAD, Ordering::Release);
            *c = None;
        }
        for s in 0..v.params.submitters as usize {
            v.submitter(s).park.wake_all_unconditionally();
            v.submitter(s).aimed.wake();
        }
        // Inputs are moot now; a killed worker may have held references to some (they would
        // keep the names forever). Results live in the workers' segments, not here.
        self.shared.data_pool.unlink_all();
        let _ = self.shared.segment().unlink();
        let workers = ch.launched.clone();
        drop(ch);
        // Only this pool's workers' leftovers: other programs may have data in flight.
        mizu_wire::ledger::release_dead(Some(&workers));
        let _ = mizu_shm::prune_of(&workers);
        // What this process kept mapped only for reuse goes now, not seconds later: after a
        // stop nothing of the pool's is left in /dev/shm (what views still read stays).
        mizu_wire::store::give_back_idle_now();
        crate::repeats::release(self.id);
    }

    /// `Err(PoolError::Forked)` when called in a forked child of the pool's process.
    pub fn check_origin(&self) -> Result<()> {
        self.shared.origin.check()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.shared.origin.is_here() {
            self.stop(Duration::from_secs(5));
        } else {
            // A forked child's copy: the workers, the segment and the data segments are the
            // parent's. Extra references that are never dropped keep every shared thing from
            // being torn down here; the monitor thread does not exist in this process.
            std::mem::forget(self.shared.clone());
            std::mem::forget(self.core.clone());
            std::mem::forget(self.children.clone());
            std::mem::forget(self.monitor.take());
        }
    }
}
