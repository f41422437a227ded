//! Process identity and liveness: "is this peer alive" is decided by an `flock`.
//!
//! Each process that holds any mizu handle holds an exclusive `flock` on its own lock file,
//! `/dev/shm/mizu_<pid hex>_<nonce hex>.lock` (see [`crate::place`] for the directory and prefix). The kernel drops the lock when the process dies,
//! however it dies, so a peer is dead exactly when its lock can be taken. The random nonce makes
//! PID reuse harmless. The lock file is created under a temporary name, locked, then renamed, so
//! nobody ever sees an unlocked lock file of a live process.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use rustix::fd::OwnedFd;
use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Result, ShmError};

/// Who a process is, as stored in shared memory: its PID and a random incarnation nonce.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ProcessId {
    /// OS process id.
    pub pid: u32,
    /// Always zero; keeps the layout explicit.
    pub reserved: u32,
    /// Random, non-zero, chosen when the process first needed an identity.
    pub nonce: u64,
}

impl ProcessId {
    /// An identity from its parts.
    pub fn new(pid: u32, nonce: u64) -> Self {
        ProcessId {
            pid,
            reserved: 0,
            nonce,
        }
    }

    /// Path of this process's lock file.
    pub fn lock_path(&self) -> PathBuf {
        let place = crate::place::here();
        place.path_of(&format!(
            "{}{:x}_{:016x}.lock",
            place.prefix(),
            self.pid,
            self.nonce
        ))
    }

    /// Whether the process still lives (its lock file is present and locked).
    pub fn is_alive(&self) -> bool {
        if self.pid == 0 {
            return false;
        }
        let fd = match rustix::fs::open(
            self.lock_path(),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(_) => return false,
        };
        // A shared lock conflicts only with the owner's exclusive one, so concurrent checkers
        // do not disturb each other.
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared) {
            Ok(()) => false,
            Err(Errno::WOULDBLOCK) => true,
            Err(_) => true, // cannot tell: never declare a peer dead on an unexpected error
        }
    }

    /// Removes the lock file of a dead process; returns whether one was removed.
    pub fn reap(&self) -> bool {
        !self.is_alive() && rustix::fs::unlink(self.lock_path()).is_ok()
    }
}

/// This process's identity, alive while any mizu handle holds an `Arc` of it.
#[derive(Debug)]
pub struct Identity {
    id: ProcessId,
    path: PathBuf,
    _lock: OwnedFd,
}

impl Identity {
    /// The identity as stored in shared memory.
    pub fn id(&self) -> ProcessId {
        self.id
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        // A forked child inherits Arcs of its parent's identity; it must not unlink the lock
        // file of the parent, which is still alive.
        if rustix::process::getpid().as_raw_nonzero().get() as u32 == self.id.pid {
            let _ = rustix::fs::unlink(&self.path);
        }
    }
}

static CURRENT: Mutex<Weak<Identity>> = Mutex::new(Weak::new());

/// This process's identity, creating and locking its lock file on first use. The file is
/// removed when the last handle that holds the identity is dropped.
pub fn current() -> Result<Arc<Identity>> {
    // Every segment and lock file comes after this: a wrong setting of where they go stops here.
    crate::place::current()?;
    let mut slot = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    if let Some(id) = slot.upgrade()
        && id.id.pid == pid
    {
        return Ok(id);
    }
    let id = create_identity(pid)?;
    let id = Arc::new(id);
    *slot = Arc::downgrade(&id);
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a static function that never unwinds (see `remove_at_exit`); the C
        // library keeps the pointer for the life of the process. A failed registration leaves
        // the lock file of an exited process holding handles for `prune`, as before.
        let _ = unsafe { atexit(remove_at_exit) };
    });
    Ok(id)
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// Runs when the process exits normally: a runtime that does not drop every object at exit
/// (Python leaves some alive, an exception's traceback holding views, say) would otherwise
/// leave this process's lock file behind until someone prunes it. The process is leaving, so
/// nothing of it needs to look alive any more. Skipped if another thread holds the slot's lock
/// (nothing may block here) and in a forked child (the identity is its parent's).
extern "C" fn remove_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Ok(slot) = CURRENT.try_lock() else {
            return;
        };
        if let Some(id) = slot.upgrade()
            && rustix::process::getpid().as_raw_nonzero().get() as u32 == id.id.pid
        {
            let _ = rustix::fs::unlink(&id.path);
        }
    });
}

fn create_identity(pid: u32) -> Result<Identity> {
    loop {
        let mut b = [0u8; 8];
        random_bytes(&mut b)?;
        let nonce = u64::from_le_bytes(b);
        if nonce == 0 {
            continue;
        }
        let id = ProcessId::new(pid, nonce);
        let path = id.lock_path();
        let tmp = PathBuf::from(format!("{}.tmp", path.display()));
        let fd = match rustix::fs::open(
            &tmp,
            OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::RUSR | Mode::WUSR,
        ) {
            Ok(fd) => fd,
            Err(Errno::EXIST) => continue,
            Err(e) => {
                return Err(ShmError::io(
                    "create lock file",
                    tmp.display().to_string(),
                    e,
                ));
            }
        };
        rustix::fs::flock(&fd, FlockOperation::LockExclusive)
            .map_err(|e| ShmError::io("flock", tmp.display().to_string(), e))?;
        match rustix::fs::rename(&tmp, &path) {
            Ok(()) => {
                return Ok(Identity {
                    id,
                    path,
                    _lock: fd,
                });
            }
            // A concurrent prune removed the unlocked-looking temporary file: start over.
            Err(Errno::NOENT) => continue,
            Err(e) => {
                let _ = rustix::fs::unlink(&tmp);
                return Err(ShmError::io(
                    "rename lock file",
                    path.display().to_string(),
                    e,
                ));
            }
        }
    }
}

/// Fills `buf` from the kernel's random source.
pub(crate) fn random_bytes(buf: &mut [u8]) -> Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(ShmError::io("getrandom", "identity", e)),
        }
    }
    Ok(())
}

/// Whether any process with this PID exists right now (PID reuse can fake this; used only for
/// temporary files that predate a lock).
pub(crate) fn pid_exists(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return false;
    };
    match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
        Err(Errno::SRCH) => false,
        // No pidfds in this kernel: ask with signal 0 (permission refused means it exists).
        Err(Errno::NOSYS) => !matches!(rustix::process::test_kill_process(p), Err(Errno::SRCH)),
        _ => true,
    }
}
