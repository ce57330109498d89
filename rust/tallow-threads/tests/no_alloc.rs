//! A loop makes no heap allocation, on any thread, once the pool is running.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use tallow_threads::ThreadPool;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn loops_allocate_nothing() {
    let pool = ThreadPool::new(3);
    let sum = AtomicUsize::new(0);
    let task = |i: usize, _| {
        sum.fetch_add(i, Ordering::Relaxed);
    };
    pool.run(64, &task);
    std::thread::sleep(std::time::Duration::from_millis(5)); // let the workers fall asleep once
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..1000 {
        pool.run(64, &task);
    }
    std::thread::sleep(std::time::Duration::from_millis(5));
    pool.run(64, &task);
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst) - before, 0);
    assert_eq!(sum.into_inner(), 1002 * 64 * 63 / 2);
}
