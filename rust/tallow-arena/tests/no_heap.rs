//! Allocating from an arena, and taking/returning a pooled arena once the pool is warm, make no
//! heap allocation. A counting global allocator counts allocations made by the current thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tallow_arena::{Arena, ArenaPool};

struct Counting;

thread_local! {
    // `const` initialization: reading it never allocates, so the allocator may use it.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to `System` unchanged; it only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is passed on to `System`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

/// Runs `f` and returns how many heap allocations this thread made meanwhile.
fn count(f: impl FnOnce()) -> usize {
    let before = allocations();
    f();
    allocations() - before
}

#[test]
fn the_counter_sees_heap_allocations() {
    // Without this, a broken counter would make the zero-allocation tests pass vacuously.
    assert_eq!(count(|| drop(std::hint::black_box(vec![0u8; 64]))), 1);
    assert_eq!(count(|| drop(std::hint::black_box(Arena::new(1024)))), 1);
}

#[test]
fn allocating_from_an_arena_makes_no_heap_allocation() {
    let mut arena = Arena::new(1 << 20);
    let n = count(|| {
        for step in 0..100 {
            let x: &mut [f32] = arena.alloc_slice(4096).unwrap();
            let q: &mut [i8] = arena.alloc_slice(4096).unwrap();
            let h: &mut [u16] = arena.alloc_slice(4096).unwrap();
            let ids = arena.alloc_slice_copy(&[1u32, 2, 3, step]).unwrap();
            let raw = arena.alloc_uninit_slice::<u64>(100).unwrap();
            x[0] = 1.0;
            q[0] = 1;
            h[0] = 1;
            std::hint::black_box((x, q, h, ids, raw));
            assert!(arena.alloc_slice::<u8>(1 << 21).is_none());
            arena.reset();
        }
    });
    assert_eq!(n, 0);
}

#[test]
fn a_warm_pool_makes_no_heap_allocation() {
    let pool = ArenaPool::new(1 << 16);
    // Warm up: three arenas in use at once, then returned.
    drop((pool.get(), pool.get(), pool.get()));
    assert_eq!(pool.created(), 3);
    let n = count(|| {
        for _ in 0..100 {
            let a = pool.get();
            let b = pool.get();
            let c = pool.get();
            let x: &mut [f32] = a.alloc_slice(1000).unwrap();
            let y: &mut [f32] = b.alloc_slice(1000).unwrap();
            x[0] = 1.0;
            y[0] = 2.0;
            std::hint::black_box((x, y, &c));
            // Returned in a different order than taken.
            drop(b);
            drop(a);
            drop(c);
        }
    });
    assert_eq!(n, 0);
    assert_eq!(pool.created(), 3);
    // Returning arenas never allocates, even the first time: room in the idle list is reserved
    // when an arena is created.
    let fresh = ArenaPool::new(1024);
    let held: Vec<_> = (0..9).map(|_| fresh.get()).collect();
    let mut held = std::hint::black_box(held);
    assert_eq!(count(|| held.drain(..).for_each(drop)), 0);
    assert_eq!(fresh.idle(), 9);
    // A cold pool does allocate (a buffer, and room in the idle list): the counter can see it.
    let cold = ArenaPool::new(1 << 16);
    assert!(count(|| drop(cold.get())) >= 1);
}
