//! The bump arena.

use std::alloc::{self, Layout};
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::slice;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{ArenaError, Pod};

/// Alignment of every arena's buffer (one cache line). Allocations with a larger alignment are
/// still honoured: padding is computed from the buffer's actual address.
pub const BASE_ALIGN: usize = 64;

/// A bump allocator over one pre-allocated buffer of fixed capacity.
///
/// Allocation takes `&self` and advances the offset with a compare-and-swap loop, so an `Arena`
/// can be shared between threads (`&Arena` is `Send`) that allocate concurrently; each caller gets
/// a range that no other allocation overlaps. Memory is never freed individually: [`reset`]
/// makes the whole capacity available again and needs `&mut self`, which the borrow checker only
/// grants once every allocation (each borrows the arena) is gone.
///
/// Nothing allocated from an arena is ever dropped; the typed helpers therefore only create
/// `Copy` values (which have no drop glue) or [`MaybeUninit`] slots.
///
/// [`reset`]: Arena::reset
pub struct Arena {
    /// Start of the buffer, allocated with `buffer_layout(capacity)`; owned by this arena.
    base: NonNull<u8>,
    /// Usable bytes in the buffer.
    capacity: usize,
    /// Bytes handed out (including alignment padding) since the last reset; always `<= capacity`.
    offset: AtomicUsize,
    /// Largest offset reached before the last reset (only written under `&mut self`).
    high_water: usize,
}

// SAFETY: `Arena` owns its buffer exclusively (like a `Box<[u8]>`), so moving it to another
// thread is sound. Sharing `&Arena` between threads is sound because the only mutation through
// `&self` is the atomic `offset`, and every successful compare-and-swap hands its caller a byte
// range `[start, end)` that begins at or after the previous offset and ends at the new one, so
// ranges handed out between two resets are pairwise disjoint; `reset` requires `&mut self`.
unsafe impl Send for Arena {}
// SAFETY: see `Send` above.
unsafe impl Sync for Arena {}

