//! Per-step scratch memory for the tallow engine.
//!
//! [`Arena`] is a bump allocator over one pre-allocated, aligned buffer. Its offset advances by
//! compare-and-swap, so many threads may allocate from one shared `&Arena` at once; every
//! allocation borrows the arena, and [`Arena::reset`] takes `&mut self`, so the borrow checker
//! guarantees no allocation outlives a reset. Exhaustion is reported as `None`, never as a partial
//! allocation.
//!
//! [`ArenaPool`] recycles arenas: [`ArenaPool::get`] hands out a [`PooledArena`] guard that resets
//! its arena and returns it to the pool on drop. Once the pool is warm, taking and returning an
//! arena, and allocating from it, make no heap allocation.
//!
//! Typed allocation is limited to plain-old-data element types ([`Pod`]) for zero-filled slices;
//! uninitialized memory is only handed out as [`core::mem::MaybeUninit`].
//!
//! ```
//! use tallow_arena::{Arena, ArenaPool};
//!
//! let mut arena = Arena::new(1 << 16);
//! let scores: &mut [f32] = arena.alloc_slice(256).unwrap();
//! assert!(scores.iter().all(|&x| x == 0.0));
//! let ids = arena.alloc_slice_copy(&[1u32, 2, 3]).unwrap();
//! assert_eq!(ids, &[1, 2, 3]);
//! arena.reset();
//! assert_eq!(arena.used(), 0);
//!
//! let pool = ArenaPool::new(1 << 16);
//! {
//!     let scratch = pool.get();
//!     let _tmp: &mut [u8] = scratch.alloc_slice(100).unwrap();
//! } // returned to the pool here, reset
//! assert_eq!(pool.idle(), 1);
//! ```

#![warn(missing_docs)]

mod arena;
mod error;
mod growing;
mod pod;
mod pool;

pub use arena::{Arena, BASE_ALIGN};
pub use error::ArenaError;
pub use growing::GrowingArena;
pub use pod::Pod;
pub use pool::{ArenaPool, PooledArena};
