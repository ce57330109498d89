//! A step's plan: where each token's keys and values go, which pages each chunk's attention
//! reads, and which rows produce logits (or hidden states). It is built once per step, on the
//! host, from the batch and the KV cache's page tables, before any operation runs; backends
//! read it and none walks the page tables itself. Its arrays are plain `u32`s that a device
//! takes as they are.

use tallow_kv::{KvError, PagedKvCache};

use crate::batch::{Batch, KvCopy};
use crate::error::BackendError;

/// A position in the KV pages: page `page`, position `offset` in it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvSlot {
    pub page: u32,
    pub offset: u32,
}

/// The part of a plan for one layer group (the layers that share a page table, see
/// [`tallow_kv::LayerGroups`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupPlan {
    /// Where each token of the step writes its keys and values.
    pub slots: Vec<KvSlot>,
    /// The page tables of the chunks' sequences, one after another: chunk `c`'s is
    /// `tables[table_starts[c]..table_starts[c + 1]]`.
    pub tables: Vec<u32>,
    /// One more than there are chunks.
    pub table_starts: Vec<u32>,
    /// The copies a batch with branches needs once a layer's keys and values are written
    /// (see [`Batch::push_branch`]); the same for every layer of the group.
    pub copies: Vec<KvCopy>,
}

impl GroupPlan {
    /// The page table of chunk `chunk`'s sequence.
    pub fn table(&self, chunk: usize) -> &[u32] {
        &self.tables[self.table_starts[chunk] as usize..self.table_starts[chunk + 1] as usize]
    }
}

/// One step's plan (see the module's documentation). Keep one and [`StepPlan::build`] it for
/// every step: its buffers are reused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Position of each chunk's first token in its sequence.
    pub first_pos: Vec<usize>,
    /// Position of each token in its sequence.
    pub positions: Vec<u32>,
    /// The chunk of each token.
    pub token_chunks: Vec<u32>,
    /// The rows (tokens) that produce logits, in the order of the logits.
    pub logit_rows: Vec<u32>,
    /// The rows (tokens) that produce final hidden states, in the order of those.
    pub hidden_rows: Vec<u32>,
    /// One per layer group.
    pub groups: Vec<GroupPlan>,
    /// The group of each layer.
    layer_groups: Vec<u32>,
}

fn too_large(what: &str) -> BackendError {
    BackendError::InvalidArgument(format!("a step with more than 2^32 {what}"))
}

fn word(value: usize, what: &str) -> Result<u32, BackendError> {
    u32::try_from(value).map_err(|_| too_large(what))
}

impl StepPlan {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    /// The plan of `batch`, whose chunks take the last positions reserved for their
    /// sequences in `cache` (see [`PagedKvCache::append_slots`]). Refuses a write to a page
    /// other sequences share ([`KvError::SharedPage`]), unless the writer is the parent of a
    /// branch in the batch: its branches share the positions it computes, and it writes them
    /// for all (see [`Batch::push_branch`]).
    pub fn build(&mut self, batch: &Batch, cache: &PagedKvCache) -> Result<(), BackendError> {
        self.first_pos.clear();
        self.positions.clear();
        self.token_chunks.clear();
        self.logit_rows.clear();
        self.hidden_rows.clear();
        for (c, chunk) in batch.chunks.iter().enumerate() {
            let reserved = cache.seq_len(chunk.seq)?;
            let first = reserved.checked_sub(chunk.len).ok_or_else(|| {
                BackendError::InvalidArgument(format!(
                    "sequence {} has {reserved} positions reserved, fewer than its {} new tokens",
                    chunk.seq, chunk.len
                ))
            })?;
            self.first_pos.push(first);
            let c = word(c, "chunks")?;
            for pos in first..reserved {
                self.positions.push(word(pos, "positions")?);
                self.token_chunks.push(c);
            }
            for row in chunk.logit_rows() {
                self.logit_rows.push(word(row, "tokens")?);
            }
            for row in chunk.hidden_rows() {
                self.hidden_rows.push(word(row, "tokens")?);
            }
        }
        let groups = cache.groups();
        self.layer_groups.clear();
        for layer in 0..groups.n_layer() {
            self.layer_groups.push(groups.place(layer)?.0 as u32);
        }
        self.groups.resize_with(groups.len(), GroupPlan::default);
        for (g, group) in groups.groups().iter().enumerate() {
            // Every layer of a group shares its page table: its first speaks for all.
            let layer = group.layers[0];
            self.build_group(g, layer, batch, cache)?;
        }
        Ok(())
    }

