//! Death watch: a thread that calls back when a watched process exits (pidfd readiness), so
//! parked waiters wake promptly instead of at the end of their slice. The flock decides
//! liveness; the pidfd only says "look now". Where the kernel has no pidfds (Linux before 5.3,
//! or a process run under valgrind), the thread looks at the flock every [`LOOK_EVERY`].

use std::thread::JoinHandle;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fd::OwnedFd;
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags};

use crate::error::{Result, ShmError};
use crate::liveness::ProcessId;

/// How often a watch without a pidfd looks whether its process still holds its lock.
pub const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// Calls `on_exit` once when the watched process exits; dropping the watch stops it.
pub struct DeathWatch {
    cancel: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl DeathWatch {
    /// Starts watching `target`. If it is already dead, `on_exit` runs right away (on the
    /// watch thread).
    pub fn spawn(target: ProcessId, on_exit: impl FnOnce() + Send + 'static) -> Result<Self> {
        let pidfd = Pid::from_raw(target.pid as i32)
            .map(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()));
        Self::start(target, pidfd, on_exit)
    }

    /// Starts watching `target` as [`DeathWatch::spawn`] does where the kernel has no pidfds:
    /// by looking at its lock every [`LOOK_EVERY`].
    pub fn spawn_polling(
        target: ProcessId,
        on_exit: impl FnOnce() + Send + 'static,
    ) -> Result<Self> {
        Self::start(target, Some(Err(Errno::NOSYS)), on_exit)
    }

    fn start(
        target: ProcessId,
        pidfd: Option<rustix::io::Result<OwnedFd>>,
        on_exit: impl FnOnce() + Send + 'static,
    ) -> Result<Self> {
        let cancel = rustix::event::eventfd(0, EventfdFlags::CLOEXEC)
            .map_err(|e| ShmError::io("eventfd", "death watch", e))?;
        let cancel_dup = rustix::io::dup(&cancel).map_err(|e| ShmError::io("dup", "eventfd", e))?;
        let thread = std::thread::Builder::new()
            .name(format!("mizu-watch-{}", target.pid))
            .spawn(move || watch(target, pidfd, cancel_dup, on_exit))
            .map_err(|e| ShmError::io("spawn", "death watch thread", e))?;
        Ok(DeathWatch {
            cancel,
            thread: Some(thread),
        })
    }
}

fn watch(
    target: ProcessId,
    pidfd: Option<rustix::io::Result<OwnedFd>>,
    cancel: OwnedFd,
    on_exit: impl FnOnce(),
) {
    let pidfd = match pidfd {
        Some(Ok(fd)) => Some(fd),
        // No pidfds in this kernel: the lock is looked at every `LOOK_EVERY` instead.
        Some(Err(Errno::NOSYS)) => None,
        // No such process (or an invalid pid): it is gone already.
        _ => return on_exit(),
    };
    // The pid may belong to another process by now: the lock decides.
    if !target.is_alive() {
        return on_exit();
    }
    let every = rustix::event::Timespec {
        tv_sec: LOOK_EVERY.as_secs() as i64,
        tv_nsec: i64::from(LOOK_EVERY.subsec_nanos()),
    };
    loop {
        let polled = match &pidfd {
            Some(pidfd) => {
                let mut fds = [
                    PollFd::new(pidfd, PollFlags::IN),
                    PollFd::new(&cancel, PollFlags::IN),
                ];
                rustix::event::poll(&mut fds, None)
                    .map(|_| (!fds[1].revents().is_empty(), !fds[0].revents().is_empty()))
            }
            None => {
                let mut fds = [PollFd::new(&cancel, PollFlags::IN)];
                rustix::event::poll(&mut fds, Some(&every))
                    .map(|_| (!fds[0].revents().is_empty(), !target.is_alive()))
            }
        };
        match polled {
            Ok((true, _)) => return,
            Ok((false, true)) => return on_exit(),
            Ok((false, false)) | Err(Errno::INTR) => {}
            Err(_) => return on_exit(),
        }
    }
}

impl Drop for DeathWatch {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.cancel, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
