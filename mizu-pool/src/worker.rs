//! The worker side: join a pool by token, claim tasks crash-safely, run them through an
//! [`Executor`], help with other work while a nested collect waits.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mizu_queue::{OwnedConsumer, OwnedDeque, SlotState};
use mizu_shm::{DeathWatch, WaitError, Waiter};

use crate::claim;
use crate::context::{Executor, TaskContext, execute_current};
use crate::error::{PoolError, Result};
use crate::layout::{PoolView, TaskId, now_ns, wstate};
use crate::records::{self, idle};
use crate::shared::Shared;
use crate::submitter::{SubmitterCore, abandon, free_claimed, reclaim_if_abandoned};

pub(crate) mod placement;
mod steal;

struct Runtime<'e> {
    consumers: RefCell<Vec<OwnedConsumer>>,
    /// Every worker's deque (ours at `slot`).
    deques: Vec<OwnedDeque>,
    sub: Arc<SubmitterCore>,
    shared: Arc<Shared>,
    exec: &'e dyn Executor,
    slot: usize,
    pid: u32,
    next_ring: Cell<usize>,
    next_deque: Cell<usize>,
    /// Where the next walk of a submitter's slots starts (the slot after the last task found
    /// there): a submitter stages tasks in consecutive slots, so the next unclaimed one is
    /// usually just after the last, and stealing a run of them does not walk every slot
    /// before them each time.
    scan_from: RefCell<Vec<usize>>,
    /// The word of the task this worker runs now (0 when none): the claim record a task it
    /// helps with inside that task's nested collect puts back. Kept here, not read from the
    /// shared record, whose line submitters read between two tasks.
    running: Cell<u64>,
}

impl Runtime<'_> {
    fn retired(&self) -> bool {
        self.shared
            .view()
            .worker(self.slot)
            .rec
            .state
            .load(Ordering::Acquire)
            != wstate::READY
    }

    /// Takes the next task id from this worker's queues (its own deque first: nested tasks it
    /// submitted, newest first) and runs it.
    fn run_one(&self) -> bool {
        loop {
            // Only we push there, so "empty" is exact for us; and `pop` costs a full fence.
            let own = self.deques[self.slot].get();
            let popped = if own.is_empty() { None } else { own.pop() };
            let word = if popped.is_some() {
                popped
            } else {
                let mut cs = self.consumers.borrow_mut();
                let n = cs.len();
                let start = self.next_ring.get();
                let mut got = None;
                for i in 0..n {
                    let s = (start + i) % n;
                    if let Some(w) = cs[s].with(|c| {
                        c.try_recv_with(|m| u64::from_le_bytes(m[..8].try_into().unwrap_or([0; 8])))
                    }) {
                        self.next_ring.set(s + 1);
                        got = Some(w);
                        break;
                    }
                }
                got
            };
            match word {
                None => return false,
                Some(w) => {
                    if self.try_run(w) {
                        return true;
                    }
                    // A stale or already-claimed id: look at the next one.
                }
            }
        }
    }

    /// Claims (crash-safely) and runs the task `word` names; false if it is not claimable.
    fn try_run(&self, word: u64) -> bool {
        let v = self.shared.view();
        let Some((s, k, _)) = TaskId::unpack(word) else {
            return false;
        };
        if s >= v.params.submitters as usize || k >= v.slots_of(s) {
            return false;
        }
        let hdr = v.task(s, k);
        let rec = &v.worker(self.slot).rec;
        let started = (v.params.timed != 0).then(now_ns);
        // Set when this task is helped with from inside another's nested collect.
        let outer = self.running.get();
        let Some(g) = claim::claim(rec, hdr, word, started, outer) else {
            return false;
        };
        claim::set_runner(hdr, ((self.slot as u64) << 32) | u64::from(self.pid));
        self.running.set(word);
        let help = || self.run_one() || self.steal();
        let ctx = TaskContext::new(&self.sub, &self.shared, self.slot, &help);
        // The runtime's own failures are marked (`reason::RUNTIME`): their text is not a
        // payload the binding could decode.
        let mut runtime = false;
        let out = match self.shared.take_payload(s, k) {
            Ok(input) => {
                ctx.slot.set(Some((s, k)));
                *ctx.input.borrow_mut() = Some(input.clone());
                let r = execute_current(self.exec, &ctx, input.as_slice());
                ctx.slot.set(None);
                ctx.input.borrow_mut().take();
                r
            }
            Err(e) => {
                runtime = true;
                Err(format!("mizu: unreadable task input: {e}").into_bytes())
            }
        };
        let (bytes, ok) = match out {
            Ok(b) => (b, true),
            Err(b) => (b, false),
        };
        let written = match ctx.replied.get() {
            Some(ok) => Ok(ok),
            None => self.shared.write_payload(s, k, &bytes).map(|()| ok),
        };
        let ok = match written {
            Ok(ok) => ok,
            Err(e) => {
                let _ = self.shared.write_payload(
                    s,
                    k,
                    format!("mizu: cannot store the result: {e}").as_bytes(),
                );
                runtime = true;
                false
            }
        };
        if runtime {
            hdr.reason
                .store(crate::layout::reason::RUNTIME, Ordering::Relaxed);
        }
        claim::finish(rec, hdr, g, ok, outer);
        self.running.set(outer);
        rec.tasks.fetch_add(1, Ordering::Relaxed);
        reclaim_if_abandoned(
            &self.shared,
            TaskId {
                submitter: s,
                slot: k,
                generation: g,
            },
        );
        v.submitter(s).wake_for(k, !ok);
        true
    }

    fn any_queued(&self) -> bool {
        self.consumers
            .borrow_mut()
            .iter_mut()
            .any(|c| c.with(|c| c.poll()))
            || self.nested_queued()
    }
}

