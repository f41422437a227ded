//! The allocator of this module's own (Rust) allocations: mimalloc.
//!
//! A pipelined caller holds thousands of small outcomes at once (a task's cell, its payload
//! buffer) and frees them later in a burst; glibc's per-thread cache keeps only a few blocks
//! of each size, so most of those went through its slower paths (10–20% of a pipelined
//! task's instructions in the caller). Python's own objects are not affected: they use
//! Python's allocators.
//!
//! The `mimalloc` crate's allocator asks for every block through mimalloc's aligned entry,
//! whose fast path only finds an existing page of the block's size, and whose slow path
//! over-allocates unless the size is a power of two — so a size no plain allocation ever
//! made a page for (an 80-byte task cell) took the slow path every time. A block aligned to
//! at most 8 bytes is what every plain mimalloc block is already (each is a multiple of
//! 8 bytes from a page's 16-aligned start): those go through the plain entries here.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every plain mimalloc block has.
const PLAIN_ALIGN: usize = 8;

/// mimalloc, through its plain entries where the alignment allows.
pub struct Mimalloc;

// SAFETY: every block comes from mimalloc, aligned as asked (a plain block is aligned to
// `PLAIN_ALIGN`, see above; larger alignments go through the aligned entries), and is freed
// or resized by mimalloc, which takes either kind.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN {
            // SAFETY: any size may be asked of mimalloc; null reports failure, as required.
            unsafe { mi::mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: as above; the alignment is a power of two (a `Layout`'s always is).
            unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN {
            // SAFETY: as for `alloc`.
            unsafe { mi::mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: as for `alloc`.
            unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the caller's contract: `ptr` came from this allocator, i.e. from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN {
            // SAFETY: `ptr` came from mimalloc (the caller's contract); the new block is a
            // plain one, aligned enough.
            unsafe { mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast() }
        } else {
            // SAFETY: as above, keeping the block's alignment.
            unsafe { mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast() }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_as_asked() {
        for align in [1, 2, 4, 8, 16, 64, 4096] {
            for size in [1, 7, 8, 24, 80, 100, 1000, 70_000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; each block is freed once, with its layout.
                unsafe {
                    let p = Mimalloc.alloc(layout);
                    assert!(!p.is_null() && (p as usize).is_multiple_of(align));
                    p.write_bytes(1, size);
                    let q = Mimalloc.realloc(p, layout, size * 3);
                    assert!(!q.is_null() && (q as usize).is_multiple_of(align));
                    assert_eq!(*q.add(size - 1), 1);
                    Mimalloc.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                    let z = Mimalloc.alloc_zeroed(layout);
                    assert!((z as usize).is_multiple_of(align) && *z.add(size - 1) == 0);
                    Mimalloc.dealloc(z, layout);
                }
            }
        }
    }
}
