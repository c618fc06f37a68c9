//! With the `alloc-count` feature only: a global allocator that counts the
//! heap allocations kiln's own code makes (ORT's go through its own
//! allocator and are not seen), readable through `kiln_ep_alloc_count`.
//! Tests use it to check that a warmed-up `Run` allocates nothing (issue #14).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

struct Counting;

// SAFETY: forwards every call unchanged to the system allocator; the counter
// has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap allocations (including reallocations) kiln made since the library
/// was loaded. Exported only by builds with the `alloc-count` feature and
/// kept out of `kiln_ep.h` (cbindgen.toml excludes it).
#[no_mangle]
pub extern "C" fn kiln_ep_alloc_count() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}
