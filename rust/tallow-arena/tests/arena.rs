//! Behaviour of a single arena: alignment, exhaustion, reset, typed helpers, concurrency, and a
//! property test against a simple model.

use std::alloc::Layout;
use std::sync::Barrier;

use proptest::prelude::*;
use tallow_arena::Arena;

/// Small deterministic generator (splitmix64), so the tests need no `rand`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Address of the arena's buffer start, found by allocating one byte from an empty arena.
fn base_addr(arena: &mut Arena) -> usize {
    arena.reset();
    let p = arena.alloc(Layout::new::<u8>()).unwrap().as_ptr() as usize;
    arena.reset();
    p
}

#[test]
fn every_pointer_is_aligned_for_alignments_1_to_4096() {
    let arena = Arena::new(1 << 20);
    for shift in 0..=12 {
        let align = 1usize << shift;
        // A one-byte allocation first, so the next one needs padding whenever align > 1.
        arena.alloc(Layout::from_size_align(1, 1).unwrap()).unwrap();
        for size in [1, 3, align, align + 1] {
            let before = arena.used();
            let p = arena
                .alloc(Layout::from_size_align(size, align).unwrap())
                .unwrap();
            assert_eq!(p.as_ptr() as usize % align, 0, "size {size} align {align}");
            // Padding is less than the alignment, and the allocation is exactly `size` long.
            assert!(arena.used() - before >= size);
            assert!(arena.used() - before < size + align);
        }
    }
}

#[test]
fn typed_slices_are_aligned_and_zeroed() {
    let arena = Arena::new(4096);
    arena.alloc_slice_copy(&[0xffu8; 3]).unwrap();
    let f: &mut [f32] = arena.alloc_slice(7).unwrap();
    assert_eq!(f.as_ptr() as usize % 4, 0);
    assert_eq!(f, &[0.0; 7]);
    f[6] = 1.5;
    let h: &mut [u16] = arena.alloc_slice(5).unwrap();
    assert_eq!(h.as_ptr() as usize % 2, 0);
    assert_eq!(h, &[0; 5]);
    let q: &mut [u64] = arena.alloc_slice(2).unwrap();
    assert_eq!(q.as_ptr() as usize % 8, 0);
    let c = arena.alloc_slice_copy(&[1i32, -2, 3]).unwrap();
    assert_eq!(c, &[1, -2, 3]);
    assert_eq!(f[6], 1.5, "later allocations must not clobber earlier ones");
}

#[test]
fn memory_is_zeroed_again_after_reset() {
    let mut arena = Arena::new(256);
    arena.alloc_slice::<u8>(256).unwrap().fill(0xAB);
    arena.reset();
    let again: &mut [u8] = arena.alloc_slice(256).unwrap();
    assert!(again.iter().all(|&b| b == 0));
}

#[test]
fn exhaustion_returns_none_and_leaves_the_arena_usable() {
    let arena = Arena::new(1000);
    assert!(arena.alloc_slice::<u8>(600).is_some());
    assert_eq!(arena.used(), 600);
    assert!(arena.alloc_slice::<u8>(401).is_none());
    assert_eq!(
        arena.used(),
        600,
        "a failed request must not consume anything"
    );
    assert!(arena.alloc_slice::<f32>(101).is_none()); // 404 bytes
    assert_eq!(arena.used(), 600);
    // Overflowing sizes are refused, not wrapped.
    assert!(arena.alloc_slice::<u64>(usize::MAX / 4).is_none());
    assert!(arena.alloc_uninit_slice::<u8>(usize::MAX).is_none());
    assert_eq!(arena.used(), 600);
    // What remains is still usable, to the last byte.
    let rest: &mut [u8] = arena.alloc_slice(400).unwrap();
    assert_eq!(rest.len(), 400);
    assert_eq!(arena.remaining(), 0);
    assert!(arena.alloc_slice::<u8>(1).is_none());
}