/// A stream of tasks (see [`Executor::stream_start`]), ended when the worker parks or leaves,
/// even by unwinding.
struct Stream<'e> {
    exec: &'e dyn Executor,
    active: bool,
}

impl Stream<'_> {
    fn start(&mut self) {
        if !self.active {
            self.exec.stream_start();
            self.active = true;
        }
    }

    fn end(&mut self) {
        if std::mem::take(&mut self.active) {
            self.exec.stream_end();
        }
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        self.end();
    }
}

/// Set once this process calls [`run_worker`]: from then on the controller's death watch
/// takes over from [`exit_if_orphaned_while_starting`].
/// The environment variable through which a [`Launcher`](crate::Launcher) tells a worker its
/// controller's pid.
pub(crate) const CONTROLLER_ENV: &str = "MIZU_CONTROLLER_PID";

/// For a worker process with work to do before it joins (a binding loading the caller's
/// program, which can take seconds or hang): kills this process if its parent — the
/// controller that launched it — dies meanwhile, rather than letting it live on until that
/// work ends. The watch (a thread looking at the parent pid every 100 ms) ends when
/// [`run_worker`] starts; before it joins, a worker has nothing in shared memory to clean up.
/// A controller that died before the watch began is noticed too: the launcher names it, and
/// the watch looks for it when this process's parent is someone else already.
pub fn exit_if_orphaned_while_starting() {
    let parent = rustix::process::getppid();
    let controller = std::env::var(CONTROLLER_ENV)
        .ok()
        .and_then(|p| p.parse::<i32>().ok())
        .and_then(rustix::process::Pid::from_raw);
    // Our parent is not the controller the launcher named: that controller died before we
    // looked, or a wrapper program (alive) sits between us; gone means orphaned.
    let controller_gone = move || {
        controller
            .is_some_and(|c| parent != Some(c) && rustix::process::test_kill_process(c).is_err())
    };
    let _ = std::thread::Builder::new()
        .name("mizu-orphan-watch".into())
        .spawn(move || {
            while !crate::origin::in_worker_process() {
                if rustix::process::getppid() != parent || controller_gone() {
                    let _ = rustix::process::kill_process(
                        rustix::process::getpid(),
                        rustix::process::Signal::KILL,
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
}

/// Gives a slot taken for joining back ([`records::unjoin`]) when the join fails.
struct JoinGuard<'a>(&'a records::WorkerRec);

impl Drop for JoinGuard<'_> {
    fn drop(&mut self) {
        records::unjoin(self.0);
    }
}

/// Joins the pool named by `token` as worker `slot` and serves tasks until the pool stops,
/// this worker is retired, or the controller dies (then it prunes what the controller left).
pub fn run_worker(token: &str, slot: usize, exec: &dyn Executor) -> Result<()> {
    let runner = crate::map::Runner(exec);
    let exec: &dyn Executor = &runner;
    crate::origin::joining();
    let shared = Shared::open(token)?;
    let v = shared.view();
    if slot >= v.params.max_workers as usize {
        return Err(PoolError::Layout(format!(
            "worker slot {slot} >= max_workers {}",
            v.params.max_workers
        )));
    }
    let ws = v.worker(slot);
    // One joiner per slot: a second would own the consumer ends of the slot's rings and its
    // deque's owner role beside the first.
    if !records::join(&ws.rec) {
        return Err(PoolError::Layout(format!(
            "worker slot {slot} is not waiting for a worker (another joined it, or none was \
             launched for it)"
        )));
    }
    // A join that fails from here on gives the slot back to the worker the controller
    // launched for it.
    let joining = JoinGuard(&ws.rec);
    // What this worker adopts is recorded, so that whoever reaps it gives back what it
    // still held should it be killed.
    let ledger = mizu_wire::ledger::enable();
    let pid = std::process::id();
    ws.rec.pid.store(pid, Ordering::Relaxed);
    ws.rec
        .nonce
        .store(shared.segment().me().nonce, Ordering::Relaxed);
    let spin = Duration::from_micros(u64::from(v.params.spin_us));
    let sub = SubmitterCore::for_worker(shared.clone(), slot, spin)?;
    let deques = (0..v.params.max_workers as usize)
        .map(|w| {
            OwnedDeque::new(shared.segment_arc(), |s| {
                PoolView::for_handle(s).and_then(|pv| pv.deque(w))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // Our predecessor in this slot may have died inside a deque operation.
    deques[slot].get().repair();
    let consumers = (0..v.params.submitters as usize)
        .filter(|&s| v.has_ring(s, slot))
        .map(|s| {
            // SAFETY: ring (s, slot) has one consumer: the worker in `slot` (this process;
            // the controller starts one worker per slot and waits for its death to reuse it).
            unsafe {
                OwnedConsumer::new(shared.segment_arc(), |seg| {
                    PoolView::for_handle(seg).and_then(|pv| pv.ring(s, slot))
                })
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let controller_dead = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let _watch = {
        let (dead, fin, sh) = (controller_dead.clone(), finished.clone(), shared.clone());
        DeathWatch::spawn(v.params.controller, move || {
            dead.store(true, Ordering::SeqCst);
            sh.view().worker(slot).park.wake_all_unconditionally();
            leave_if_stuck(&sh, &fin);
        })?
    };
    let rt = Runtime {
        consumers: RefCell::new(consumers),
        sub,
        shared: shared.clone(),
        exec,
        slot,
        pid,
        next_ring: Cell::new(0),
        deques,
        next_deque: Cell::new(0),
        scan_from: RefCell::new(vec![0; v.params.submitters as usize]),
        running: Cell::new(0),
    };
    std::mem::forget(joining);
    ws.rec.state.store(wstate::READY, Ordering::Release);
    // (Each wait below is bounded by its own slice, `IDLE_SLICE` or `QUIET_SLICE`.)
    let mut spinner = Waiter::new(spin, QUIET_SLICE);
    let mut sleeper = Waiter::new(Duration::ZERO, QUIET_SLICE);
    // Idle workers spinning at once, plus workers running tasks: never more than the CPUs
    // minus one (left to whoever submits), or spinning idlers would slow down the busy ones.
    let max_active = (mizu_shm::affinity::available_cpus_all().len() as u32)
        .saturating_sub(1)
        .max(1);
    let done = || v.stopped() || controller_dead.load(Ordering::Relaxed) || rt.retired();
    let mut stream = Stream {
        exec,
        active: false,
    };
    // Since when this worker has been running tasks without parking, and how many: a run of
    // long tasks (a map's chunks) makes an unclaimed task worth a walk of the slots before
    // parking; a run of tiny ones does not (another worker gets through its queue sooner than
    // a thief finds them, and the two would contend for every slot). Reset at every park
    // point, so that a look that found nothing is not repeated until tasks ran again.
    let mut busy: Option<(Instant, u32)> = None;
    // Since when idle slices have found nothing to do (see `QUIET`).
    let mut quiet_since: Option<Instant> = None;
    let mut placement = placement::Placement::default();
    while !done() {
        if rt.run_one() || rt.steal_nested() {
            placement.between_tasks(v, slot);
            quiet_since = None;
            stream.start();
            let b = busy.get_or_insert_with(|| (Instant::now(), 0));
            b.1 = b.1.saturating_add(1);
            continue;
        }
        // In a busy stream the next task is a few hundred ns away: look for it before any
        // idle bookkeeping, which writes lines that submitters read.
        if spinner.burst(|| rt.any_queued().then_some(())).is_some() {
            continue;
        }
        let spins = records::go_idle(v.workers(), slot, max_active);
        let waiter = if spins { &mut spinner } else { &mut sleeper };
        let before = waiter.parks();
        // Whether the worker parks after a run of tiny tasks (a stream of submissions, not a
        // map's chunks: see `placement`), as `check` finds before the first park.
        let mut tiny = false;
        // A stream survives the spin (a task caught there continues it) and ends before the
        // worker parks: `check` runs between the two. There, before the first park and after a
        // run of long tasks, a task another worker has not taken yet and a sleeping caller
        // waits for (queued in a ring behind the one that worker runs — a map's last chunks)
        // is looked for at once rather than after a whole idle slice: the wait stops, the
        // worker says it is busy, and the steal below runs.
        let slice = if quiet_since.is_some_and(|t| t.elapsed() >= QUIET) {
            QUIET_SLICE
        } else {
            IDLE_SLICE
        };
        let woke = waiter.wait(
            &ws.park,
            || (rt.any_queued() || done()).then_some(()),
            Some(slice),
            || {
                stream.end();
                let Some((t, n)) = busy.take() else {
                    return Ok(());
                };
                let long = t.elapsed() >= LONG_TASK.saturating_mul(n);
                tiny = !long;
                if long && rt.awaited_unclaimed() {
                    ws.rec.idle.store(idle::BUSY, Ordering::Relaxed);
                    return Err(());
                }
                Ok(())
            },
        );
        ws.rec.idle.store(idle::BUSY, Ordering::Relaxed);
        if waiter.parks() != before {
            ws.rec
                .parks
                .fetch_add(waiter.parks() - before, Ordering::Relaxed);
            // Woken for work, on a CPU the kernel chose: see that it is not another busy
            // worker's. (Not after an idle slice that found nothing.)
            if woke.is_ok() {
                placement.woke(v, slot, tiny);
            }
        }
        // Housekeeping and stealing (which scans task slots) only after a whole idle slice or
        // when a task may be waiting unclaimed (the wait stopped for it before parking), never
        // between two tasks of a busy stream (that would put them on every round trip).
        if let Err(why) = woke {
            if why == WaitError::TimedOut {
                exec.idle();
                quiet_since.get_or_insert_with(Instant::now);
            }
            while rt.steal() {
                quiet_since = None;
                stream.start();
            }
        }
    }
    stream.end();
    finished.store(true, Ordering::SeqCst);
    let _ = ws.rec.state.compare_exchange(
        wstate::READY,
        wstate::EXITING,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    drop(rt);
    // Leaving: what this process still holds (a binding's objects) is read by nobody.
    drop(ledger);
    if controller_dead.load(Ordering::Relaxed) {
        // The controller cannot clean up any more: remove what it left, and the names of this
        // worker's own data segments (results it held references to are read by nobody now;
        // without this, the last worker to leave left its results behind).
        let _ = shared.segment().unlink();
        shared.data_pool.unlink_all();
        mizu_wire::ledger::release_dead(None);
        let _ = mizu_shm::prune();
    }
    Ok(())
}

/// The mean task time from which a worker about to park looks for unclaimed tasks first
/// (see the worker loop).
const LONG_TASK: Duration = Duration::from_micros(20);

/// How long an idle worker sleeps before it looks for work nobody woke it for (a task queued
/// behind a busy worker, to steal) and runs its executor's idle chores.
const IDLE_SLICE: Duration = Duration::from_millis(2);

/// After this long without finding anything in its idle slices, a worker sleeps
/// [`QUIET_SLICE`] at a time instead: an idle pool then wakes each worker 50 times a second
/// rather than 500 (each wake-up a context switch on a CPU someone else may be using). Work
/// submitted to it wakes it at once either way.
const QUIET: Duration = Duration::from_millis(100);

/// See [`QUIET`].
const QUIET_SLICE: Duration = Duration::from_millis(20);

/// How long a worker whose controller died may take to leave on its own.
const ORPHAN_GRACE: Duration = Duration::from_secs(1);

/// Called on the death-watch thread once the controller died: an idle worker leaves its loop
/// at once (`finished`), but one inside a task would only notice when the task ends — hours,
/// maybe. Nobody can collect that task's outcome any more (the pool died with its
/// controller), so after [`ORPHAN_GRACE`] the process removes what it and the controller
/// left in shared memory and kills itself (no exit handlers: the task's thread is still
/// running).
fn leave_if_stuck(shared: &Shared, finished: &AtomicBool) {
    let deadline = Instant::now() + ORPHAN_GRACE;
    while !finished.load(Ordering::SeqCst) {
        if Instant::now() >= deadline {
            let _ = shared.segment().unlink();
            shared.data_pool.unlink_all();
            mizu_wire::ledger::close();
            mizu_wire::ledger::release_dead(None);
            let _ = mizu_shm::prune();
            if let Ok(me) = mizu_shm::liveness::current() {
                let _ = std::fs::remove_file(me.id().lock_path());
            }
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Fails every task the dead worker `slot` (process `pid`) was running — its claim record and
/// any outer task of a nested chain — with `why` (see `layout::reason`), and wakes their
/// collectors.
pub fn reap_worker(shared: &Shared, slot: usize, pid: u32, why: u32) {
    let v = shared.view();
    let rec = &v.worker(slot).rec;
    let runner = ((slot as u64) << 32) | u64::from(pid);
    // Only this slot's worker parks on its word, and it is dead.
    v.worker(slot).park.forget_sleepers();
    let submitters = v.params.submitters as usize;
    claim::reap(
        v.workers(),
        slot,
        runner,
        why,
        |word| {
            let (s, k, _) = TaskId::unpack(word)?;
            (s < submitters && k < v.slots_of(s)).then(|| ((s, k), v.task(s, k)))
        },
        (0..submitters).flat_map(|s| (0..v.slots_of(s)).map(move |k| ((s, k), v.task(s, k)))),
        |o| {
            mizu_shm::ProcessId::new(
                o.pid.load(Ordering::Relaxed),
                o.nonce.load(Ordering::Relaxed),
            )
            .is_alive()
        },
        || std::thread::sleep(Duration::from_micros(20)),
        |(s, k), g| {
            reclaim_if_abandoned(
                shared,
                TaskId {
                    submitter: s,
                    slot: k,
                    generation: g,
                },
            );
            v.submitter(s).wake_every();
        },
    );
    // Its nested tasks lost their collector: those still queued never run, and every slot
    // is freed as soon as its task is final (by whoever finishes a running one).
    let s = 1 + slot;
    for k in 0..v.slots_of(s) {
        let (g, st) = v.task(s, k).state.load();
        let id = TaskId {
            submitter: s,
            slot: k,
            generation: g,
        };
        match st {
            None | Some(SlotState::Free) => {}
            // It died between taking a result and freeing the slot.
            Some(SlotState::Collected) => free_claimed(shared, id),
            Some(_) => abandon(shared, id),
        }
    }
    rec.current.store(0, Ordering::Release);
    rec.idle.store(idle::BUSY, Ordering::Release);
    // The survivor gives back the references the worker held (its ledger) and removes what
    // a killed worker could not: its liveness lock file.
    mizu_wire::ledger::release_dead(Some(&[pid]));
    mizu_shm::ProcessId::new(pid, rec.nonce.load(Ordering::Relaxed)).reap();
}
