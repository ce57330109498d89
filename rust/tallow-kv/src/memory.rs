//! Pool-sized allocations that fail with [`KvError::OutOfMemory`] instead of aborting the
//! process, as `vec![x; n]` does when the allocator refuses.

use crate::error::{KvError, Result};

/// Element types whose all-zero bit pattern is a valid zero value.
pub trait ZeroBits: Copy {}
impl ZeroBits for u8 {}
impl ZeroBits for u16 {}
impl ZeroBits for u32 {}
impl ZeroBits for f32 {}

fn out_of_memory<T>(n: usize) -> KvError {
    KvError::OutOfMemory {
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    }
}

/// `n` zeros in one allocation. The memory comes zeroed from the allocator, so the parts of a
/// pool that are never written take no physical memory.
pub fn zeroed<T: ZeroBits>(n: usize) -> Result<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| out_of_memory::<T>(n))?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(out_of_memory::<T>(n));
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `n` values of `T`
    // (capacity `n`), and all `n` are initialized: all-zero bits are a valid `T`.
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// The `n` values of `values`, in a vector allocated up front.
pub(crate) fn collect<T>(n: usize, values: impl IntoIterator<Item = T>) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| out_of_memory::<T>(n))?;
    out.extend(values.into_iter().take(n));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_vectors_are_zero() {
        assert_eq!(zeroed::<u32>(5).unwrap(), vec![0; 5]);
        assert!(zeroed::<f32>(0).unwrap().is_empty());
        assert_eq!(collect(3, 7..).unwrap(), vec![7, 8, 9]);
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        let n = usize::MAX / 8;
        assert!(matches!(zeroed::<f32>(n), Err(KvError::OutOfMemory { .. })));
        // Addressable, but more than any machine has.
        let n = 1 << 60;
        assert!(matches!(zeroed::<u16>(n), Err(KvError::OutOfMemory { .. })));
        assert!(matches!(
            collect(n, 0u32..),
            Err(KvError::OutOfMemory { .. })
        ));
    }
}