#[test]
fn alignment_padding_that_does_not_fit_is_refused() {
    let mut arena = Arena::new(128);
    let base = base_addr(&mut arena);
    assert_eq!(base % 64, 0, "buffers are cache-line aligned");
    arena.alloc(Layout::from_size_align(1, 1).unwrap()).unwrap();
    // 64-aligned needs 63 bytes of padding: 1 + 63 + 64 = 128 fits, 65 does not.
    assert!(arena
        .alloc(Layout::from_size_align(65, 64).unwrap())
        .is_none());
    assert_eq!(arena.used(), 1);
    let p = arena
        .alloc(Layout::from_size_align(64, 64).unwrap())
        .unwrap();
    assert_eq!(p.as_ptr() as usize, base + 64);
    assert_eq!(arena.used(), 128);
}

#[test]
fn reset_makes_the_whole_capacity_available_again() {
    let mut arena = Arena::new(4096);
    for _ in 0..3 {
        let a: &mut [u32] = arena.alloc_slice(1024).unwrap();
        assert_eq!(a.len(), 1024);
        assert!(arena.alloc_slice::<u8>(1).is_none());
        assert_eq!(arena.used(), 4096);
        arena.reset();
        assert_eq!(arena.used(), 0);
        assert_eq!(arena.remaining(), 4096);
    }
    assert_eq!(arena.high_water_mark(), 4096);
}

#[test]
fn high_water_mark_survives_resets() {
    let mut arena = Arena::new(1000);
    assert_eq!(arena.high_water_mark(), 0);
    arena.alloc_slice::<u8>(300).unwrap();
    arena.reset();
    arena.alloc_slice::<u8>(100).unwrap();
    assert_eq!(arena.used(), 100);
    assert_eq!(arena.high_water_mark(), 300);
    arena.alloc_slice::<u8>(400).unwrap();
    assert_eq!(arena.high_water_mark(), 500);
    assert_eq!(arena.capacity(), 1000);
}

#[test]
fn zero_sized_requests_succeed_and_consume_nothing() {
    let arena = Arena::new(16);
    arena.alloc_slice::<u8>(16).unwrap(); // full
    for shift in 0..=12 {
        let align = 1usize << shift;
        let p = arena
            .alloc(Layout::from_size_align(0, align).unwrap())
            .unwrap();
        assert_eq!(p.as_ptr() as usize % align, 0);
    }
    assert_eq!(arena.alloc_slice::<f32>(0).unwrap().len(), 0);
    assert_eq!(arena.alloc_slice_copy::<u8>(&[]).unwrap().len(), 0);
    assert_eq!(
        arena.alloc_uninit_slice::<()>(1_000_000).unwrap().len(),
        1_000_000
    );
    assert_eq!(arena.used(), 16);

    let empty = Arena::new(0);
    assert_eq!(empty.capacity(), 0);
    assert!(empty.alloc_slice::<u8>(0).is_some());
    assert!(empty.alloc_slice::<u8>(1).is_none());
}

#[test]
fn capacity_too_large_is_an_error() {
    assert!(matches!(
        Arena::try_new(usize::MAX),
        Err(tallow_arena::ArenaError::CapacityTooLarge(_))
    ));
}

