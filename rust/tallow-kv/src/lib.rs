//! Paged KV cache.
//!
//! The keys and values of every sequence live in one pool of fixed-size pages
//! ([`KvLayout::page_size`] token positions each, 16 by default). Each sequence has a page
//! table; pages are reference counted so forks share a prefix, and appending into a shared,
//! partly filled page copies it first (copy-on-write). Truncation drops rejected speculative
//! tokens. The pool's size comes from a memory budget ([`pages_for_budget`]). Full pages stay
//! findable by their content after their sequences end (prefix caching, see
//! [`Sequences::attach_prefix`] and [`Sequences::commit`]) until the pool reuses them.
//!
//! - [`KvLayout`], [`KvBudget`]: geometry and pool size.
//! - [`LayerGroups`]: which layers share a page table; sliding-window groups give back the
//!   pages no query sees any more, so their memory is bounded by the window.
//! - [`PageAllocator`]: refcounts and the (FIFO, deterministic) free list.
//! - [`Sequences`]: page tables and their operations, with no K/V data (returns [`CopyOp`]s).
//! - [`PageStore`]: where the K/V values live, addressed by page: host memory (the CPU
//!   backend's) or a device's.
//! - [`PagedKvCache`]: page tables over a store; what the engine uses.

#![warn(missing_docs)]

mod allocator;
mod cache;
mod error;
mod groups;
mod layout;
pub mod memory;
mod prefix;
mod sequences;
#[cfg(feature = "testing")]
pub mod testing;

use std::fmt;

pub use allocator::PageAllocator;
pub use cache::{PageStore, PagedKvCache};
pub use error::{KvError, Result};
pub use groups::{LayerGroup, LayerGroups};
pub use layout::{pages_for_budget, KvBudget, KvDtype, KvKind, KvLayout, MAX_PAGES};
pub use prefix::PrefixStats;
pub use sequences::{Appended, CopyOp, KvStats, PrefixMatch, Sequences};

/// A page of the pool: `0..n_pages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageId(pub u32);

impl PageId {
    /// The id as an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A sequence (one request's tokens, or a fork of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where one token's K/V lives: slot `offset` (`0..page_size`) of `page`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The page.
    pub page: PageId,
    /// Position within the page.
    pub offset: usize,
}

impl Slot {
    /// The slot as one index over the whole pool, `page * page_size + offset` (a GPU kernel's
    /// slot mapping).
    pub fn flat(self, page_size: usize) -> usize {
        self.page.index() * page_size + self.offset
    }
}
