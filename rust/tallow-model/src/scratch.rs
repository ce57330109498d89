//! Scratch memory of the forward pass, reused from one call to the next.

use tallow_arena::{Arena, Pod};

use crate::error::ModelError;

/// The two arenas a forward pass takes its scratch from: one for buffers that live through the
/// whole call (activations, attention buffers), one reset at every layer (quantized
/// activations). Each grows, by reallocation, only when a batch needs more than it holds, so
/// once a [`Scratch`] has seen a batch of some shape, later batches of that shape or smaller
/// run without heap allocation.
///
/// One `Scratch` serves one forward call at a time; keep one per KV cache (per engine).
#[derive(Debug)]
pub struct Scratch {
    pub(crate) step: Arena,
    pub(crate) layer: Arena,
}

/// Which arena of a [`Scratch`] ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    Step,
    Layer,
}

/// Why a forward attempt stopped: a real error, or an arena too small for this batch (the
/// attempt is then repeated with a larger one).
#[derive(Debug)]
pub(crate) enum Failure {
    Model(ModelError),
    Exhausted { which: Which, needed: usize },
}

impl<E: Into<ModelError>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Model(e.into())
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Scratch {
    /// Empty arenas: the first forward call sizes them.
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
    pub(crate) fn grow(&mut self, which: Which, needed: usize) -> Result<(), ModelError> {
        let arena = match which {
            Which::Step => &mut self.step,
            Which::Layer => &mut self.layer,
        };
        // Half as much again, and at least double, so that a slowly growing context does not
        // reallocate at every step.
        let capacity = needed
            .checked_add(needed / 2 + 4096)
            .map(|n| n.max(arena.capacity().saturating_mul(2)))
            .ok_or_else(|| {
                ModelError::InvalidArgument(format!("a batch needing {needed} bytes of scratch"))
            })?;
        // The old buffer goes first, so both are never held at once.
        *arena = Arena::new(0);
        *arena = Arena::try_new(capacity).map_err(|e| {
            ModelError::InvalidArgument(format!("the batch needs too much scratch memory: {e}"))
        })?;
        Ok(())
    }
}

/// `len` zeroed values from `arena`, or [`Failure::Exhausted`] with the bytes the arena would
/// need to hold in all.
pub(crate) fn take<T: Pod>(arena: &Arena, which: Which, len: usize) -> Result<&mut [T], Failure> {
    arena.alloc_slice(len).ok_or_else(|| Failure::Exhausted {
        which,
        needed: arena
            .used()
            .saturating_add(len.saturating_mul(size_of::<T>()))
            .saturating_add(64),
    })
}
