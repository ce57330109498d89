//! An arena that does not run out: what does not fit its buffer gets a buffer of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::arena::Arena;
use crate::error::ArenaError;
use crate::pod::Pod;

/// An [`Arena`] whose allocations beyond its buffer are served from extra buffers, one per
/// allocation, kept until the next [`GrowingArena::reset`]; that reset replaces the main buffer
/// with one that holds what the round took in all (and half as much again). So a round of
/// allocations never fails for want of room, and once a round of some size has run, later
/// rounds of that size or smaller make no heap allocation.
#[derive(Debug)]
pub struct GrowingArena {
    /// Every byte of it initialized: created zeroed, and written since only through the
    /// slices of [`Pod`] values this arena hands out (which [`GrowingArena::alloc_slice_as_is`]
    /// relies on).
    main: Arena,
    /// Buffers of the allocations that did not fit `main`. Each is only ever pushed, and
    /// dropped by `reset` alone.
    extra: Mutex<Vec<Arena>>,
    /// Bytes the extra buffers hold, with their alignment slack.
    extra_bytes: AtomicUsize,
}

impl Default for GrowingArena {
    fn default() -> Self {
        Self::new()
    }
}

impl GrowingArena {
    /// An empty arena: its first round sizes it.
    pub fn new() -> Self {
        GrowingArena {
            main: Arena::try_new_zeroed(0).expect("an empty arena allocates one byte"),
            extra: Mutex::new(Vec::new()),
            extra_bytes: AtomicUsize::new(0),
        }
    }

    /// Bytes of the main buffer.
    pub fn capacity(&self) -> usize {
        self.main.capacity()
    }

    /// Allocates a zero-filled slice of `len` plain-old-data values, from the main buffer if it
    /// fits, else from a buffer of its own. Fails only when the system cannot give the memory.
    // `&mut` from `&self`: each call returns memory no other call returns until `reset`, which
    // needs `&mut self` (as `Arena::alloc_slice`).
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_slice<T: Pod>(&self, len: usize) -> Result<&mut [T], ArenaError> {
        match self.main.alloc_slice(len) {
            Some(slice) => Ok(slice),
            None => self.alloc_extra(len),
        }
    }

    /// A zero-filled slice of `len` values from a buffer of its own, for an allocation the
    /// main buffer does not hold.
    #[allow(clippy::mut_from_ref)]
    fn alloc_extra<T: Pod>(&self, len: usize) -> Result<&mut [T], ArenaError> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .and_then(|b| b.checked_add(align_of::<T>()))
            .ok_or(ArenaError::CapacityTooLarge(usize::MAX))?;
        let arena = Arena::try_new(bytes)?;
        let slice: *mut [T] = arena
            .alloc_slice::<T>(len)
            .expect("a buffer sized for the allocation holds it");
        self.extra_bytes.fetch_add(bytes, Ordering::Relaxed);
        // Moving `arena` into the list moves its handle, not its buffer, which `slice` points
        // into; the buffer is freed only by `reset` (`&mut self`) or drop, after every borrow
        // of `self`, and so every returned slice, has ended.
        self.extra
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(arena);
        // SAFETY: `slice` is a zero-filled, initialized range of `len` values of `T`, owned by
        // this call alone, valid for as long as `self` is borrowed (see above).
        Ok(unsafe { &mut *slice })
    }

    /// [`GrowingArena::alloc_slice`] without zeroing the values where they come from the main
    /// buffer: they hold zeros or what an earlier round wrote, for a caller that writes every
    /// value before it reads one.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_slice_as_is<T: Pod>(&self, len: usize) -> Result<&mut [T], ArenaError> {
        // SAFETY: `main`'s bytes are all initialized (see its field).
        match unsafe { self.main.alloc_slice_as_is(len) } {
            Some(slice) => Ok(slice),
            None => self.alloc_extra(len),
        }
    }

    /// Makes the whole arena available again; if the last round went beyond the main buffer,
    /// the main buffer grows to hold all of it. Requires exclusive access, so no allocation
    /// from before the reset can still be borrowed.
    pub fn reset(&mut self) -> Result<(), ArenaError> {
        let extra = std::mem::take(self.extra_bytes.get_mut());
        let extras = self
            .extra
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if extra == 0 {
            self.main.reset();
            return Ok(());
        }
        extras.clear();
        let needed = self.main.used().saturating_add(extra);
        // Half as much again, and at least double, so that a slowly growing context does not
        // reallocate at every round.
        let capacity = needed
            .saturating_add(needed / 2 + 4096)
            .max(self.main.capacity().saturating_mul(2));
        // The old buffer goes first, so both are never held at once.
        self.main = Arena::try_new_zeroed(0)?;
        self.main = Arena::try_new_zeroed(capacity)?;
        // The bytes the next round of this size takes are written once now, at the end of the
        // round that grew the arena: left to the next round, each of their pages would be
        // faulted in (and zeroed by the kernel) in the middle of its work.
        self.main.touch(needed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_beyond_the_buffer_succeeds_and_the_next_fits() {
        let mut arena = GrowingArena::new();
        {
            let a: &mut [u32] = arena.alloc_slice(1000).unwrap();
            let b: &mut [f64] = arena.alloc_slice(3000).unwrap();
            a.iter_mut().for_each(|v| *v = 7);
            b.iter_mut().for_each(|v| *v = 1.5);
            assert!(a.iter().all(|&v| v == 7) && b.iter().all(|&v| v == 1.5));
            assert_eq!(b.as_ptr().addr() % align_of::<f64>(), 0);
        }
        arena.reset().unwrap();
        assert!(arena.capacity() >= 4000 + 24_000);
        let capacity = arena.capacity();
        let a: &mut [u32] = arena.alloc_slice(1000).unwrap();
        let b: &mut [f64] = arena.alloc_slice(3000).unwrap();
        // Zeroed again, and from the main buffer now.
        assert!(a.iter().all(|&v| v == 0) && b.iter().all(|&v| v == 0.0));
        assert_eq!(arena.extra_bytes.load(Ordering::Relaxed), 0);
        arena.reset().unwrap();
        assert_eq!(arena.capacity(), capacity);
    }

    #[test]
    fn as_is_slices_keep_what_the_last_round_wrote() {
        let mut arena = GrowingArena::new();
        // Beyond the empty main buffer: zeroed.
        assert!(arena
            .alloc_slice_as_is::<u32>(1000)
            .unwrap()
            .iter()
            .all(|&v| v == 0));
        arena.reset().unwrap();
        arena.alloc_slice::<u32>(1000).unwrap().fill(9);
        arena.reset().unwrap();
        let kept = arena.alloc_slice_as_is::<u32>(1000).unwrap();
        assert!(kept.iter().all(|&v| v == 9));
        kept.fill(5);
        arena.reset().unwrap();
        assert!(arena
            .alloc_slice::<u32>(1000)
            .unwrap()
            .iter()
            .all(|&v| v == 0));
    }

    #[test]
    fn threads_allocate_at_once() {
        let mut arena = GrowingArena::new();
        for _ in 0..2 {
            std::thread::scope(|s| {
                for t in 0..4u32 {
                    let arena = &arena;
                    s.spawn(move || {
                        let mine: Vec<&mut [u32]> =
                            (0..50).map(|_| arena.alloc_slice(100).unwrap()).collect();
                        for slice in mine {
                            slice.iter_mut().for_each(|v| *v = t);
                            assert!(slice.iter().all(|&v| v == t));
                        }
                    });
                }
            });
            arena.reset().unwrap();
        }
    }
}
