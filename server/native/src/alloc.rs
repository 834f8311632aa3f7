//! The transport's allocator: blocks of `BIG` bytes or more are mapped and unmapped on their
//! own, everything else goes to the C library's `malloc`.
//!
//! `tierserve serve` raises glibc's mmap and trim thresholds to 1 GiB
//! (server/runtime/allocator.py),
//! so a freed block stays in the arena of the thread that allocated it.  Request messages are
//! allocated on the transport's threads and freed after Python took them: in those arenas a
//! burst of large calls would stay resident after the burst.  Mapped on their own, they go
//! back to the OS when freed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::null_mut;

/// Blocks at least this large are mapped on their own (glibc's default mmap threshold).
pub const BIG: usize = 128 << 10;
const PAGE: usize = 4096;

pub struct MapLarge;

fn mapped(size: usize, align: usize) -> bool {
    size >= BIG && align <= PAGE
}

unsafe fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping; the result is checked.
    let p = unsafe {
        libc::mmap(null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    if p == libc::MAP_FAILED {
        null_mut()
    } else {
        p as *mut u8
    }
}

unsafe impl GlobalAlloc for MapLarge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mapped(layout.size(), layout.align()) {
            unsafe { map(layout.size()) }
        } else {
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(layout.size(), layout.align()) {
            unsafe { map(layout.size()) } // anonymous mappings are zeroed
        } else {
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mapped(layout.size(), layout.align()) {
            // SAFETY: `ptr` is a mapping of `layout.size()` bytes made by `map`.
            unsafe { libc::munmap(ptr as *mut libc::c_void, layout.size()) };
        } else {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (was, will) = (mapped(layout.size(), layout.align()), mapped(new_size, layout.align()));
        if !was && !will {
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if was && will {
            // SAFETY: `ptr` is a mapping of `layout.size()` bytes; MREMAP_MAYMOVE keeps its contents.
            let p = unsafe {
                libc::mremap(ptr as *mut libc::c_void, layout.size(), new_size, libc::MREMAP_MAYMOVE)
            };
            return if p == libc::MAP_FAILED { null_mut() } else { p as *mut u8 };
        }
        // SAFETY: the new layout keeps the alignment, and its size is nonzero (>= BIG or was).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live and at least this long; they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_their_contents_across_sizes() {
        let allocator = MapLarge;
        for (from, to) in [(100, BIG * 2), (BIG * 2, 100), (BIG, BIG * 3), (BIG * 3, BIG), (64, 4096)] {
            let layout = Layout::from_size_align(from, 8).unwrap();
            unsafe {
                let p = allocator.alloc(layout);
                assert!(!p.is_null());
                for i in 0..from {
                    *p.add(i) = (i % 251) as u8;
                }
                let q = allocator.realloc(p, layout, to);
                assert!(!q.is_null());
                for i in 0..from.min(to) {
                    assert_eq!(*q.add(i), (i % 251) as u8);
                }
                allocator.dealloc(q, Layout::from_size_align(to, 8).unwrap());
            }
        }
    }

    #[test]
    fn large_zeroed_blocks_are_zero() {
        let layout = Layout::from_size_align(BIG * 2, 64).unwrap();
        unsafe {
            let p = MapLarge.alloc_zeroed(layout);
            assert!((0..layout.size()).all(|i| *p.add(i) == 0));
            MapLarge.dealloc(p, layout);
        }
    }
}
