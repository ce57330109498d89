//! A mutable slice shared by the tasks of one loop, each writing its own part.

use std::marker::PhantomData;
use std::ops::Range;

/// A `&mut [T]` handed to every task of a [`ThreadPool::run`](crate::ThreadPool::run) loop,
/// for tasks that write disjoint parts of it (output rows, attention heads). Bounds are
/// checked; disjointness is the caller's promise.
pub struct DisjointSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: it stands for a `&mut [T]` whose parts are handed to different threads, which is
// sound for `T: Send` as long as the parts are disjoint (the contract of its unsafe methods).
unsafe impl<T: Send> Sync for DisjointSlice<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for DisjointSlice<'_, T> {}

impl<'a, T> DisjointSlice<'a, T> {
    /// Borrows `slice` mutably for as long as this value lives.
    pub fn new(slice: &'a mut [T]) -> Self {
        DisjointSlice {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
            _borrow: PhantomData,
        }
    }

    /// Length of the whole slice.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements `range`, mutably.
    ///
    /// # Safety
    /// No other reference to any element of `range` (from this method or [`write`]) is alive
    /// while the returned one is.
    ///
    /// # Panics
    /// If `range` is not within the slice.
    ///
    /// [`write`]: DisjointSlice::write
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range_mut(&self, range: Range<usize>) -> &mut [T] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "range {range:?} out of a slice of {}",
            self.len
        );
        // SAFETY: in bounds (checked); exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }

    /// Stores `value` at index `i` (dropping nothing: the old value must need no drop).
    ///
    /// # Safety
    /// No other thread reads or writes index `i` meanwhile.
    ///
    /// # Panics
    /// If `i` is out of bounds.
    pub unsafe fn write(&self, i: usize, value: T)
    where
        T: Copy,
    {
        assert!(i < self.len, "index {i} out of a slice of {}", self.len);
        // SAFETY: in bounds (checked); exclusive by the caller's promise.
        unsafe { self.ptr.add(i).write(value) }
    }
}
