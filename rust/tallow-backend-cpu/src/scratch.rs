//! Scratch memory of the CPU's steps, reused from one step to the next.

use tallow_arena::{ArenaError, GrowingArena, Pod};
use tallow_backend::BackendError;

/// The two arenas a step takes its scratch from: one for buffers that live through the whole
/// step (activations, attention buffers), one reset at every product (quantized activations).
/// A step that needs more than an arena holds takes the rest from the heap, and the arena
/// grows to hold it all at its next reset; so once a [`Scratch`] has seen a batch of some
/// shape, later batches of that shape or smaller run without heap allocation.
///
/// One `Scratch` serves one step at a time; keep one per KV cache (per engine).
#[derive(Debug, Default)]
pub struct Scratch {
    pub(crate) step: GrowingArena,
    pub(crate) layer: GrowingArena,
}

impl Scratch {
    /// Empty arenas: the first step sizes them.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes held by both arenas.
    pub fn capacity(&self) -> usize {
        self.step.capacity() + self.layer.capacity()
    }
}

/// The error of an arena that cannot get the memory a batch needs.
fn too_large(e: ArenaError) -> BackendError {
    BackendError::InvalidArgument(format!("the batch needs too much scratch memory: {e}"))
}

/// Resets `arena`, growing it to hold all it gave since the last reset.
pub(crate) fn reset(arena: &mut GrowingArena) -> Result<(), BackendError> {
    arena.reset().map_err(too_large)
}

/// `len` zeroed values from `arena`.
pub(crate) fn take<T: Pod>(arena: &GrowingArena, len: usize) -> Result<&mut [T], BackendError> {
    arena.alloc_slice(len).map_err(too_large)
}

/// `len` values from `arena` holding whatever an earlier step left there: for buffers the
/// caller writes in full before reading.
pub(crate) fn take_as_is<T: Pod>(
    arena: &GrowingArena,
    len: usize,
) -> Result<&mut [T], BackendError> {
    arena.alloc_slice_as_is(len).map_err(too_large)
}
