//! Cache-line padding for words that different processes write.

/// Bytes between hot words written by different sides. 128 on x86-64 because the adjacent-line
/// prefetcher pulls lines in pairs; the same value is harmless elsewhere.
pub const LINE: usize = 128;

/// `T` alone on its own (pair of) cache lines, with a stable C layout for shared memory.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct CacheLine<T>(pub T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

const _: () = assert!(std::mem::align_of::<CacheLine<u8>>() == LINE);
