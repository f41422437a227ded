//! A pool's worker processes: how they are launched (and waited for at start), started on
//! demand ([`super::PoolConfig::on_demand`]), spawned and retired by hand, and watched — the
//! monitor reaps and replaces the dead and kills those over the execution timeout.

use std::ffi::OsString;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Pool, PoolConfig};
use crate::claim;
use crate::error::{PoolError, Result};
use crate::layout::{now_ns, reason, wstate};
use crate::shared::Shared;
use crate::worker::reap_worker;

/// How workers are started: `program args… <token> <slot>`.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The executable.
    pub program: OsString,
    /// Arguments before the token and slot.
    pub args: Vec<OsString>,
}

impl Launcher {
    /// A launcher running `program` with `args`, then the token and slot number.
    pub fn new(
        program: impl Into<OsString>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        Launcher {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
        }
    }

    fn spawn(&self, token: &str, slot: usize) -> std::io::Result<Child> {
        Command::new(&self.program)
            .args(&self.args)
            .arg(token)
            .arg(slot.to_string())
            // Who the worker's parent must be: a worker whose controller died before it looked
            // would find another parent already (see `exit_if_orphaned_while_starting`).
            .env(
                crate::worker::CONTROLLER_ENV,
                std::process::id().to_string(),
            )
            .stdin(Stdio::null())
            .spawn()
    }
}

pub(super) struct Children {
    pub(super) procs: Vec<Option<Child>>,
    /// Each worker's pidfd (readable once it exits), where the kernel gives one.
    pub(super) pidfds: Vec<Option<Arc<OwnedFd>>>,
    /// Rung when a worker is launched and when the pool stops (see [`Bell`]).
    pub(super) bell: Arc<Bell>,
    pub(super) kill_reason: Vec<u32>,
    pub(super) respawns: u64,
    /// Every worker process launched, for cleaning up what they left.
    pub(super) launched: Vec<u32>,
}

impl Pool {
    pub(super) fn launch(&self, slot: usize) -> Result<()> {
        launch(&self.shared, &self.children, &self.launcher, slot)
    }

