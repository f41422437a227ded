//! Copies of large buffers into shared memory, split across threads.
//!
//! A large value is copied once, into a region its readers map, and on the machines mizu runs
//! on one core's copy does not reach the memory's bandwidth: measured here (numpy's `copyto`
//! of 100 MB, halves on two threads against one), two threads took 0.47–0.69x the time of
//! one. Below [`SPLIT_FROM`] a thread's start costs more than it saves, so smaller copies stay
//! on the calling thread.

use std::sync::{Mutex, OnceLock};

/// Copies at least this long are split.
pub const SPLIT_FROM: usize = 16 << 20;
/// Each thread copies at least this much.
const PIECE: usize = 8 << 20;
/// At most this many threads copy one buffer (more bring nothing once memory is saturated).
const MOST: usize = 4;

fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `dst.copy_from_slice(src)`, on up to [`MOST`] threads (the caller's among them) when
/// `src` is at least [`SPLIT_FROM`] long and the machine has more than one CPU. A thread that
/// cannot be started leaves its piece to the caller.
///
/// # Panics
/// When the lengths differ, as `copy_from_slice` does.
pub fn copy_large(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_large: lengths differ");
    let threads = cpus().min(MOST).min(src.len() / PIECE);
    if src.len() < SPLIT_FROM || threads < 2 {
        dst.copy_from_slice(src);
        return;
    }
    // Pieces a whole number of pages long (the last takes the rest). The threads take pieces
    // until none is left, the caller too: a thread that cannot be started leaves its piece to
    // the others.
    let piece = (src.len() / threads).next_multiple_of(4096);
    let pieces: Mutex<Vec<(&mut [u8], &[u8])>> =
        Mutex::new(dst.chunks_mut(piece).zip(src.chunks(piece)).collect());
    let take = || {
        loop {
            let next = pieces.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let Some((d, s)) = next else { break };
            d.copy_from_slice(s);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            let _ = std::thread::Builder::new()
                .name("mizu-copy".into())
                .spawn_scoped(s, take);
        }
        take();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_copy_is_the_copy() {
        for n in [
            0,
            1,
            4095,
            SPLIT_FROM - 1,
            SPLIT_FROM,
            SPLIT_FROM + 12345,
            3 * SPLIT_FROM + 7,
        ] {
            let src: Vec<u8> = (0..n).map(|i| (i * 31 + i / 4096) as u8).collect();
            let mut dst = vec![0u8; n];
            copy_large(&mut dst, &src);
            assert!(dst == src, "copy of {n} bytes");
        }
    }
}
