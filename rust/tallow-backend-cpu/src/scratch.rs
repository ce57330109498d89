//! Scratch memory of the CPU's steps, reused from one step to the next.

use tallow_arena::{Arena, Pod};
use tallow_backend::{BackendError, StepError};

/// The two arenas a step takes its scratch from: one for buffers that live through the whole
/// step (activations, attention buffers), one reset at every product (quantized activations).
/// Each grows, by reallocation, only when a batch needs more than it holds, so once a
/// [`Scratch`] has seen a batch of some shape, later batches of that shape or smaller run
/// without heap allocation.
///
/// One `Scratch` serves one step at a time; keep one per KV cache (per engine).
#[derive(Debug)]
pub struct Scratch {
    pub(crate) step: Arena,
    pub(crate) layer: Arena,
}

/// Which arena of a [`Scratch`] a [`StepError::OutOfScratch`] names.
pub(crate) const STEP: usize = 0;
pub(crate) const LAYER: usize = 1;

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Scratch {
    /// Empty arenas: the first step sizes them.
    pub fn new() -> Self {
        Scratch {
            step: Arena::new(0),
            layer: Arena::new(0),
        }
    }

    /// Bytes held by both arenas.
    pub fn capacity(&self) -> usize {
        self.step.capacity() + self.layer.capacity()
    }

    /// Replaces arena `which` with one that can hold at least `needed` bytes.
    pub(crate) fn grow(&mut self, which: usize, needed: usize) -> Result<(), BackendError> {
        let arena = if which == STEP {
            &mut self.step
        } else {
            &mut self.layer
        };
        // Half as much again, and at least double, so that a slowly growing context does not
        // reallocate at every step.
        let capacity = needed
            .checked_add(needed / 2 + 4096)
            .map(|n| n.max(arena.capacity().saturating_mul(2)))
            .ok_or_else(|| {
                BackendError::InvalidArgument(format!("a batch needing {needed} bytes of scratch"))
            })?;
        // The old buffer goes first, so both are never held at once.
        *arena = Arena::new(0);
        *arena = Arena::try_new(capacity).map_err(|e| {
            BackendError::InvalidArgument(format!("the batch needs too much scratch memory: {e}"))
        })?;
        Ok(())
    }
}

/// `len` zeroed values from `arena` (number `which` of the scratch), or
/// [`StepError::OutOfScratch`] with the bytes the arena would need to hold in all.
pub(crate) fn take<T: Pod>(arena: &Arena, which: usize, len: usize) -> Result<&mut [T], StepError> {
    arena
        .alloc_slice(len)
        .ok_or_else(|| StepError::OutOfScratch {
            arena: which,
            needed: arena
                .used()
                .saturating_add(len.saturating_mul(size_of::<T>()))
                .saturating_add(64),
        })
}
