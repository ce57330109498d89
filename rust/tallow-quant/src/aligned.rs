//! A zeroed byte buffer for packed weights: aligned to a cache line, and, when it is large,
//! to 2 MiB with the kernel asked for transparent huge pages, so that streaming the weights
//! through every step walks few page tables.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use tallow_threads::DisjointSlice;

/// Buffers at least this large are aligned to it and asked to use huge pages.
const HUGE_PAGE: usize = 2 << 20;

/// Bytes laid out as packed weights are (see the module's documentation).
pub struct AlignedBytes {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer is owned plain bytes, like a `Vec<u8>`.
unsafe impl Send for AlignedBytes {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    /// `len` zero bytes.
    ///
    /// # Panics
    /// If the allocation fails or `len` overflows a layout, as `vec!` does.
    pub fn zeroed(len: usize) -> Self {
        let align = if len >= HUGE_PAGE { HUGE_PAGE } else { 64 };
        let layout = Layout::from_size_align(len.max(1), align).expect("buffer layout");
        // SAFETY: the layout has a nonzero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        if len >= HUGE_PAGE {
            advise_huge_pages(ptr, len);
        }
        let mut bytes = AlignedBytes { ptr, len, layout };
        // Zeroing after the advice lets the first touch of each 2 MiB fault in a huge page.
        // The kernel clears each page it faults in, which costs as much as the zeroing
        // itself: a large buffer is zeroed by every thread of the pool, a huge page at a time.
        let whole = DisjointSlice::new(bytes.as_mut_slice_uninit());
        let pages = len.div_ceil(HUGE_PAGE);
        tallow_threads::global().run(pages, &|page, _| {
            let range = page * HUGE_PAGE..len.min((page + 1) * HUGE_PAGE);
            // SAFETY: each task zeroes its own page of the buffer.
            unsafe { whole.range_mut(range) }.fill(std::mem::MaybeUninit::new(0));
        });
        bytes
    }

    /// The whole buffer, before it is initialized.
    fn as_mut_slice_uninit(&mut self) -> &mut [std::mem::MaybeUninit<u8>] {
        // SAFETY: `len` bytes owned by `self`, borrowed exclusively; `MaybeUninit` asks
        // nothing of their contents.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.len) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Asks for transparent huge pages over the whole 2 MiB pages of the buffer (a hint: the
/// kernel may refuse, and other systems have no such call).
fn advise_huge_pages(ptr: NonNull<u8>, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let span = len / HUGE_PAGE * HUGE_PAGE;
        // SAFETY: the range lies inside the allocation, which is 2 MiB aligned; the advice
        // changes how pages are backed, never their contents.
        let _ = unsafe { libc::madvise(ptr.as_ptr().cast(), span, libc::MADV_HUGEPAGE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}