    fn build_group(
        &mut self,
        g: usize,
        layer: usize,
        batch: &Batch,
        cache: &PagedKvCache,
    ) -> Result<(), BackendError> {
        let plan = &mut self.groups[g];
        plan.slots.clear();
        plan.tables.clear();
        plan.table_starts.clear();
        plan.table_starts.push(0);
        for (chunk, &first) in batch.chunks.iter().zip(&self.first_pos) {
            let parent = batch.is_parent(chunk.seq);
            for pos in first..first + chunk.len {
                let slot = if parent {
                    cache.slot(chunk.seq, pos, layer)?
                } else {
                    cache.writable_slot(chunk.seq, pos, layer)?
                };
                plan.slots.push(KvSlot {
                    page: slot.page.0,
                    offset: word(slot.offset, "positions")?,
                });
            }
            let table = cache.page_table(chunk.seq, layer)?;
            let wanted = plan.tables.len() + table.len();
            if plan.tables.capacity() < wanted {
                // Page tables grow with their sequences: room for them to grow a while, so
                // that decode steps do not reallocate each time a sequence takes a page.
                plan.tables.reserve(table.len() + wanted / 2 + 64);
            }
            plan.tables.extend(table.iter().map(|p| p.0));
            plan.table_starts
                .push(word(plan.tables.len(), "page table entries")?);
        }
        branch_copies(batch, cache, &self.first_pos, layer, &mut plan.copies)
    }

    /// The group of `layer`.
    pub fn group_of(&self, layer: usize) -> Result<usize, KvError> {
        self.layer_groups
            .get(layer)
            .map(|&g| g as usize)
            .ok_or(KvError::OutOfRange {
                what: "layer",
                index: layer,
                len: self.layer_groups.len(),
            })
    }

    /// The part of the plan for `layer`'s group.
    pub fn group(&self, layer: usize) -> Result<&GroupPlan, KvError> {
        Ok(&self.groups[self.group_of(layer)?])
    }
}

