//! Page tables and K/V storage together: the cache the engine holds.

use std::any::Any;

use crate::error::{KvError, Result};
use crate::groups::LayerGroups;
use crate::layout::KvLayout;
use crate::sequences::{KvStats, PrefixMatch, Sequences};
use crate::{PageId, SeqId, Slot};

/// Where a cache's K/V values live: host memory (the CPU backend's) or a device's, behind a
/// backend. The page tables only need the store to copy a page when a shared one is
/// written (copy-on-write); the backend that reads and writes the values gets its own kind of
/// store back with [`PagedKvCache::store`].
pub trait PageStore: Any + Send + Sync {
    /// The geometry.
    fn layout(&self) -> &KvLayout;
    /// Pages in the store.
    fn n_pages(&self) -> usize;
    /// Copies every value of page `src` to page `dst`.
    fn copy_page(&mut self, src: PageId, dst: PageId) -> Result<()>;
}

/// A paged KV cache: [`Sequences`] (page tables, refcounts, free list) over a pool of pages
/// (a backend's [`PageStore`]), applying copy-on-write copies as they happen.
///
/// Typical step: [`PagedKvCache::append_slots`] for each scheduled sequence; the backend's
/// forward pass writes each layer's K/V rows to those slots and reads each head's history
/// through the page table ([`PagedKvCache::page_table`]) in its own store
/// ([`PagedKvCache::store`]); [`PagedKvCache::truncate`] drops rejected speculative tokens,
/// [`PagedKvCache::free`] ends a sequence.
pub struct PagedKvCache {
    groups: LayerGroups,
    seqs: Sequences,
    storage: Box<dyn PageStore>,
}

impl std::fmt::Debug for PagedKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedKvCache")
            .field("groups", &self.groups)
            .field("seqs", &self.seqs)
            .finish_non_exhaustive()
    }
}

impl PagedKvCache {
    /// Empty page tables over every page of `storage`, whose pages each hold one of `groups`.
    pub fn over(groups: LayerGroups, storage: impl PageStore) -> Result<Self> {
        let layout = storage.layout();
        groups.check_layout(layout)?;
        Ok(PagedKvCache {
            seqs: Sequences::grouped(layout.page_size, storage.n_pages(), &groups.windows())?,
            groups,
            storage: Box::new(storage),
        })
    }

    /// The geometry.
    pub fn layout(&self) -> &KvLayout {
        self.storage.layout()
    }

    /// How the layers map onto page tables.
    pub fn groups(&self) -> &LayerGroups {
        &self.groups
    }

    /// Page tables and allocator.
    pub fn sequences(&self) -> &Sequences {
        &self.seqs
    }

    /// The K/V values, in the store of kind `S` that holds them, or
    /// [`KvError::WrongStore`] if they are held elsewhere (on another device).
    pub fn store<S: PageStore>(&self) -> Result<&S> {
        (self.storage.as_ref() as &dyn Any)
            .downcast_ref()
            .ok_or(KvError::WrongStore)
    }

    /// [`PagedKvCache::store`], to write the values.
    pub fn store_mut<S: PageStore>(&mut self) -> Result<&mut S> {
        (self.storage.as_mut() as &mut dyn Any)
            .downcast_mut()
            .ok_or(KvError::WrongStore)
    }

    /// A new empty sequence.
    pub fn create(&mut self) -> SeqId {
        self.seqs.create()
    }

    /// A new empty sequence with a prefix-cache salt (see [`Sequences::create_salted`]).
    pub fn create_salted(&mut self, salt: u64) -> SeqId {
        self.seqs.create_salted(salt)
    }

    /// The longest cached prefix of `tokens` (see [`Sequences::match_prefix`]).
    pub fn match_prefix(&self, salt: u64, tokens: &[u32], max_tokens: usize) -> PrefixMatch {
        self.seqs.match_prefix(salt, tokens, max_tokens)
    }

    /// Gives the empty `seq` the cached pages of a prefix of `tokens`; returns the tokens
    /// attached (see [`Sequences::attach_prefix`]).
    pub fn attach_prefix(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        max_tokens: usize,
    ) -> Result<usize> {
        self.seqs.attach_prefix(seq, tokens, max_tokens)
    }

    /// Records the tokens whose KV was written at the next positions of `seq`, caching the
    /// pages they complete (see [`Sequences::commit`]).
    pub fn commit(&mut self, seq: SeqId, tokens: &[u32]) -> Result<()> {
        self.seqs.commit(seq, tokens)
    }

    /// A new sequence sharing every page of `seq` (see [`Sequences::fork`]).
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        self.seqs.fork(seq)
    }

    /// Ends `seq`; returns the pages that became free (see [`Sequences::free`]).
    pub fn free(&mut self, seq: SeqId) -> Result<Vec<PageId>> {
        self.seqs.free(seq)
    }

    /// Keeps the first `keep` tokens of `seq` (see [`Sequences::truncate`]).
    pub fn truncate(&mut self, seq: SeqId, keep: usize) -> Result<Vec<PageId>> {
        self.seqs.truncate(seq, keep)
    }

    /// Pages an append of `n` tokens would take (see [`Sequences::pages_needed`]).
    pub fn pages_needed(&self, seq: SeqId, n: usize) -> Result<usize> {
        self.seqs.pages_needed(seq, n)
    }

    /// The most tokens, up to `want`, `seq` can append taking at most `free` pages (see
    /// [`Sequences::max_append`]).
    pub fn max_append(&self, seq: SeqId, want: usize, free: usize) -> Result<usize> {
        self.seqs.max_append(seq, want, free)
    }

    /// Reserves `n` positions at the end of `seq` and returns their slots in each layer group,
    /// copying a shared last page first (copy-on-write). All or nothing (see
    /// [`Sequences::append_slots`]).
    pub fn append_slots(&mut self, seq: SeqId, n: usize) -> Result<Vec<Vec<Slot>>> {
        let appended = self.seqs.append_slots(seq, n)?;
        for c in &appended.copies {
            self.storage.copy_page(c.src, c.dst)?;
        }
        Ok(appended.slots)
    }

    /// Tokens in `seq`.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        self.seqs.seq_len(seq)
    }

    /// The page table of `seq` that holds `layer` (see [`Sequences::page_table`]).
    pub fn page_table(&self, seq: SeqId, layer: usize) -> Result<&[PageId]> {
        self.seqs.page_table(seq, self.groups.place(layer)?.0)
    }

    /// Pool and sequence numbers.
    pub fn stats(&self) -> KvStats {
        self.seqs.stats()
    }

    /// The slot of position `pos` of `seq` in `layer`'s pages, shared or not.
    pub fn slot(&self, seq: SeqId, pos: usize, layer: usize) -> Result<Slot> {
        self.seqs.slot(seq, self.groups.place(layer)?.0, pos)
    }

    /// The slot of position `pos` of `seq` in `layer`'s pages, refusing
    /// ([`KvError::SharedPage`]) a page other sequences share.
    pub fn writable_slot(&self, seq: SeqId, pos: usize, layer: usize) -> Result<Slot> {
        let slot = self.slot(seq, pos, layer)?;
        let refcount = self.seqs.allocator().refcount(slot.page)?;
        if refcount > 1 {
            return Err(KvError::SharedPage {
                page: slot.page,
                refcount,
            });
        }
        Ok(slot)
    }
}
