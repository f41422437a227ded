//! Where mizu's shared memory lives: the directory of its segments and lock files, and the
//! prefix of their names. `/dev/shm` (where Linux keeps POSIX shared memory) and `mizu_`,
//! unless the environment says otherwise (`MIZU_SHM_DIR`, `MIZU_SHM_PREFIX`) or the program
//! calls [`configure`] before it first touches shared memory.
//!
//! Processes that share segments must agree on both: a pool's workers inherit the environment
//! of the process that starts them, so the environment is the way to move a whole pool (to
//! another tmpfs, or apart from another program's mizu files). The directory should be a
//! memory file system: segments are files there, mapped shared.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Result, ShmError};

/// The directory unless configured.
pub const DEFAULT_DIR: &str = "/dev/shm";
/// The name prefix unless configured.
pub const DEFAULT_PREFIX: &str = "mizu_";
/// Longest prefix: a segment name (`/` + prefix + pid in hex + `_` + 24 hex digits) must fit
/// the 40 bytes region descriptors give it.
pub const MAX_PREFIX: usize = 6;

/// A directory and a name prefix, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    dir: PathBuf,
    prefix: String,
}

impl Place {
    /// `dir` must be an absolute path to an existing directory; `prefix` 1 to [`MAX_PREFIX`]
    /// characters of `a`–`z`, `0`–`9` and `_`.
    pub fn new(dir: impl Into<PathBuf>, prefix: &str) -> Result<Place> {
        let dir = dir.into();
        let bad = |why: String| Err(ShmError::Config(why));
        if !dir.is_absolute() || !dir.is_dir() {
            return bad(format!(
                "the shared-memory directory {} is not an absolute path to a directory",
                dir.display()
            ));
        }
        if prefix.is_empty()
            || prefix.len() > MAX_PREFIX
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return bad(format!(
                "the shared-memory name prefix {prefix:?} is not 1 to {MAX_PREFIX} characters \
                 of a-z, 0-9 and _"
            ));
        }
        Ok(Place {
            dir,
            prefix: prefix.to_owned(),
        })
    }

    /// The defaults: `/dev/shm` and `mizu_`.
    pub fn default_place() -> Place {
        Place {
            dir: PathBuf::from(DEFAULT_DIR),
            prefix: DEFAULT_PREFIX.to_owned(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The path of `name` (with or without its leading `/`) in the directory.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name.trim_start_matches('/'))
    }
}

static PLACE: OnceLock<std::result::Result<Place, String>> = OnceLock::new();

fn from_env() -> std::result::Result<Place, String> {
    let dir = std::env::var_os("MIZU_SHM_DIR");
    let prefix = std::env::var("MIZU_SHM_PREFIX").ok();
    if dir.is_none() && prefix.is_none() {
        return Ok(Place::default_place());
    }
    Place::new(
        dir.map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from),
        prefix.as_deref().unwrap_or(DEFAULT_PREFIX),
    )
    .map_err(|e| format!("{e} (from MIZU_SHM_DIR / MIZU_SHM_PREFIX)"))
}

/// Sets where this process keeps shared memory, before it first touches any (the environment
/// is not read then). Setting what is already in use is fine; anything else is an error.
pub fn configure(place: Place) -> Result<()> {
    let got = PLACE.get_or_init(|| Ok(place.clone()));
    match got {
        Ok(p) if *p == place => Ok(()),
        _ => Err(ShmError::Config(format!(
            "shared memory is already in use at {} (prefix {:?}): configure it before the \
             first segment",
            here().dir.display(),
            here().prefix
        ))),
    }
}

/// Where this process keeps shared memory, or why the environment's setting is invalid.
/// Every way in (creating, opening, pruning) asks this first.
pub fn current() -> Result<&'static Place> {
    PLACE
        .get_or_init(from_env)
        .as_ref()
        .map_err(|why| ShmError::Config(why.clone()))
}

/// [`current`] for the code behind those ways in (which already checked it): the defaults when
/// the setting is invalid, so that nothing is ever created there.
pub(crate) fn here() -> &'static Place {
    static DEFAULT: OnceLock<Place> = OnceLock::new();
    current().unwrap_or_else(|_| DEFAULT.get_or_init(Place::default_place))
}

/// Where data segments go when the shared-memory directory has no room for them (a
/// container's `/dev/shm` is 64 MiB by default): `MIZU_SPILL_DIR`, else the platform's
/// temporary directory; `MIZU_SPILL_DIR=none` (or an empty value) turns spilling off. None
/// when off, or when the setting is not an absolute path to a directory (then spilling is off
/// and [`spill_problem`] says why). Segments there are files mapped shared by every process
/// that reads them — memory the kernel may write back to disk, slower than `/dev/shm` but with
/// the same guarantees (see `Segment::create_spilled`).
pub fn spill_dir() -> Option<&'static Path> {
    spill().as_ref().ok().and_then(|d| d.as_deref())
}

/// Why the spill setting is unusable, if it is.
pub fn spill_problem() -> Option<&'static str> {
    spill().as_ref().err().map(String::as_str)
}

fn spill() -> &'static std::result::Result<Option<PathBuf>, String> {
    static SPILL: OnceLock<std::result::Result<Option<PathBuf>, String>> = OnceLock::new();
    SPILL.get_or_init(|| {
        let dir = match std::env::var_os("MIZU_SPILL_DIR") {
            Some(v) if v.is_empty() || v == "none" => return Ok(None),
            Some(v) => PathBuf::from(v),
            None => std::env::temp_dir(),
        };
        if dir.is_absolute() && dir.is_dir() {
            Ok(Some(dir))
        } else {
            Err(format!(
                "the spill directory {} (MIZU_SPILL_DIR, else the temporary directory) is not \
                 an absolute path to a directory",
                dir.display()
            ))
        }
    })
}