/// Many threads allocating from one shared arena get pairwise disjoint ranges that, with
/// alignment 1, add up exactly to `used()`; with random alignments they end exactly at `used()`.
#[test]
fn concurrent_allocations_never_overlap() {
    const THREADS: usize = 12;
    for (round, random_align) in [(0u64, false), (1, true), (2, false), (3, true)] {
        // Miri is ~1000x slower: a smaller arena still gives hundreds of racing allocations.
        let capacity = if cfg!(miri) { 1 << 14 } else { 1 << 22 };
        let arena = Arena::new(capacity);
        let base = arena.alloc(Layout::new::<u8>()).unwrap().as_ptr() as usize;
        let barrier = Barrier::new(THREADS);
        let mut ranges: Vec<(usize, usize)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let arena = &arena;
                    let barrier = &barrier;
                    s.spawn(move || {
                        let mut rng = Rng(round * 1000 + t as u64);
                        let mut mine = Vec::new();
                        barrier.wait();
                        loop {
                            let size = 1 + rng.below(300) as usize;
                            let align = if random_align { 1 << rng.below(8) } else { 1 };
                            let layout = Layout::from_size_align(size, align).unwrap();
                            match arena.alloc(layout) {
                                Some(p) => {
                                    let start = p.as_ptr() as usize;
                                    assert_eq!(start % align, 0);
                                    // Stamp the range; a later check finds any overlap that
                                    // the address comparison might somehow miss.
                                    // SAFETY: the range was just handed to this thread alone.
                                    unsafe { p.as_ptr().write_bytes(t as u8, size) };
                                    mine.push((start, size, t as u8));
                                }
                                None => break,
                            }
                        }
                        mine
                    })
                })
                .collect();
            let mut all = Vec::new();
            for h in handles {
                for (start, len, tag) in h.join().unwrap() {
                    // SAFETY: every range is inside the live arena and was fully written.
                    let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, len) };
                    assert!(
                        bytes.iter().all(|&b| b == tag),
                        "range overwritten by another"
                    );
                    all.push((start, len));
                }
            }
            all
        });
        assert!(ranges.len() > capacity / 300, "threads did allocate");
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0,
                "overlap: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
        for &(start, len) in &ranges {
            assert!(start > base && start + len <= base + arena.capacity());
        }
        let last = ranges.last().unwrap();
        assert_eq!(last.0 + last.1 - base, arena.used());
        if !random_align {
            let total: usize = ranges.iter().map(|r| r.1).sum();
            assert_eq!(total + 1, arena.used()); // + the one-byte probe
        }
        // Threads stop on their first `None`, so the arena is nearly full.
        assert!(arena.remaining() < 300 + 128);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, align_shift: u32 },
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0usize..200, 0u32..=12).prop_map(|(size, align_shift)| Op::Alloc { size, align_shift }),
        1 => Just(Op::Reset),
    ]
}

proptest! {
    /// Every allocation lands exactly where a simple sequential model says, fails exactly when
    /// the model says it does not fit, and keeps its contents until the next reset.
    #[test]
    fn allocations_match_a_sequential_model(
        capacity in 1usize..2048, // capacity 0 is covered by `zero_sized_requests_...`
        ops in proptest::collection::vec(op(), 0..200),
    ) {
        let mut arena = Arena::new(capacity);
        let base = base_addr(&mut arena);
        let mut offset = 0usize; // model
        let mut high = 1usize; // model (`base_addr` allocated one byte)
        let mut live: Vec<(usize, usize, u8)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc { size, align_shift } => {
                    let align = 1usize << align_shift;
                    let got = arena.alloc(Layout::from_size_align(size, align).unwrap());
                    if size == 0 {
                        let p = got.expect("zero-sized always succeeds").as_ptr() as usize;
                        prop_assert_eq!(p % align, 0);
                        continue;
                    }
                    let start = (base + offset).next_multiple_of(align) - base;
                    if start + size <= capacity {
                        let p = got.expect("model says it fits").as_ptr();
                        prop_assert_eq!(p as usize, base + start);
                        let tag = i as u8;
                        // SAFETY: the range was just handed out and is `size` bytes long.
                        unsafe { p.write_bytes(tag, size) };
                        live.push((p as usize, size, tag));
                        offset = start + size;
                        high = high.max(offset);
                    } else {
                        prop_assert!(got.is_none());
                    }
                }
                Op::Reset => {
                    arena.reset();
                    offset = 0;
                    live.clear();
                }
            }
            prop_assert_eq!(arena.used(), offset);
            prop_assert_eq!(arena.remaining(), capacity - offset);
            prop_assert_eq!(arena.high_water_mark(), high);
        }
        for (start, len, tag) in live {
            // SAFETY: live ranges are inside the arena and were fully written.
            let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, len) };
            prop_assert!(bytes.iter().all(|&b| b == tag));
        }
    }
}
