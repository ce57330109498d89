//! Page tables and K/V storage together: the cache the engine holds.

use std::any::Any;

use crate::error::{KvError, Result};
use crate::groups::LayerGroups;
use crate::layout::{pages_for_budget, KvBudget, KvKind, KvLayout};
use crate::sequences::{KvStats, PrefixMatch, Sequences};
use crate::storage::KvStorage;
use crate::{PageId, SeqId, Slot};

/// Where a cache's K/V values live: host memory ([`KvStorage`]) or a device's, behind a
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

impl PageStore for KvStorage {
    fn layout(&self) -> &KvLayout {
        KvStorage::layout(self)
    }

    fn n_pages(&self) -> usize {
        KvStorage::n_pages(self)
    }

    fn copy_page(&mut self, src: PageId, dst: PageId) -> Result<()> {
        KvStorage::copy_page(self, src, dst)
    }
}

/// A paged KV cache: [`Sequences`] (page tables, refcounts, free list) over a pool of pages
/// ([`KvStorage`] in host memory, or another [`PageStore`]), applying copy-on-write copies as
/// they happen.
///
/// Typical step: [`PagedKvCache::append_slots`] for each scheduled sequence, the forward pass
/// writes each layer's K/V rows to those slots ([`PagedKvCache::write`]) and reads each
/// head's history through the page table ([`PagedKvCache::page_table`] with
/// [`KvStorage::block`], or [`PagedKvCache::read_head_f32`]);
/// [`PagedKvCache::truncate`] drops rejected speculative tokens, [`PagedKvCache::free`]
/// ends a sequence.
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
    /// A cache whose pool is as large as `budget` allows, every page holding every layer.
    pub fn new(layout: KvLayout, budget: KvBudget) -> Result<Self> {
        Self::grouped(layout, LayerGroups::global(layout.n_layer)?, budget)
    }

    /// A cache whose pages each hold one of `groups` (`layout.page_layers` must be their
    /// size; see [`LayerGroups`]).
    pub fn grouped(layout: KvLayout, groups: LayerGroups, budget: KvBudget) -> Result<Self> {
        let n_pages = pages_for_budget(&layout, budget)?;
        // The values first: they are the large allocation, the one that fails first. The
        // storage checks that the groups fit the layout.
        let storage = KvStorage::grouped(layout, &groups, n_pages)?;
        Self::over(groups, storage)
    }

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

    /// The values in host memory.
    pub fn storage(&self) -> Result<&KvStorage> {
        self.store()
    }

    /// Writes the K/V rows of tokens of `layer` to their slots in the layer's group (see
    /// [`KvStorage::write_tokens`]). The slots should come from
    /// [`PagedKvCache::append_slots`]; writing is not checked against sharing.
    pub fn write(
        &mut self,
        slots: &[Vec<Slot>],
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let group = self.groups.place(layer)?.0;
        let slots = slots.get(group).ok_or(KvError::OutOfRange {
            what: "layer group",
            index: group,
            len: slots.len(),
        })?;
        self.store_mut::<KvStorage>()?
            .write_tokens(slots, layer, keys, values)
    }

    /// Writes the K/V rows of position `pos` of `seq` in `layer`. Refuses
    /// ([`KvError::SharedPage`]) to write into a page other sequences share.
    pub fn write_pos(
        &mut self,
        seq: SeqId,
        pos: usize,
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let slot = self.writable_slot(seq, pos, layer)?;
        self.store_mut::<KvStorage>()?
            .write_token(slot, layer, keys, values)
    }

    /// The keys and values of the first `n_tokens` positions of `seq` for one (layer, KV
    /// head), gathered through its page table as f32 into `keys` and `values`, which hold
    /// exactly `n_tokens * head_dim` values each.
    pub fn read_head_f32(
        &self,
        seq: SeqId,
        layer: usize,
        head: usize,
        n_tokens: usize,
        keys: &mut [f32],
        values: &mut [f32],
    ) -> Result<()> {
        let len = self.seqs.seq_len(seq)?;
        if n_tokens > len {
            return Err(KvError::OutOfRange {
                what: "token count",
                index: n_tokens,
                len: len + 1,
            });
        }
        let pages = self.page_table(seq, layer)?;
        let storage = self.storage()?;
        storage.gather_f32(pages, n_tokens, layer, head, KvKind::Key, keys)?;
        storage.gather_f32(pages, n_tokens, layer, head, KvKind::Value, values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::KvDtype;

    fn layout(dtype: KvDtype) -> KvLayout {
        KvLayout::new(2, 2, 8).with_page_size(4).with_dtype(dtype)
    }

    /// Deterministic, distinct K/V values for (seq tag, position, layer).
    fn kv_row(tag: u32, pos: usize, layer: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let base = tag as f32 * 1000.0 + pos as f32 * 10.0 + layer as f32;
        let k = (0..n).map(|i| base + i as f32 * 0.125).collect();
        let v = (0..n).map(|i| -base - i as f32 * 0.25).collect();
        (k, v)
    }

    fn write_all(c: &mut PagedKvCache, slots: &[Vec<Slot>], tag: u32, first_pos: usize) {
        let row = c.layout().row_len();
        for layer in 0..c.layout().n_layer {
            let (mut ks, mut vs) = (Vec::new(), Vec::new());
            for i in 0..slots[0].len() {
                let (k, v) = kv_row(tag, first_pos + i, layer, row);
                ks.extend(k);
                vs.extend(v);
            }
            c.write(slots, layer, &ks, &vs).unwrap();
        }
    }

    /// Checks positions `0..len` of `seq` read back as written with `tags[pos]`.
    fn check(c: &PagedKvCache, seq: SeqId, tags: &[u32], tol: f32) {
        let l = *c.layout();
        let n = tags.len() * l.head_dim;
        let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
        for layer in 0..l.n_layer {
            for head in 0..l.n_head_kv {
                c.read_head_f32(seq, layer, head, tags.len(), &mut k, &mut v)
                    .unwrap();
                for (pos, &tag) in tags.iter().enumerate() {
                    let (wk, wv) = kv_row(tag, pos, layer, l.row_len());
                    for d in 0..l.head_dim {
                        let (gk, gv) = (k[pos * l.head_dim + d], v[pos * l.head_dim + d]);
                        let (ek, ev) = (wk[head * l.head_dim + d], wv[head * l.head_dim + d]);
                        assert!((gk - ek).abs() <= ek.abs() * tol, "K {gk} vs {ek} at {pos}");
                        assert!((gv - ev).abs() <= ev.abs() * tol, "V {gv} vs {ev} at {pos}");
                    }
                }
            }
        }
    }

    #[test]
    fn round_trip_through_the_page_table_and_copy_on_write() {
        for (dtype, tol) in [(KvDtype::F32, 0.0), (KvDtype::F16, 1.0 / 1024.0)] {
            let mut c = PagedKvCache::new(layout(dtype), KvBudget::Pages(6)).unwrap();
            let a = c.create();
            let slots = c.append_slots(a, 6).unwrap();
            write_all(&mut c, &slots, 1, 0);
            check(&c, a, &[1; 6], tol);

            let b = c.fork(a).unwrap();
            let slots = c.append_slots(b, 3).unwrap();
            // Copy-on-write moved b's second page to page 2, with a's first two tokens in it.
            assert_eq!(
                c.page_table(b, 0).unwrap(),
                &[PageId(0), PageId(2), PageId(3)]
            );
            assert_eq!(
                slots[0][0],
                Slot {
                    page: PageId(2),
                    offset: 2
                }
            );
            write_all(&mut c, &slots, 2, 6);
            let slots = c.append_slots(a, 2).unwrap();
            assert_eq!(
                slots[0][0],
                Slot {
                    page: PageId(1),
                    offset: 2
                }
            );
            write_all(&mut c, &slots, 3, 6);
            check(&c, a, &[1, 1, 1, 1, 1, 1, 3, 3], tol);
            check(&c, b, &[1, 1, 1, 1, 1, 1, 2, 2, 2], tol);

            // Speculative rollback, then a different continuation.
            c.truncate(b, 7).unwrap();
            let slots = c.append_slots(b, 1).unwrap();
            write_all(&mut c, &slots, 4, 7);
            check(&c, b, &[1, 1, 1, 1, 1, 1, 2, 4], tol);
            check(&c, a, &[1, 1, 1, 1, 1, 1, 3, 3], tol);
        }
    }

    #[test]
    fn f32_round_trip_is_exact_and_f16_blocks_hold_rounded_values() {
        let mut c = PagedKvCache::new(layout(KvDtype::F16), KvBudget::Pages(2)).unwrap();
        let a = c.create();
        c.append_slots(a, 1).unwrap();
        let k: Vec<f32> = (0..16).map(|i| 0.1 * i as f32 + 1e-4).collect();
        c.write_pos(a, 0, 1, &k, &k).unwrap();
        let block = c
            .storage()
            .unwrap()
            .block_f16(PageId(0), 1, 1, KvKind::Key)
            .unwrap();
        for d in 0..8 {
            assert_eq!(block[d], half::f16::from_f32(k[8 + d]));
        }
    }

    #[test]
    fn write_pos_refuses_shared_pages_and_bad_positions() {
        let mut c = PagedKvCache::new(layout(KvDtype::F32), KvBudget::Pages(4)).unwrap();
        let a = c.create();
        c.append_slots(a, 2).unwrap();
        let _b = c.fork(a).unwrap();
        let row = vec![0.5; 16];
        assert_eq!(
            c.write_pos(a, 1, 0, &row, &row).unwrap_err(),
            KvError::SharedPage {
                page: PageId(0),
                refcount: 2
            }
        );
        assert!(matches!(
            c.write_pos(a, 2, 0, &row, &row),
            Err(KvError::OutOfRange { .. })
        ));
        let (mut k, mut v) = (vec![0.0; 3 * 8], vec![0.0; 3 * 8]);
        assert!(c.read_head_f32(a, 0, 0, 3, &mut k, &mut v).is_err());
        let (k2, v2) = (&mut k[..16], &mut v[..16]);
        assert!(c.read_head_f32(a, 0, 2, 2, k2, v2).is_err());
    }

    #[test]
    fn pool_size_follows_the_budget() {
        let l = layout(KvDtype::F16); // 2*2*2*8*4*2 = 512 bytes a page
        let c = PagedKvCache::new(l, KvBudget::Bytes(512 * 10 + 511)).unwrap();
        assert_eq!(c.stats().pages_total, 10);
        assert_eq!(c.storage().unwrap().n_bytes(), 5120);
        let err = PagedKvCache::new(l, KvBudget::Bytes(511)).unwrap_err();
        assert!(
            matches!(
                err,
                KvError::BudgetTooSmall {
                    page_bytes: 512,
                    ..
                }
            ),
            "{err}"
        );
    }
}
