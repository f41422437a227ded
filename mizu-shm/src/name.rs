//! Segment and lock-file names: `/mizu_<pid hex>_<process nonce 16 hex><random 8 hex>` (the
//! prefix `mizu_` unless configured, see [`crate::place`]), and a trailing `s` for a segment
//! spilled to the spill directory ([`crate::place::spill_dir`]): the name alone says where a
//! reader finds it.
//!
//! The 24 "random" hex digits are the creating process's 64-bit incarnation nonce followed by 32
//! random bits. Embedding the nonce lets `prune` map a segment to its creator's lock file
//! (`mizu_<pid hex>_<nonce>.lock`) without opening the segment, and makes PID reuse harmless:
//! a new process with the same PID has another nonce, hence another lock file.

use crate::error::{Result, ShmError};
use crate::liveness::ProcessId;

/// The end of a spilled segment's name.
const SPILL_MARK: &str = "s";

/// A validated segment name such as `/mizu_1a2b_0123456789abcdef01234567`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SegmentName {
    full: String,
    creator: ProcessId,
    spilled: bool,
}

impl SegmentName {
    /// A fresh name for a segment created by `creator`, of a spilled one when `spilled`.
    pub(crate) fn generate_in(creator: ProcessId, spilled: bool) -> Result<Self> {
        let mut r = [0u8; 4];
        crate::liveness::random_bytes(&mut r)?;
        let full = format!(
            "/{}{:x}_{:016x}{:08x}{}",
            crate::place::here().prefix(),
            creator.pid,
            creator.nonce,
            u32::from_le_bytes(r),
            if spilled { SPILL_MARK } else { "" }
        );
        Ok(SegmentName {
            full,
            creator,
            spilled,
        })
    }

    /// Parses a name or join token (with or without the leading `/`).
    pub fn parse(token: &str) -> Result<Self> {
        let bad = || ShmError::InvalidName(token.to_owned());
        let body = token.strip_prefix('/').unwrap_or(token);
        let rest = body
            .strip_prefix(crate::place::here().prefix())
            .ok_or_else(bad)?;
        let (pid_hex, tail) = rest.split_once('_').ok_or_else(bad)?;
        let (tail, spilled) = match tail.strip_suffix(SPILL_MARK) {
            Some(t) => (t, true),
            None => (tail, false),
        };
        let is_hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if pid_hex.is_empty()
            || pid_hex.len() > 8
            || !is_hex(pid_hex)
            || tail.len() != 24
            || !is_hex(tail)
        {
            return Err(bad());
        }
        let pid = u32::from_str_radix(pid_hex, 16).map_err(|_| bad())?;
        let nonce = u64::from_str_radix(&tail[..16], 16).map_err(|_| bad())?;
        if pid == 0 || nonce == 0 {
            return Err(bad());
        }
        Ok(SegmentName {
            full: format!("/{body}"),
            creator: ProcessId::new(pid, nonce),
            spilled,
        })
    }

    /// The name as given to `shm_open` (with the leading `/`).
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The process that created the segment, as encoded in its name.
    pub fn creator(&self) -> ProcessId {
        self.creator
    }

    /// Whether the segment lives in the spill directory.
    pub fn is_spilled(&self) -> bool {
        self.spilled
    }

    /// The path of the object: in the shared-memory directory ([`crate::place`]), or for a
    /// spilled segment in the spill directory (in the shared-memory directory when spilling
    /// is off, where opening it then finds nothing).
    pub fn path(&self) -> std::path::PathBuf {
        match crate::place::spill_dir() {
            Some(d) if self.spilled => d.join(self.full.trim_start_matches('/')),
            _ => crate::place::here().path_of(&self.full),
        }
    }
}

impl std::fmt::Display for SegmentName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_generated_names_and_rejects_others() {
        let id = ProcessId::new(0x1a2b, 0x0123_4567_89ab_cdef);
        let n = SegmentName::generate_in(id, false).unwrap();
        let p = SegmentName::parse(n.as_str()).unwrap();
        assert_eq!(p, n);
        assert!(!p.is_spilled());
        let s = SegmentName::generate_in(id, true).unwrap();
        let q = SegmentName::parse(s.as_str()).unwrap();
        assert_eq!((q.creator(), q.is_spilled()), (id, true));
        assert!(s.as_str().len() <= 40, "fits a region descriptor");
        assert_eq!(p.creator(), id);
        assert_eq!(SegmentName::parse(&n.as_str()[1..]).unwrap(), n);
        for bad in [
            "",
            "/",
            "mizu_",
            "/mizu_1a2b",
            "/mizu_1a2b_0123",
            "/mizu_1a2b_0123456789abcdef0123456g",
            "/mizu_1A2B_0123456789abcdef01234567",
            "/mizu_123456789_0123456789abcdef01234567",
            "/mizu_0_0123456789abcdef01234567",
            "/mizu_1_000000000000000001234567",
            "/other_1a2b_0123456789abcdef01234567",
            "/mizu_1a2b_0123456789abcdef01234567/../x",
            "/mizu_1a2b_0123456789abcdef01234567ss",
            "/mizu_1a2b_0123456789abcdef0123456s",
            "../../etc/passwd",
        ] {
            assert!(
                matches!(SegmentName::parse(bad), Err(ShmError::InvalidName(_))),
                "{bad:?}"
            );
        }
    }
}
