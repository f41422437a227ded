//! `OutcomeBytes`: a task's outcome as its submitter takes it out of the task slot.

use std::ops::Deref;

use arrow_buffer::Buffer;

/// Inline outcomes of up to this many bytes are taken by value.
pub const SMALL_OUTCOME: usize = 30;

/// A task's outcome bytes. A short task's result is mostly a few bytes: those are copied out
/// of the slot into this value itself, where a [`Buffer`] costs two allocations (its bytes
/// and their shared count) and their frees — a third of what a binding spends collecting a
/// trivial task. Anything larger, and a region adopted in place, is a [`Buffer`].
#[derive(Clone, PartialEq)]
pub enum OutcomeBytes {
    /// Up to [`SMALL_OUTCOME`] bytes, by value.
    Small {
        /// How many of `bytes` are the outcome's.
        len: u8,
        /// The outcome, then zeros.
        bytes: [u8; SMALL_OUTCOME],
    },
    /// Any other outcome.
    Shared(Buffer),
}

impl OutcomeBytes {
    /// `b` by value, when it is small enough.
    pub fn small(b: &[u8]) -> Option<OutcomeBytes> {
        let mut bytes = [0u8; SMALL_OUTCOME];
        bytes.get_mut(..b.len())?.copy_from_slice(b);
        Some(OutcomeBytes::Small {
            len: b.len() as u8,
            bytes,
        })
    }

    /// The outcome as a buffer (a small one is copied into a new one).
    pub fn into_buffer(self) -> Buffer {
        match self {
            // (A vector's buffer: `Buffer::from_slice_ref` asks for 64-byte alignment, which
            // an allocator serves more slowly.)
            OutcomeBytes::Small { len, bytes } => Buffer::from_vec(bytes[..len as usize].to_vec()),
            OutcomeBytes::Shared(b) => b,
        }
    }
}

impl Deref for OutcomeBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            OutcomeBytes::Small { len, bytes } => &bytes[..*len as usize],
            OutcomeBytes::Shared(b) => b.as_slice(),
        }
    }
}

impl From<Buffer> for OutcomeBytes {
    fn from(b: Buffer) -> OutcomeBytes {
        OutcomeBytes::Shared(b)
    }
}

impl From<OutcomeBytes> for Buffer {
    fn from(o: OutcomeBytes) -> Buffer {
        o.into_buffer()
    }
}

impl std::fmt::Debug for OutcomeBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            OutcomeBytes::Small { .. } => "small",
            OutcomeBytes::Shared(_) => "shared",
        };
        write!(f, "OutcomeBytes({kind}, {} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_outcomes_are_held_by_value_and_read_back_the_same() {
        for n in [0, 1, 7, SMALL_OUTCOME] {
            let b: Vec<u8> = (0..n as u8).collect();
            let o = OutcomeBytes::small(&b).expect("small enough");
            assert!(matches!(o, OutcomeBytes::Small { .. }));
            assert_eq!(&*o, &b[..]);
            assert_eq!(o.into_buffer().as_slice(), &b[..]);
        }
        assert!(OutcomeBytes::small(&[0u8; SMALL_OUTCOME + 1]).is_none());
    }

    #[test]
    fn a_buffer_stays_one() {
        let b = Buffer::from_vec(vec![1u8; 300]);
        let o = OutcomeBytes::from(b.clone());
        assert_eq!(&*o, b.as_slice());
        assert_eq!(Buffer::from(o), b);
    }
}