impl Arena {
    /// Creates an arena with a buffer of `capacity` bytes.
    ///
    /// # Panics
    /// If `capacity` is too large for a `Layout`; aborts via [`alloc::handle_alloc_error`] if
    /// the system allocator fails. Use [`Arena::try_new`] to handle both as errors.
    pub fn new(capacity: usize) -> Arena {
        match Arena::try_new(capacity) {
            Ok(arena) => arena,
            Err(ArenaError::OutOfMemory(_)) => {
                alloc::handle_alloc_error(buffer_layout(capacity).expect("layout was valid"))
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Creates an arena with a buffer of `capacity` bytes, reporting failure as an error.
    pub fn try_new(capacity: usize) -> Result<Arena, ArenaError> {
        Self::with_buffer(capacity, alloc::alloc)
    }

    /// [`Arena::try_new`] with every byte of the buffer zero (as the system hands out fresh
    /// pages, without writing them).
    pub fn try_new_zeroed(capacity: usize) -> Result<Arena, ArenaError> {
        Self::with_buffer(capacity, alloc::alloc_zeroed)
    }

    /// An arena over a buffer of `capacity` bytes from `allocate`.
    fn with_buffer(
        capacity: usize,
        allocate: unsafe fn(Layout) -> *mut u8,
    ) -> Result<Arena, ArenaError> {
        let layout = buffer_layout(capacity)?;
        // SAFETY: `layout` has a non-zero size (`buffer_layout` allocates at least one byte).
        let raw = unsafe { allocate(layout) };
        let base = NonNull::new(raw).ok_or(ArenaError::OutOfMemory(capacity))?;
        Ok(Arena {
            base,
            capacity,
            offset: AtomicUsize::new(0),
            high_water: 0,
        })
    }

    /// Total bytes this arena can hand out between resets.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes handed out since the last reset, including alignment padding.
    pub fn used(&self) -> usize {
        self.offset.load(Ordering::Relaxed)
    }

    /// Bytes still available (an allocation may need some of them for alignment padding).
    pub fn remaining(&self) -> usize {
        self.capacity - self.used()
    }

    /// The largest [`used`](Arena::used) value this arena has reached since it was created,
    /// across resets: the capacity a workload actually needs.
    pub fn high_water_mark(&self) -> usize {
        self.high_water.max(self.used())
    }

    /// Makes the whole capacity available again. Requires exclusive access, so no allocation
    /// from before the reset can still be borrowed.
    pub fn reset(&mut self) {
        let used = self.offset.get_mut();
        self.high_water = self.high_water.max(*used);
        *used = 0;
    }

    /// Writes zeros to the first `len` bytes of the buffer (all of it if it is shorter), so
    /// that the system maps its pages now rather than at their first use.
    pub fn touch(&mut self, len: usize) {
        // SAFETY: the buffer is valid for `capacity` bytes and `&mut self` means no slice of it
        // is borrowed; any byte pattern is a valid `u8`.
        unsafe { ptr::write_bytes(self.base.as_ptr(), 0, len.min(self.capacity)) };
    }

    /// Allocates `layout.size()` bytes aligned to `layout.align()` (any power of two).
    ///
    /// Returns `None`, leaving the arena unchanged, if the request does not fit in what remains.
    /// A zero-sized request always succeeds, consumes nothing, and returns a dangling pointer
    /// aligned to `layout.align()`. The returned memory is uninitialized and stays valid, and
    /// disjoint from every other allocation, until the next [`reset`](Arena::reset); the
    /// pointer itself does not borrow the arena, so prefer the slice helpers, which do.
    pub fn alloc(&self, layout: Layout) -> Option<NonNull<u8>> {
        let size = layout.size();
        let align = layout.align();
        if size == 0 {
            return NonNull::new(ptr::without_provenance_mut(align));
        }
        let base_addr = self.base.as_ptr().addr();
        let mut current = self.offset.load(Ordering::Relaxed);
        loop {
            // Padding that moves `base + current` up to a multiple of `align` (a power of two).
            let pad = base_addr.wrapping_add(current).wrapping_neg() & (align - 1);
            let start = current.checked_add(pad)?;
            let end = start.checked_add(size)?;
            if end > self.capacity {
                return None;
            }
            // Relaxed suffices: the offset publishes no data, it only has to give each caller a
            // distinct range, which the total modification order of one atomic guarantees.
            match self.offset.compare_exchange_weak(
                current,
                end,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // SAFETY: `start < end <= capacity`, so `base + start` stays inside the
                    // buffer allocation (which cannot wrap around the address space).
                    return Some(unsafe { self.base.add(start) });
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Allocates an uninitialized slice of `len` values of any `T`.
    ///
    /// Returns `None` if `len` values do not fit (or their size overflows). Values written into
    /// the slice are never dropped.
    // `&mut` from `&self` is the point of a shared bump allocator: each call returns a range no
    // other call can ever return (until `reset`, which needs `&mut self`), as in `bumpalo`.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_uninit_slice<T>(&self, len: usize) -> Option<&mut [MaybeUninit<T>]> {
        let layout = Layout::array::<T>(len).ok()?;
        let ptr = self.alloc(layout)?.cast::<MaybeUninit<T>>();
        // SAFETY: `ptr` is aligned for `T` and valid for `len * size_of::<T>()` bytes (a
        // dangling aligned pointer when that is zero, which is valid for a zero-byte slice).
        // The range belongs to this caller alone (see `alloc`) and stays allocated until
        // `reset`, which needs `&mut self` and so cannot run while the returned borrow of `self`
        // lives. `MaybeUninit<T>` requires no initialization.
        Some(unsafe { slice::from_raw_parts_mut(ptr.as_ptr(), len) })
    }

    /// Allocates a zero-filled slice of `len` plain-old-data values.
    // `&mut` from `&self` is the point of a shared bump allocator: each call returns a range no
    // other call can ever return (until `reset`, which needs `&mut self`), as in `bumpalo`.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_slice<T: Pod>(&self, len: usize) -> Option<&mut [T]> {
        let uninit = self.alloc_uninit_slice::<T>(len)?;
        // SAFETY: zero-filling writes every byte of the slice, and `T: Pod` guarantees that
        // all-zero bytes are a valid `T`, so the slice is fully initialized before it is
        // reinterpreted (`MaybeUninit<T>` has the same layout as `T`).
        unsafe {
            ptr::write_bytes(uninit.as_mut_ptr(), 0, len);
            Some(&mut *(uninit as *mut [MaybeUninit<T>] as *mut [T]))
        }
    }

    /// Allocates a slice of `len` plain-old-data values holding whatever bytes the buffer
    /// holds there (zeros, or what an earlier round wrote): for a caller that writes every value
    /// before it reads one, without the cost of zeroing them first.
    ///
    /// # Safety
    /// Every byte of the range must be initialized: the buffer came from
    /// [`Arena::try_new_zeroed`], and has been written since only through slices of [`Pod`]
    /// values (which have no padding), never through [`Arena::alloc`] or
    /// [`Arena::alloc_uninit_slice`].
    // `&mut` from `&self`: as `alloc_slice`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn alloc_slice_as_is<T: Pod>(&self, len: usize) -> Option<&mut [T]> {
        let uninit = self.alloc_uninit_slice::<T>(len)?;
        // SAFETY: the caller guarantees the bytes are initialized, and `T: Pod` makes every
        // initialized byte pattern a valid `T`.
        Some(unsafe { &mut *(uninit as *mut [MaybeUninit<T>] as *mut [T]) })
    }

    /// Allocates a slice holding a copy of `src`.
    // `&mut` from `&self` is the point of a shared bump allocator: each call returns a range no
    // other call can ever return (until `reset`, which needs `&mut self`), as in `bumpalo`.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_slice_copy<T: Copy>(&self, src: &[T]) -> Option<&mut [T]> {
        let uninit = self.alloc_uninit_slice::<T>(src.len())?;
        // SAFETY: `uninit` is a fresh arena range of `src.len()` slots, so it cannot overlap
        // `src` (which is borrowed from elsewhere, or from an earlier, disjoint arena range);
        // after the copy every slot holds a valid `T`, so the slice may be reinterpreted.
        unsafe {
            ptr::copy_nonoverlapping(src.as_ptr(), uninit.as_mut_ptr().cast::<T>(), src.len());
            Some(&mut *(uninit as *mut [MaybeUninit<T>] as *mut [T]))
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let layout = buffer_layout(self.capacity).expect("layout was valid at construction");
        // SAFETY: `base` was allocated in `try_new` with this same layout and is freed once.
        unsafe { alloc::dealloc(self.base.as_ptr(), layout) };
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("capacity", &self.capacity)
            .field("used", &self.used())
            .field("high_water_mark", &self.high_water_mark())
            .finish()
    }
}

/// The layout of an arena's buffer: at least one byte, so that the system allocator may be
/// called even for a zero-capacity arena.
fn buffer_layout(capacity: usize) -> Result<Layout, ArenaError> {
    Layout::from_size_align(capacity.max(1), BASE_ALIGN)
        .map_err(|_| ArenaError::CapacityTooLarge(capacity))
}