/// The copies `layer`'s group needs once its keys and values are written: for each branch
/// whose first new position (`first_pos`, chunk by chunk) is inside a page, the positions
/// before it, from its parent's page to its own (none where the two still share it).
fn branch_copies(
    batch: &Batch,
    cache: &PagedKvCache,
    first_pos: &[usize],
    layer: usize,
    out: &mut Vec<KvCopy>,
) -> Result<(), BackendError> {
    out.clear();
    let ps = cache.layout().page_size;
    for (chunk, &first) in batch.chunks.iter().zip(first_pos) {
        let (Some(parent), len) = (chunk.branch_of, first % ps) else {
            continue;
        };
        if len == 0 {
            continue;
        }
        let page = first / ps;
        let table = cache.page_table(parent, layer)?;
        let src = *table.get(page).ok_or(KvError::OutOfRange {
            what: "page of the branch's parent",
            index: page,
            len: table.len(),
        })?;
        let dst = cache.page_table(chunk.seq, layer)?[page];
        if src != dst {
            out.push(KvCopy { src, dst, len });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tallow_kv::testing::TablesOnly;
    use tallow_kv::{KvLayout, LayerGroups, SeqId};

    use super::*;
    use crate::batch::Logits;

    fn cache(windows: &[Option<usize>]) -> PagedKvCache {
        let layout = KvLayout::new(windows.len(), 1, 4)
            .with_page_size(4)
            .with_page_layers(1);
        let groups = LayerGroups::from_windows(windows).unwrap();
        // A plan reads only the page tables.
        PagedKvCache::over(groups, TablesOnly::new(layout, 64)).unwrap()
    }

    fn reserve(cache: &mut PagedKvCache, seq: SeqId, n: usize) {
        cache.append_slots(seq, n).unwrap();
    }

    #[test]
    fn hidden_rows_are_apart_from_logit_rows() {
        let mut cache = cache(&[None]);
        let (a, b, c) = (cache.create(), cache.create(), cache.create());
        reserve(&mut cache, a, 2);
        reserve(&mut cache, b, 3);
        reserve(&mut cache, c, 2);
        let mut batch = Batch::new();
        batch.push(a, &[7, 8], Logits::Last);
        batch.push_hidden(b, &[1, 2, 3], Logits::All);
        batch.push_hidden(c, &[4, 5], Logits::Last);
        assert_eq!((batch.n_logits(), batch.n_hidden()), (1, 4));
        let mut plan = StepPlan::new();
        plan.build(&batch, &cache).unwrap();
        assert_eq!(plan.logit_rows, [1]);
        assert_eq!(plan.hidden_rows, [2, 3, 4, 6]);
    }

    #[test]
    fn slots_tables_and_logit_rows_follow_the_batch() {
        let mut cache = cache(&[None, Some(4)]);
        let (a, b) = (cache.create(), cache.create());
        reserve(&mut cache, a, 6);
        reserve(&mut cache, b, 3);
        reserve(&mut cache, a, 1);
        let mut batch = Batch::new();
        batch.push(a, &[7], Logits::Last);
        batch.push(b, &[1, 2, 3], Logits::All);
        let mut plan = StepPlan::new();
        plan.build(&batch, &cache).unwrap();
        assert_eq!(plan.first_pos, [6, 0]);
        assert_eq!(plan.positions, [6, 0, 1, 2]);
        assert_eq!(plan.token_chunks, [0, 1, 1, 1]);
        assert_eq!(plan.logit_rows, [0, 1, 2, 3]);
        assert_eq!(plan.groups.len(), 2);
        for layer in 0..2 {
            let group = plan.group(layer).unwrap();
            for (t, (c, &pos)) in plan.token_chunks.iter().zip(&plan.positions).enumerate() {
                let seq = batch.chunks[*c as usize].seq;
                let slot = cache.slot(seq, pos as usize, layer).unwrap();
                assert_eq!(
                    group.slots[t],
                    KvSlot {
                        page: slot.page.0,
                        offset: slot.offset as u32
                    }
                );
            }
            for (c, chunk) in batch.chunks.iter().enumerate() {
                let table: Vec<u32> = cache
                    .page_table(chunk.seq, layer)
                    .unwrap()
                    .iter()
                    .map(|p| p.0)
                    .collect();
                assert_eq!(group.table(c), table);
            }
            assert!(group.copies.is_empty());
        }
    }

    #[test]
    fn a_shared_page_is_written_only_by_the_parent_of_a_branch() {
        let mut cache = cache(&[None]);
        let a = cache.create();
        reserve(&mut cache, a, 2);
        // `b` shares the page that `a`'s two positions are to be written to.
        let b = cache.fork(a).unwrap();
        let mut alone = Batch::new();
        alone.push(a, &[1, 2], Logits::Last);
        let mut plan = StepPlan::new();
        assert!(matches!(
            plan.build(&alone, &cache),
            Err(BackendError::Kv(KvError::SharedPage { .. }))
        ));
        // As the parent of `b`, a branch that continues from `a`'s positions, `a` writes
        // them, and they are copied to `b`'s own page after.
        reserve(&mut cache, b, 1);
        let mut branched = alone.clone();
        branched.push_branch(b, a, &[3], Logits::Last);
        plan.build(&branched, &cache).unwrap();
        let (src, dst) = (
            cache.page_table(a, 0).unwrap()[0],
            cache.page_table(b, 0).unwrap()[0],
        );
        assert_ne!(src, dst);
        assert_eq!(plan.groups[0].copies, [KvCopy { src, dst, len: 2 }]);
        assert_eq!(plan.logit_rows, [1, 2]);
    }
}
