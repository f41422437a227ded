//! One end's registration in a duplex: which process holds that end, written by it and read
//! by the other end. Segment-free, so the loom model `duplex_guest_joins_once` runs this code.

use mizu_shm::sync::{AtomicU32, AtomicU64, Ordering};

const EMPTY: u32 = 0;
const SET: u32 = 1;
/// Claimed by [`PeerSlot::claim`], the identity not yet written.
const CLAIMED: u32 = 2;

/// A process identity `(pid, nonce)` in shared memory, published once.
#[repr(C)]
#[derive(Debug, Default)]
pub struct PeerSlot {
    nonce: AtomicU64,
    pid: AtomicU32,
    state: AtomicU32,
}

impl PeerSlot {
    /// Records `(pid, nonce)` in a slot nobody else writes (the creator's own end).
    pub fn set(&self, pid: u32, nonce: u64) {
        self.nonce.store(nonce, Ordering::Relaxed);
        self.pid.store(pid, Ordering::Relaxed);
        self.state.store(SET, Ordering::Release);
    }

    /// Records `(pid, nonce)` unless another process claimed the slot first; of several
    /// processes claiming at once exactly one wins. The identity is written only after the
    /// winning CAS, so a reader never sees half of a loser's.
    pub fn claim(&self, pid: u32, nonce: u64) -> bool {
        if self
            .state
            .compare_exchange(EMPTY, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.set(pid, nonce);
        true
    }

    /// The recorded `(pid, nonce)`, once complete.
    pub fn get(&self) -> Option<(u32, u64)> {
        (self.state.load(Ordering::Acquire) == SET).then(|| {
            (
                self.pid.load(Ordering::Relaxed),
                self.nonce.load(Ordering::Relaxed),
            )
        })
    }

    /// Whether a process holds or is claiming the slot.
    pub fn taken(&self) -> bool {
        self.state.load(Ordering::Acquire) != EMPTY
    }
}
