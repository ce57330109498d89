//! The arena pool: reuse, exclusivity across threads.

use std::collections::HashSet;
use std::sync::{Barrier, Mutex};

use tallow_arena::ArenaPool;

/// Address of the first byte an empty arena hands out: identifies its buffer.
fn buffer_of(arena: &tallow_arena::Arena) -> usize {
    assert_eq!(arena.used(), 0, "pooled arenas come back reset");
    arena.alloc_slice::<u8>(1).unwrap().as_ptr() as usize
}

#[test]
fn a_returned_arena_is_handed_out_again() {
    let pool = ArenaPool::new(4096);
    assert_eq!(pool.created(), 0);
    let first = {
        let a = pool.get();
        let buf = buffer_of(&a);
        a.alloc_slice::<f32>(100).unwrap().fill(1.0);
        assert_eq!(a.used(), 404); // 1 byte, 3 padding, 400
        buf
    };
    assert_eq!((pool.idle(), pool.created()), (1, 1));
    for _ in 0..10 {
        let a = pool.get();
        assert_eq!(buffer_of(&a), first, "same buffer, recycled");
        // Reset on return, and zero-filled on allocation.
        assert!(a.alloc_slice::<f32>(100).unwrap().iter().all(|&x| x == 0.0));
    }
    assert_eq!(pool.created(), 1);
    // A second holder at the same time gets a new, different arena.
    let a = pool.get();
    let b = pool.get();
    assert_ne!(buffer_of(&a), buffer_of(&b));
    assert_eq!((pool.idle(), pool.created()), (0, 2));
    drop((a, b));
    assert_eq!(pool.idle(), 2);
    // The high-water mark is kept across recycling.
    let (x, y) = (pool.get(), pool.get());
    assert_eq!(x.high_water_mark().max(y.high_water_mark()), 404);
}

#[test]
fn prewarmed_pool_creates_nothing_until_exhausted() {
    let pool = ArenaPool::with_arenas(1024, 3);
    assert_eq!((pool.idle(), pool.created()), (3, 3));
    let held: Vec<_> = (0..3).map(|_| pool.get()).collect();
    assert_eq!((pool.idle(), pool.created()), (0, 3));
    let extra = pool.get();
    assert_eq!(pool.created(), 4);
    assert_eq!(extra.capacity(), 1024);
    drop(held);
    drop(extra);
    assert_eq!(pool.idle(), 4);
}

#[test]
fn the_same_arena_is_never_held_twice_at_once() {
    const THREADS: usize = 10;
    const ROUNDS: usize = if cfg!(miri) { 10 } else { 300 };
    let pool = ArenaPool::new(1 << 12);
    let held = Mutex::new(HashSet::new());
    let all_buffers = Mutex::new(HashSet::new());
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (pool, held, all_buffers, barrier) = (&pool, &held, &all_buffers, &barrier);
            s.spawn(move || {
                barrier.wait();
                for round in 0..ROUNDS {
                    let arena = pool.get();
                    let buf = buffer_of(&arena);
                    assert!(
                        held.lock().unwrap().insert(buf),
                        "arena handed to two holders"
                    );
                    all_buffers.lock().unwrap().insert(buf);
                    // Fill with a tag, yield, and check nobody else wrote into it meanwhile.
                    let tag = (t * 31 + round) as u8;
                    let data: &mut [u8] = arena.alloc_slice(2000).unwrap();
                    data.fill(tag);
                    std::thread::yield_now();
                    assert!(data.iter().all(|&b| b == tag));
                    assert!(held.lock().unwrap().remove(&buf));
                    drop(arena);
                }
            });
        }
    });
    assert!(
        pool.created() <= THREADS,
        "created {} arenas",
        pool.created()
    );
    assert_eq!(pool.idle(), pool.created(), "every arena came back");
    assert_eq!(all_buffers.lock().unwrap().len(), pool.created());
}