    pub(super) fn wait_ready(
        &self,
        slots: std::ops::Range<usize>,
        keep_waiting: &mut dyn FnMut() -> bool,
    ) -> Result<()> {
        let v = self.shared.view();
        let start = Instant::now();
        let mut polls = 0u32;
        for slot in slots {
            while v.worker(slot).rec.state.load(Ordering::Acquire) != wstate::READY {
                polls += 1;
                if polls.is_multiple_of(50) && !keep_waiting() {
                    return Err(PoolError::Interrupted);
                }
                let mut ch = self.children.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(c) = ch.procs[slot].as_mut()
                    && let Some(st) = match c.try_wait() {
                        Ok(Some(st)) => Some(st.to_string()),
                        Ok(None) => None,
                        Err(e) => Some(format!("its status was collected elsewhere ({e})")),
                    }
                {
                    return Err(PoolError::Launch {
                        slot,
                        why: format!("worker exited before joining: {st}"),
                    });
                }
                drop(ch);
                if start.elapsed() > self.cfg.start_timeout {
                    return Err(PoolError::Launch {
                        slot,
                        why: format!("did not join within {:?}", self.cfg.start_timeout),
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    }

    pub(super) fn start_monitor(&mut self) {
        let (shared, children, launcher, stopping, cfg) = (
            self.shared.clone(),
            self.children.clone(),
            self.launcher.clone(),
            self.stopping.clone(),
            self.cfg.clone(),
        );
        let deaths = self.deaths.clone();
        self.monitor = Some(
            std::thread::Builder::new()
                .name("mizu-pool-monitor".into())
                .spawn(move || {
                    let watch = Watch {
                        stopping: &stopping,
                        deaths: &deaths,
                    };
                    monitor(&shared, &children, &launcher, watch, &cfg)
                })
                .expect("spawn the pool monitor thread"),
        );
    }

    /// The pids of every worker process this pool launched (replacements included).
    pub fn launched_pids(&self) -> Vec<u32> {
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .launched
            .clone()
    }

    /// `submitted`, after a worker was started if the tasks in flight now need one (see
    /// [`PoolConfig::on_demand`]). A worker that cannot be started leaves the tasks to the
    /// running ones, and the pool stops growing.
    pub(super) fn grown<T>(&self, submitted: T) -> T {
        if self.may_grow.load(Ordering::Relaxed) {
            self.grow();
        }
        submitted
    }

    /// A submission that failed before it reached a queue (its call could not be encoded, say)
    /// still counts as work in flight for [`PoolConfig::on_demand`], for good: as
    /// `ProcessPoolExecutor` starts a worker for each submission before it encodes the call.
    pub fn submission_failed(&self) {
        self.unqueued.fetch_add(1, Ordering::Relaxed);
        self.grown(());
    }

    fn grow(&self) {
        let v = self.shared.view();
        let rec = &v.submitter(0).rec;
        let in_flight = (rec.submitted.load(Ordering::Relaxed)
            + self.unqueued.load(Ordering::Relaxed))
        .saturating_sub(rec.collected.load(Ordering::Relaxed));
        let slots = v.params.max_workers as usize;
        let started = || {
            (0..slots)
                .filter(|&w| v.worker(w).rec.state.load(Ordering::Acquire) != wstate::EMPTY)
                .count()
        };
        if in_flight <= started() as u64 {
            return;
        }
        let _g = self.growing.lock().unwrap_or_else(|p| p.into_inner());
        let now = started();
        if in_flight <= now as u64 || self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let free =
            (0..slots).find(|&w| v.worker(w).rec.state.load(Ordering::Acquire) == wstate::EMPTY);
        let launched = free.is_some_and(|slot| self.launch(slot).is_ok());
        if !launched || now + 1 >= slots {
            self.may_grow.store(false, Ordering::Relaxed);
        }
    }

    /// Starts a worker in the first free slot; returns the slot.
    pub fn spawn_worker(&self) -> Result<usize> {
        let v = self.shared.view();
        let slot = (0..v.params.max_workers as usize)
            .find(|&w| {
                matches!(
                    v.worker(w).rec.state.load(Ordering::Acquire),
                    wstate::EMPTY | wstate::DEAD
                )
            })
            .ok_or_else(|| {
                PoolError::Config(format!(
                    "all {} worker slots are in use",
                    v.params.max_workers
                ))
            })?;
        self.launch(slot)?;
        self.wait_ready(slot..slot + 1, &mut || true)?;
        Ok(slot)
    }

    /// Asks worker `slot` to leave after its current task; it is not replaced.
    pub fn retire_worker(&self, slot: usize) -> bool {
        let v = self.shared.view();
        if slot >= v.params.max_workers as usize {
            return false;
        }
        let ok = v
            .worker(slot)
            .rec
            .state
            .compare_exchange(
                wstate::READY,
                wstate::EXITING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        v.worker(slot).park.wake_all_unconditionally();
        ok
    }
}

/// Whether `child` has exited: reaped now, or reaped already by someone else in this process
/// (a `waitpid(-1, …)` elsewhere — a test harness, a SIGCHLD handler — makes `try_wait` fail
/// with ECHILD; taking that for "still running" would leave its task waiting forever).
pub(crate) fn exited(child: &mut Child) -> bool {
    !matches!(child.try_wait(), Ok(None))
}

pub(super) fn launch(
    shared: &Shared,
    children: &Mutex<Children>,
    launcher: &Launcher,
    slot: usize,
) -> Result<()> {
    let v = shared.view();
    let rec = &v.worker(slot).rec;
    rec.current.store(0, Ordering::Relaxed);
    rec.pid.store(0, Ordering::Relaxed);
    rec.state.store(wstate::STARTING, Ordering::Release);
    let child = launcher
        .spawn(shared.segment().token(), slot)
        .map_err(|e| PoolError::Launch {
            slot,
            why: format!("{:?}: {e}", launcher.program),
        })?;
    // Our unreaped child: its pid cannot name another process yet.
    let pidfd = rustix::process::Pid::from_raw(child.id() as i32)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
        .map(Arc::new);
    let mut ch = children.lock().unwrap_or_else(|p| p.into_inner());
    ch.launched.push(child.id());
    ch.procs[slot] = Some(child);
    ch.pidfds[slot] = pidfd;
    ch.kill_reason[slot] = 0;
    ch.bell.ring();
    Ok(())
}

/// What wakes the monitor besides a worker's exit: a worker launched (its pidfd is to be
/// watched too), the pool stopping. An eventfd; `None` where the kernel gives none, and the
/// monitor then looks every [`LOOK_EVERY`].
pub(super) struct Bell(Option<OwnedFd>);

impl Bell {
    pub(super) fn new() -> Self {
        Bell(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).ok())
    }

    pub(super) fn ring(&self) {
        if let Some(fd) = &self.0 {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }
}

/// How often the monitor looks where it cannot wait for events: no eventfd, or a worker
/// without a pidfd.
const LOOK_EVERY: Duration = Duration::from_millis(2);

/// The longest the monitor waits for an event before it looks anyway: for an exit no pidfd
/// reports (a worker whose status someone else in the process collected, its pid reused).
const LOOK_AT_LEAST: Duration = Duration::from_secs(1);

/// Sleeps until a worker exits, the bell rings or `limit` passes, rather than looking on a
/// timer: every wake-up takes a CPU from a busy worker for a moment on a machine whose every
/// CPU runs one. Returns the workers whose pidfd fired.
fn wait_for_news(bell: &Bell, pidfds: &[(usize, Arc<OwnedFd>)], limit: Duration) -> Vec<usize> {
    let Some(b) = &bell.0 else {
        std::thread::sleep(limit.min(LOOK_EVERY));
        return Vec::new();
    };
    let mut fds: Vec<PollFd<'_>> = pidfds
        .iter()
        .map(|(_, fd)| PollFd::new(&**fd, PollFlags::IN))
        .collect();
    fds.push(PollFd::new(b, PollFlags::IN));
    let ts = rustix::event::Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: i64::from(limit.subsec_nanos()),
    };
    let _ = rustix::event::poll(&mut fds, Some(&ts));
    if !fds[pidfds.len()].revents().is_empty() {
        let mut drained = [0u8; 8];
        let _ = rustix::io::read(b, &mut drained);
    }
    pidfds
        .iter()
        .zip(&fds)
        .filter(|(_, f)| !f.revents().is_empty())
        .map(|((w, _), _)| *w)
        .collect()
}

/// The monitor's flags: the pool is stopping; workers that died on their own.
#[derive(Clone, Copy)]
struct Watch<'a> {
    stopping: &'a AtomicBool,
    deaths: &'a AtomicU64,
}

/// Watches the workers: reaps and replaces dead ones, kills those over the execution timeout.
fn monitor(
    shared: &Shared,
    children: &Mutex<Children>,
    launcher: &Launcher,
    watch: Watch<'_>,
    cfg: &PoolConfig,
) {
    let Watch { stopping, deaths } = watch;
    let v = shared.view();
    let bell = children
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .bell
        .clone();
    // Workers whose pidfd said they exited at the last wait.
    let mut fired: Vec<usize> = Vec::new();
    while !stopping.load(Ordering::SeqCst) {
        let mut relaunch = Vec::new();
        // What to wait on next, and for how long: until the next execution timeout is due.
        let mut watched = Vec::new();
        let mut limit = LOOK_AT_LEAST;
        {
            let mut guard = children.lock().unwrap_or_else(|p| p.into_inner());
            let ch = &mut *guard;
            for w in 0..ch.procs.len() {
                let Some(child) = ch.procs[w].as_mut() else {
                    continue;
                };
                let rec = &v.worker(w).rec;
                if exited(child) {
                    let pid = child.id();
                    let was = rec.state.swap(wstate::DEAD, Ordering::AcqRel);
                    let why = if ch.kill_reason[w] != 0 {
                        ch.kill_reason[w]
                    } else {
                        reason::DIED
                    };
                    reap_worker(shared, w, pid, why);
                    ch.procs[w] = None;
                    ch.pidfds[w] = None;
                    // Counted once its task failed: whoever sees the count sees that failure
                    // (and can tell the task that died from the others).
                    if why == reason::DIED && was == wstate::READY {
                        deaths.fetch_add(1, Ordering::AcqRel);
                    }
                    // Replace workers that died serving or left after their task quota; not
                    // retired ones, nor ones that never managed to join (a broken launcher
                    // would loop forever).
                    let replace = was == wstate::RECYCLE || (cfg.respawn && was == wstate::READY);
                    if replace && !stopping.load(Ordering::SeqCst) {
                        ch.respawns += 1;
                        relaunch.push(w);
                    }
                    continue;
                }
                if let Some(most) = cfg.exec_timeout
                    && ch.kill_reason[w] == 0
                {
                    // A task that starts during the wait is due no sooner than `most` from now.
                    limit = limit.min(most);
                    if let Some(started) = claim::running_since(rec) {
                        let ran = Duration::from_nanos(now_ns().saturating_sub(started));
                        if ran > most {
                            ch.kill_reason[w] = reason::TIMEOUT;
                            let _ = child.kill();
                        } else {
                            limit = limit.min(most - ran);
                        }
                    }
                }
                // A pidfd that fired for a worker still running (a pid someone else reaped
                // and the kernel gave away) would fire for good: that worker is looked at
                // every `LOOK_EVERY` instead.
                if fired.contains(&w) {
                    ch.pidfds[w] = None;
                }
                match &ch.pidfds[w] {
                    Some(fd) => watched.push((w, fd.clone())),
                    None => limit = limit.min(LOOK_EVERY),
                }
            }
        }
        for w in relaunch {
            let _ = launch(shared, children, launcher, w);
        }
        if stopping.load(Ordering::SeqCst) {
            break;
        }
        fired = wait_for_news(&bell, &watched, limit.max(Duration::from_micros(100)));
    }
}
