//! Causal grouped-query attention over the paged KV cache.
//!
//! A token attends to its visible positions in fixed segments of [`SEGMENT_PAGES`] pages.
//! Within a segment it goes a tile of pages (up to [`TILE_POSITIONS`] positions) at a time
//! with an online softmax (a running maximum, the sum of the exponentials below it and their
//! weighted sum of values, rescaled when the maximum grows); the segments' results are then
//! merged in order. Each tile's keys and values are converted to f32 once per unit of work
//! and serve every query head that shares the KV head and every token of the unit, without
//! gathering the whole history; with AVX-512, f16 pages of 16 positions (and bf16, Q8_0 and
//! Q4_0 ones for a unit of a few query rows: decoding) are read as they lie in the pool,
//! widened in registers (the same arithmetic, one copy fewer).
//!
//! The arithmetic for a token depends only on its query and its visible positions, never on
//! the batch around it (how many tokens its chunk has, which other sequences run, how the
//! work was split between threads), so a token's output is the same bit for bit whether it is
//! decoded alone, verified in a chunk of speculative tokens, or prefilled.
//!
//! Work is split into units of (chunk, KV head, block of up to [`TOKEN_BLOCK`] tokens). When
//! a batch has too few units to keep every thread busy (decoding one or two sequences), each
//! unit is split further by segment, the segments' states go to scratch memory and are
//! merged afterwards; otherwise a unit merges its segments itself. A batch with too few units
//! and too few positions to split by segment takes blocks of fewer tokens instead.
//!
//! The inner loops (a tile into the states, merging states, widening) are the kernel table's,
//! [`tallow_quant::attention_kernels`]; this module splits the work and walks the pages.

use std::ops::Range;

use tallow_backend::{BackendError, Batch, Heads, Scores, StepPlan};
use tallow_kv::{KvKind, PageId};
use tallow_quant::{attention_kernels, KvBlock, IN_PLACE_PAGE, TILE_POSITIONS};
use tallow_threads::DisjointSlice;

use crate::pages::KvStorage;

/// Pages per segment.
const SEGMENT_PAGES: usize = 8;
/// Tokens of one chunk per unit of work.
const TOKEN_BLOCK: usize = 16;
/// Split units by segment when there are fewer than this many units per thread.
const UNITS_PER_THREAD: usize = 2;

/// Floats of one online-softmax state: the maximum, the sum, the weighted values.
fn state_len(heads: &Heads) -> usize {
    heads.head_dim + 2
}

/// How one batch's attention is split, and the scratch it needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    heads: Heads,
    page_size: usize,
    /// Pages per tile.
    tile_pages: usize,
    /// Token blocks of the longest chunk.
    blocks: usize,
    /// Segments of the longest sequence.
    segments: usize,
    /// Tokens per block (the longest chunk's length, up to [`TOKEN_BLOCK`], or fewer where
    /// the batch has too few units of work for the threads).
    block_tokens: usize,
    split: bool,
    /// Parts the query heads of a KV head are cut into, one unit each (more than one where
    /// the batch has fewer units than threads and the units are not split by segment: one
    /// decoding sequence).
    head_parts: usize,
}

impl Plan {
    pub(crate) fn new(
        heads: Heads,
        page_size: usize,
        batch: &Batch,
        first_pos: &[usize],
        threads: usize,
    ) -> Plan {
        let longest_chunk = batch.chunks.iter().map(|c| c.len).max().unwrap_or(0);
        let longest_seq = (batch.chunks.iter().zip(first_pos))
            .map(|(c, &first)| first + c.len)
            .max()
            .unwrap_or(0);
        let units_of = |block_len: usize| -> usize {
            (batch.chunks.iter())
                .map(|c| c.len.div_ceil(block_len) * heads.n_head_kv)
                .sum()
        };
        let units = units_of(TOKEN_BLOCK);
        let segment_len = SEGMENT_PAGES * page_size;
        let tile_pages = [8, 4, 2]
            .into_iter()
            .find(|&pages| {
                SEGMENT_PAGES.is_multiple_of(pages) && pages * page_size <= TILE_POSITIONS
            })
            .unwrap_or(1);
        let split = units < UNITS_PER_THREAD * threads && longest_seq > segment_len;
        // A row's result does not depend on the rows computed with it, so the tokens of a
        // chunk and the query heads of a KV head can go to different threads with the same
        // bits. Too few units and no segments to split them by (a short prompt's few tokens
        // after a cached prefix): blocks of fewer tokens, cut evenly, until every thread gets
        // its share (ten tokens over three KV heads made three units for two threads, one of
        // which then waited a third of the time).
        let block_len = match split {
            true => TOKEN_BLOCK,
            false => (longest_chunk.div_ceil(TOKEN_BLOCK).max(1)..=longest_chunk)
                .map(|blocks| longest_chunk.div_ceil(blocks))
                .find(|&len| units_of(len) >= UNITS_PER_THREAD * threads)
                .unwrap_or(TOKEN_BLOCK),
        };
        let units = units_of(block_len);
        let head_parts = if split || units >= threads {
            1
        } else {
            threads.div_ceil(units).min(heads.group())
        };
        Plan {
            heads,
            page_size,
            tile_pages,
            blocks: longest_chunk.div_ceil(block_len),
            segments: longest_seq.div_ceil(segment_len),
            block_tokens: longest_chunk.min(block_len),
            split,
            head_parts,
        }
    }

    /// Floats of scratch per thread: one tile of keys and of values as f32, its scores, the
    /// queries of a unit side by side, and two states (running and segment) per token and
    /// query head of a unit.
    pub(crate) fn thread_scratch_len(&self) -> usize {
        let h = &self.heads;
        2 * self.tile_len() * h.head_dim
            + self.tile_len()
            + self.block_tokens * h.group() * h.head_dim
            + 2 * self.block_tokens * h.group() * state_len(h)
    }

    /// Positions per tile.
    fn tile_len(&self) -> usize {
        self.tile_pages * self.page_size
    }

    /// Floats of scratch for the segments' states when units are split by segment.
    pub(crate) fn partials_len(&self, n_chunks: usize) -> usize {
        if !self.split {
            return 0;
        }
        self.grid(n_chunks) * self.block_tokens * self.heads.group() * state_len(&self.heads)
    }

    /// Units of work in the split grid: (chunk, token block, KV head, segment).
    fn grid(&self, n_chunks: usize) -> usize {
        n_chunks * self.blocks * self.heads.n_head_kv * self.segments
    }

    fn segment_len(&self) -> usize {
        SEGMENT_PAGES * self.page_size
    }
}

/// One unit of work: the tokens `tokens` (indices in their chunk) of chunk `chunk` for the
/// query heads `heads` (of the group, `0..group` unless cut) of KV head `kv_head`, over the
/// segments `segments`.
struct Unit {
    chunk: usize,
    tokens: Range<usize>,
    kv_head: usize,
    heads: Range<usize>,
    segments: Range<usize>,
}

/// The inputs of one layer's attention.
pub(crate) struct Attention<'a> {
    pub plan: &'a Plan,
    /// The step's plan: each chunk's first position and page tables.
    pub step: &'a StepPlan,
    /// The cache's values (in host memory).
    pub storage: &'a KvStorage,
    pub layer: usize,
    pub batch: &'a Batch,
    /// Roped queries, `[token][head][head_dim]`.
    pub q: &'a [f32],
    pub scores: Scores,
    /// One logit per query head that joins its softmax's denominator (gpt-oss).
    pub sinks: Option<&'a [f32]>,
}

impl Attention<'_> {
    /// Writes every token's attention output to `out` (`[token][head][head_dim]`), using
    /// `scratch` (`threads * plan.thread_scratch_len()` floats) and `partials`
    /// (`plan.partials_len(chunks)` floats).
    pub(crate) fn run(
        &self,
        scratch: &mut [f32],
        partials: &mut [f32],
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let plan = self.plan;
        let pool = tallow_threads::global();
        let per_thread = plan.thread_scratch_len();
        let scratch = DisjointSlice::new(scratch);
        let out = DisjointSlice::new(out);
        let partials = DisjointSlice::new(partials);
        let error = std::sync::Mutex::new(None);
        let n_chunks = self.batch.chunks.len();
        let n_kv = plan.heads.n_head_kv;
        let n_tasks = if plan.split {
            plan.grid(n_chunks)
        } else {
            n_chunks * plan.blocks * n_kv * plan.head_parts
        };
        let group = plan.heads.group();
        pool.run(n_tasks, &|task, worker| {
            let (task, part) = (task / plan.head_parts, task % plan.head_parts);
            let part_len = group.div_ceil(plan.head_parts);
            let heads = (part * part_len).min(group)..((part + 1) * part_len).min(group);
            if heads.is_empty() {
                return;
            }
            let segments = if plan.split { plan.segments } else { 1 };
            let (rest, segment) = (task / segments, task % segments);
            let (rest, kv_head) = (rest / n_kv, rest % n_kv);
            let (chunk, block) = (rest / plan.blocks, rest % plan.blocks);
            let len = self.batch.chunks[chunk].len;
            let tokens = block * plan.block_tokens..len.min((block + 1) * plan.block_tokens);
            if tokens.is_empty() {
                return;
            }
            let visible = self.step.first_pos[chunk] + tokens.end;
            let n_segments = visible.div_ceil(plan.segment_len());
            let segments = if plan.split {
                if segment >= n_segments {
                    return;
                }
                segment..segment + 1
            } else {
                0..n_segments
            };
            let unit = Unit {
                chunk,
                tokens,
                kv_head,
                heads,
                segments,
            };
            // SAFETY: no two tasks running at once have the same worker index.
            let mine = unsafe { scratch.range_mut(worker * per_thread..(worker + 1) * per_thread) };
            let sink = if plan.split {
                Sink::Partials(&partials, task)
            } else {
                Sink::Out(&out)
            };
            if let Err(e) = self.unit(&unit, mine, sink) {
                let mut first = error.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert(e);
            }
        });
        if let Some(e) = error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        if plan.split {
            // SAFETY: the pool's tasks are over; this thread alone uses the slices now.
            let (partials, out) = unsafe {
                (
                    partials.range_mut(0..partials.len()),
                    out.range_mut(0..out.len()),
                )
            };
            self.merge_partials(partials, out);
        }
        Ok(())
    }

    /// Runs one unit: its segments one after the other, each tile converted once.
    fn unit(&self, unit: &Unit, scratch: &mut [f32], sink: Sink<'_>) -> Result<(), BackendError> {
        let plan = self.plan;
        let h = &plan.heads;
        // The path depends on the layer only, never on the batch: a token's bits stay the same
        // alone or in any chunk.
        if self.scores != Scores::plain(h.head_dim) {
            return self.unit_general(unit, scratch, sink);
        }
        let (hd, group, state_len) = (h.head_dim, h.group(), state_len(h));
        // The unit's query heads: their states side by side per token.
        let hg = unit.heads.len();
        let (keys, rest) = scratch.split_at_mut(plan.tile_len() * hd);
        let (values, rest) = rest.split_at_mut(plan.tile_len() * hd);
        let (scores, rest) = rest.split_at_mut(plan.tile_len());
        let (queries, rest) = rest.split_at_mut(plan.block_tokens * group * hd);
        let n_states = unit.tokens.len() * hg;
        let (running, rest) = rest.split_at_mut(n_states * state_len);
        let segment_states = &mut rest[..n_states * state_len];
        let chunk = &self.batch.chunks[unit.chunk];
        let first = self.step.first_pos[unit.chunk];
        let pages = self.step.group(self.layer)?.table(unit.chunk);
        let storage = self.storage;
        let visible_max = first + unit.tokens.end;
        let kernel = attention_kernels();
        // Pages go to the kernel as they are, without a widened copy, where it takes them.
        let layout = storage.layout();
        let rows_in_place = kernel.rows_in_place(
            layout.dtype.element_type(),
            hd,
            layout.page_size,
            unit.tokens.len() * hg,
        );
        running.chunks_exact_mut(state_len).for_each(empty);
        for segment in unit.segments.clone() {
            segment_states.chunks_exact_mut(state_len).for_each(empty);
            let start = segment * plan.segment_len();
            let end = visible_max.min(start + plan.segment_len());
            for tile_start in (start..end).step_by(plan.tile_len()) {
                let rows = plan.tile_len().min(end - tile_start);
                // The tile as the kernel reads it: pages as they are, or a widened copy.
                let mut key_pages = [KvBlock::F32(&[]); TILE_POSITIONS / IN_PLACE_PAGE];
                let mut value_pages = key_pages;
                for (p, page_start) in (tile_start..tile_start + rows)
                    .step_by(plan.page_size)
                    .enumerate()
                {
                    let page = PageId(pages[page_start / plan.page_size]);
                    let block = |kind| storage.block(page, self.layer, unit.kv_head, kind);
                    if rows_in_place.is_some() {
                        (key_pages[p], value_pages[p]) =
                            (block(KvKind::Key)?, block(KvKind::Value)?);
                        continue;
                    }
                    let page_rows =
                        page_start..(page_start + plan.page_size).min(tile_start + rows);
                    self.widen(page, unit.kv_head, page_rows, tile_start, keys, values)?;
                }
                // The first `n` positions of the tile into `states`, for the query rows `q`.
                let mut attend = |states: &mut [f32], q: &[f32], n: usize| match rows_in_place {
                    Some(rows) => {
                        let used = n.div_ceil(plan.page_size);
                        let (k, v) = (&key_pages[..used], &value_pages[..used]);
                        rows.call(states, q, k, v, n, hd)
                    }
                    None => {
                        let (k, v) = (&keys[..n * hd], &values[..n * hd]);
                        kernel.page(states, q, k, v, &mut scores[..n]);
                    }
                };
                // The query heads of this KV head for a token, side by side like their states.
                let q_of = |i: usize| {
                    let token = chunk.start + i;
                    let head = unit.kv_head * group + unit.heads.start;
                    &self.q[token * h.q_dim() + head * hd..][..hg * hd]
                };
                // The tokens that see the whole tile (the last ones) go in one call, their
                // rows gathered side by side; those before see part of it, one at a time.
                let whole = unit
                    .tokens
                    .clone()
                    .position(|i| first + i + 1 >= tile_start + rows)
                    .unwrap_or(unit.tokens.len());
                for (ti, i) in unit.tokens.clone().enumerate().take(whole) {
                    let visible = first + i + 1;
                    if visible > tile_start {
                        let states = &mut segment_states[ti * hg * state_len..];
                        attend(&mut states[..hg * state_len], q_of(i), visible - tile_start);
                    }
                }
                let states = &mut segment_states[whole * hg * state_len..];
                match unit.tokens.len() - whole {
                    0 => {}
                    1 => attend(states, q_of(unit.tokens.end - 1), rows),
                    count => {
                        let gathered = &mut queries[..count * hg * hd];
                        for (rows, i) in gathered
                            .chunks_exact_mut(hg * hd)
                            .zip(unit.tokens.clone().skip(whole))
                        {
                            rows.copy_from_slice(q_of(i));
                        }
                        attend(states, gathered, rows);
                    }
                }
            }
            self.deliver(unit, sink, segment, segment_states, running);
        }
        self.write_out(unit, sink, running);
        Ok(())
    }

    /// [`Attention::unit`] for layers whose scores are not plain (another scale, a soft-cap,
    /// a sliding window): the tiles are widened, and each token takes the positions of each
    /// tile it sees, with the general kernel.
    fn unit_general(
        &self,
        unit: &Unit,
        scratch: &mut [f32],
        sink: Sink<'_>,
    ) -> Result<(), BackendError> {
        let plan = self.plan;
        let h = &plan.heads;
        let (hd, group, state_len) = (h.head_dim, h.group(), state_len(h));
        let hg = unit.heads.len();
        let (keys, rest) = scratch.split_at_mut(plan.tile_len() * hd);
        let (values, rest) = rest.split_at_mut(plan.tile_len() * hd);
        let (scores, rest) = rest.split_at_mut(plan.tile_len());
        let rest = &mut rest[plan.block_tokens * group * hd..];
        let n_states = unit.tokens.len() * hg;
        let (running, rest) = rest.split_at_mut(n_states * state_len);
        let segment_states = &mut rest[..n_states * state_len];
        let chunk = &self.batch.chunks[unit.chunk];
        let first = self.step.first_pos[unit.chunk];
        let pages = self.step.group(self.layer)?.table(unit.chunk);
        let kernel = attention_kernels();
        let lowest = self.scores.first_visible(first + unit.tokens.start);
        running.chunks_exact_mut(state_len).for_each(empty);
        for segment in unit.segments.clone() {
            segment_states.chunks_exact_mut(state_len).for_each(empty);
            let start = segment * plan.segment_len();
            let end = (first + unit.tokens.end).min(start + plan.segment_len());
            for tile_start in (start..end).step_by(plan.tile_len()) {
                let tile_end = end.min(tile_start + plan.tile_len());
                if tile_end <= lowest {
                    continue;
                }
                // Pages before the one holding `lowest` may be gone (given back by the window).
                let from = tile_start.max(lowest / plan.page_size * plan.page_size);
                for page_start in (from..tile_end).step_by(plan.page_size) {
                    let page = PageId(pages[page_start / plan.page_size]);
                    let page_rows = page_start..(page_start + plan.page_size).min(tile_end);
                    self.widen(page, unit.kv_head, page_rows, tile_start, keys, values)?;
                }
                for (ti, i) in unit.tokens.clone().enumerate() {
                    let pos = first + i;
                    let lo = self.scores.first_visible(pos).max(tile_start) - tile_start;
                    let hi = (pos + 1).min(tile_end).saturating_sub(tile_start);
                    if lo >= hi {
                        continue;
                    }
                    let token = chunk.start + i;
                    let head = unit.kv_head * group + unit.heads.start;
                    let q = &self.q[token * h.q_dim() + head * hd..];
                    kernel.general(
                        &mut segment_states[ti * hg * state_len..][..hg * state_len],
                        &q[..hg * hd],
                        &keys[lo * hd..hi * hd],
                        &values[lo * hd..hi * hd],
                        &mut scores[..hi - lo],
                        self.scores.scale,
                        self.scores.softcap,
                    );
                }
            }
            self.deliver(unit, sink, segment, segment_states, running);
        }
        self.write_out(unit, sink, running);
        Ok(())
    }

    /// Copies the keys and values of positions `positions` (all in page `page`) of KV head
    /// `kv_head` as f32 into the tile buffers, whose first row is position `tile_start`.
    fn widen(
        &self,
        page: PageId,
        kv_head: usize,
        positions: Range<usize>,
        tile_start: usize,
        keys: &mut [f32],
        values: &mut [f32],
    ) -> Result<(), BackendError> {
        let hd = self.plan.heads.head_dim;
        let rows = (positions.start - tile_start) * hd..(positions.end - tile_start) * hd;
        let storage = self.storage;
        let block = |kind| storage.block(page, self.layer, kv_head, kind);
        let kernel = attention_kernels();
        kernel.read(block(KvKind::Key)?, hd, &mut keys[rows.clone()]);
        kernel.read(block(KvKind::Value)?, hd, &mut values[rows]);
        Ok(())
    }

    /// The sink logit of query head `head`, where the layer has sinks.
    fn sink(&self, head: usize) -> Option<f32> {
        self.sinks.map(|s| s[head])
    }

    /// Whether the token at `pos` sees any position of segment `segment`.
    fn sees_segment(&self, pos: usize, segment: usize) -> bool {
        let start = segment * self.plan.segment_len();
        pos >= start && self.scores.first_visible(pos) < start + self.plan.segment_len()
    }

    /// Hands the states of one segment on: to the partials when units are split by segment,
    /// else merged into the unit's running states (for the tokens that see the segment).
    fn deliver(
        &self,
        unit: &Unit,
        sink: Sink<'_>,
        segment: usize,
        segment_states: &[f32],
        running: &mut [f32],
    ) {
        let h = &self.plan.heads;
        let (hg, state_len) = (unit.heads.len(), state_len(h));
        match sink {
            Sink::Partials(partials, task) => {
                let at = task * n_states_max(self.plan) * state_len;
                // SAFETY: task `task` alone writes its slot of the partials.
                let slot = unsafe { partials.range_mut(at..at + segment_states.len()) };
                slot.copy_from_slice(segment_states);
            }
            Sink::Out(_) => {
                let (first, kernel) = (self.step.first_pos[unit.chunk], attention_kernels());
                for (ti, i) in unit.tokens.clone().enumerate() {
                    if !self.sees_segment(first + i, segment) {
                        continue;
                    }
                    for g in 0..hg {
                        let at = (ti * hg + g) * state_len;
                        let seg = &segment_states[at..at + state_len];
                        kernel.merge(&mut running[at..at + state_len], seg);
                    }
                }
            }
        }
    }

    /// The outputs of a unit that merged its segments itself.
    fn write_out(&self, unit: &Unit, sink: Sink<'_>, running: &[f32]) {
        let Sink::Out(out) = sink else { return };
        let h = &self.plan.heads;
        let (hd, group, state_len) = (h.head_dim, h.group(), state_len(h));
        let hg = unit.heads.len();
        let chunk = &self.batch.chunks[unit.chunk];
        for (ti, i) in unit.tokens.clone().enumerate() {
            let token = chunk.start + i;
            for g in 0..hg {
                let head = unit.kv_head * group + unit.heads.start + g;
                let at = token * h.q_dim() + head * hd;
                // SAFETY: the columns of this unit's heads for its tokens are its own.
                let dst = unsafe { out.range_mut(at..at + hd) };
                let state = &running[(ti * hg + g) * state_len..][..state_len];
                finish(state, self.sink(head), dst);
            }
        }
    }

    /// Merges the segments' states of every token in order, as a unit that is not split
    /// merges them, and writes the outputs.
    fn merge_partials(&self, partials: &[f32], out: &mut [f32]) {
        let plan = self.plan;
        let h = &plan.heads;
        let (hd, group, state_len) = (h.head_dim, h.group(), state_len(h));
        let slot_len = n_states_max(plan) * state_len;
        let kernel = attention_kernels();
        let mut running = [0f32; MAX_STATE];
        let running = &mut running[..state_len];
        for (c, chunk) in self.batch.chunks.iter().enumerate() {
            let first = self.step.first_pos[c];
            for i in 0..chunk.len {
                let (block, ti) = (i / plan.block_tokens, i % plan.block_tokens);
                let token = chunk.start + i;
                let n_segments = (first + i + 1).div_ceil(plan.segment_len());
                for kv_head in 0..h.n_head_kv {
                    for g in 0..group {
                        empty(running);
                        for segment in 0..n_segments {
                            if !self.sees_segment(first + i, segment) {
                                continue;
                            }
                            let task = ((c * plan.blocks + block) * h.n_head_kv + kv_head)
                                * plan.segments
                                + segment;
                            let at = task * slot_len + (ti * group + g) * state_len;
                            kernel.merge(running, &partials[at..at + state_len]);
                        }
                        let head = kv_head * group + g;
                        let dst = &mut out[token * h.q_dim() + head * hd..][..hd];
                        finish(running, self.sink(head), dst);
                    }
                }
            }
        }
    }
}

/// The largest head dimension whose state fits the merge pass's stack buffer.
pub(crate) const MAX_HEAD_DIM: usize = 512;
const MAX_STATE: usize = MAX_HEAD_DIM + 2;

/// States per unit slot of the partials.
fn n_states_max(plan: &Plan) -> usize {
    plan.block_tokens * plan.heads.group()
}

/// Where a unit's results go.
#[derive(Clone, Copy)]
enum Sink<'a> {
    /// Finished outputs.
    Out(&'a DisjointSlice<'a, f32>),
    /// The segment's states, to slot `task` of the partials.
    Partials(&'a DisjointSlice<'a, f32>, usize),
}

/// A state that has seen no position.
fn empty(state: &mut [f32]) {
    state[0] = f32::NEG_INFINITY;
    state[1..].fill(0.0);
}

/// The attention output of a state: the weighted values over the sum, to which a sink logit
/// adds its exponential (relative to the state's maximum, as the sum's terms are).
fn finish(state: &[f32], sink: Option<f32>, out: &mut [f32]) {
    let sum = match sink {
        Some(sink) => state[1] + (sink - state[0]).exp(),
        None => state[1],
    };
    let inv = 1.0 / sum;
    for (o, &a) in out.iter_mut().zip(&state[2..]) {
        *o = a * inv;
    }
}

#[cfg(test)]
mod tests {
    use tallow_backend::Scores;

    /// A reference softmax attention in f64.
    fn reference(q: &[f32], keys: &[f32], values: &[f32]) -> Vec<f64> {
        reference_with(q, keys, values, Scores::plain(q.len()), None)
    }

    /// [`reference`] with the scale and soft-cap of `params` and a sink logit (the caller
    /// picks the visible keys).
    fn reference_with(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        params: Scores,
        sink: Option<f32>,
    ) -> Vec<f64> {
        let hd = q.len();
        let scores: Vec<f64> = keys
            .chunks_exact(hd)
            .map(|k| {
                let s = q
                    .iter()
                    .zip(k)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
                    * f64::from(params.scale);
                params
                    .softcap
                    .map_or(s, |cap| f64::from(cap) * (s / f64::from(cap)).tanh())
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sink = sink.map_or(0.0, |s| (f64::from(s) - max).exp());
        let total: f64 = weights.iter().sum::<f64>() + sink;
        (0..hd)
            .map(|d| {
                weights
                    .iter()
                    .zip(values.chunks_exact(hd))
                    .map(|(w, v)| w * f64::from(v[d]))
                    .sum::<f64>()
                    / total
            })
            .collect()
    }

    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = (self.0)
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        }
    }

    /// Chunks of several lengths at several offsets, over pages of 4 in f32 (segments of 32
    /// positions), split by segment or not: every token's output is softmax attention over its
    /// visible positions, and the same bits whether it runs alone or in a chunk.
    #[test]
    fn paged_attention_matches_the_reference_for_any_chunking() {
        let chunks = chunks_of_75_positions();
        check_paged_attention(
            4,
            tallow_kv::KvDtype::F32,
            75,
            &chunks,
            Scores::plain(64),
            1.0,
            None,
        );
    }

    /// Sliding windows (shorter and longer than a segment), soft-capping and another scale,
    /// over f32 pages of 4 and f16 pages of 16: each token attends to its last `window`
    /// positions only, with the same bits alone or in any chunk.
    #[test]
    fn windowed_softcapped_attention_matches_the_reference_for_any_chunking() {
        let chunks = chunks_of_75_positions();
        for window in [1, 7, 37, 200] {
            let params = Scores {
                scale: 0.1,
                softcap: Some(1.5),
                window: Some(window),
            };
            check_paged_attention(4, tallow_kv::KvDtype::F32, 75, &chunks, params, 1.0, None);
        }
        let chunks = chunks_of_300_positions();
        let params = Scores {
            scale: 0.125,
            softcap: None,
            window: Some(150),
        };
        check_paged_attention(16, tallow_kv::KvDtype::F16, 300, &chunks, params, 1.0, None);
    }

    /// Chunks of 75 positions over pages of 4 (segments of 32), at several offsets: with 1
    /// and 8 threads, [`check_paged_attention`] sees units split by segment and not, and
    /// query heads cut between threads.
    fn chunks_of_75_positions() -> [Vec<(usize, usize)>; 4] {
        [
            vec![(0, 75)],
            vec![(4, 5)],
            vec![(30, 9), (0, 3)],
            vec![(60, 15), (8, 20), (33, 1)],
        ]
    }

    /// Chunks of 300 positions over pages of 16 (segments of 128), at several offsets: with
    /// 1 and 8 threads, [`check_paged_attention`] sees units split by segment and not.
    fn chunks_of_300_positions() -> [Vec<(usize, usize)>; 4] {
        [
            vec![(0, 300)],
            vec![(4, 5)],
            vec![(130, 9), (0, 3)],
            vec![(250, 50), (8, 20), (133, 1)],
        ]
    }

    /// The same over f16 pages of 16 (segments of 128 positions), which the AVX-512 kernel
    /// reads straight from the pool; and with queries 40 times larger, whose scores spread over
    /// hundreds (a standard deviation of about 53), so that most of a token's weights fall
    /// under the cutoff (exp(-64) of the largest) and count as 0: every output still matches
    /// the reference (which keeps them), with the same bits alone or in a chunk.
    #[test]
    fn paged_attention_over_f16_pages_matches_the_reference_for_any_chunking() {
        let chunks = chunks_of_300_positions();
        for query_scale in [1.0, 40.0] {
            let (dtype, params) = (tallow_kv::KvDtype::F16, Scores::plain(64));
            check_paged_attention(16, dtype, 300, &chunks, params, query_scale, None);
        }
    }

    /// The same over Q8_0 and Q4_0 pages: the reference sees the values the blocks hold.
    #[test]
    fn paged_attention_over_quantized_pages_matches_the_reference_for_any_chunking() {
        let chunks = chunks_of_300_positions();
        for dtype in [tallow_kv::KvDtype::Q8_0, tallow_kv::KvDtype::Q4_0] {
            check_paged_attention(16, dtype, 300, &chunks, Scores::plain(64), 1.0, None);
        }
    }

    /// The same over bf16 pages, plain and with the general kernel's sliding window.
    #[test]
    fn paged_attention_over_bf16_pages_matches_the_reference_for_any_chunking() {
        let chunks = chunks_of_300_positions();
        let windowed = Scores {
            scale: 0.125,
            softcap: Some(2.0),
            window: Some(150),
        };
        for params in [Scores::plain(64), windowed] {
            check_paged_attention(
                16,
                tallow_kv::KvDtype::Bf16,
                300,
                &chunks,
                params,
                1.0,
                None,
            );
        }
    }

    /// Sinks: a logit per query head in each softmax's denominator (some far above the
    /// scores, some far below), windowed and not.
    #[test]
    fn attention_with_sinks_matches_the_reference_for_any_chunking() {
        let chunks = chunks_of_75_positions();
        let sinks = [0.5, -3.0, 2.0, 8.0, -20.0, 0.0, 1.0, 3.0, -1.0];
        for window in [None, Some(9)] {
            let params = Scores {
                window,
                ..Scores::plain(64)
            };
            let dtype = tallow_kv::KvDtype::F32;
            check_paged_attention(4, dtype, 75, &chunks, params, 1.0, Some(&sinks));
        }
    }

    fn check_paged_attention(
        page_size: usize,
        dtype: tallow_kv::KvDtype,
        total: usize,
        chunk_sets: &[Vec<(usize, usize)>],
        params: Scores,
        query_scale: f32,
        sinks: Option<&[f32]>,
    ) {
        use tallow_backend::{Batch, Logits};
        use tallow_kv::{KvBudget, KvDtype, KvLayout, LayerGroups};

        use crate::pages::{host_cache, HostPages};

        let heads = tallow_backend::Heads {
            n_head: 9,
            n_head_kv: 3,
            head_dim: 64,
        };
        let (hd, q_dim, kv_dim) = (64, 9 * 64, 3 * 64);
        let layout = KvLayout::new(1, 3, hd)
            .with_page_size(page_size)
            .with_dtype(dtype);
        let mut rng = Lcg(3);
        // The reference sees the keys and values as the pages hold them.
        let stored = |row: Vec<f32>| -> Vec<f32> {
            match dtype.block_format() {
                None if dtype == KvDtype::F16 => row
                    .iter()
                    .map(|&x| half::f16::from_f32(x).to_f32())
                    .collect(),
                None if dtype == KvDtype::Bf16 => row
                    .iter()
                    .map(|&x| half::bf16::from_f32(x).to_f32())
                    .collect(),
                None => row,
                Some(format) => {
                    let mut bytes = vec![0u8; dtype.bytes_for(row.len())];
                    tallow_quant::quantize_row(format, &row, &mut bytes).unwrap();
                    let mut out = vec![0f32; row.len()];
                    tallow_quant::dequantize(format, &bytes, &mut out).unwrap();
                    out
                }
            }
        };
        let keys = stored((0..total * kv_dim).map(|_| rng.next()).collect());
        let values = stored((0..total * kv_dim).map(|_| rng.next()).collect());
        let queries: Vec<f32> = (0..total * q_dim)
            .map(|_| rng.next() * query_scale)
            .collect();

        // Runs `chunks` (first position, length) of one sequence each; returns each token's
        // output by position.
        let run = |chunks: &[(usize, usize)], threads: usize| {
            let groups = LayerGroups::global(1).unwrap();
            let mut cache = host_cache(layout, groups, KvBudget::Pages(200)).unwrap();
            let mut batch = Batch::new();
            let mut q = Vec::new();
            let mut first_pos = Vec::new();
            for &(first, len) in chunks {
                let seq = cache.create();
                cache.append_slots(seq, first + len).unwrap();
                for pos in 0..first + len {
                    let at = pos * kv_dim..(pos + 1) * kv_dim;
                    cache
                        .write_pos(seq, pos, 0, &keys[at.clone()], &values[at])
                        .unwrap();
                }
                batch.push(seq, &vec![0; len], Logits::None);
                q.extend_from_slice(&queries[first * q_dim..(first + len) * q_dim]);
                first_pos.push(first);
            }
            let mut step = tallow_backend::StepPlan::new();
            step.build(&batch, &cache).unwrap();
            assert_eq!(step.first_pos, first_pos);
            // `threads` only steers the choice to split by segment; the scratch is the pool's.
            let plan = super::Plan::new(heads, page_size, &batch, &first_pos, threads);
            let pool_threads = tallow_threads::global().threads();
            let mut scratch = vec![0f32; pool_threads * plan.thread_scratch_len()];
            let mut partials = vec![0f32; plan.partials_len(chunks.len())];
            let mut out = vec![0f32; q.len()];
            let attention = super::Attention {
                plan: &plan,
                step: &step,
                storage: cache.storage().unwrap(),
                layer: 0,
                batch: &batch,
                q: &q,
                scores: params,
                sinks,
            };
            attention
                .run(&mut scratch, &mut partials, &mut out)
                .unwrap();
            (plan.split, plan.head_parts > 1, out)
        };

        let check = |pos: usize, out: &[f32]| {
            for head in 0..9 {
                let kv_head = head / 3;
                let q = &queries[pos * q_dim + head * hd..][..hd];
                let pick = |m: &[f32]| -> Vec<f32> {
                    (params.first_visible(pos)..=pos)
                        .flat_map(|p| m[p * kv_dim + kv_head * hd..][..hd].to_vec())
                        .collect()
                };
                let sink = sinks.map(|s| s[head]);
                let want = reference_with(q, &pick(&keys), &pick(&values), params, sink);
                for (got, want) in out[head * hd..(head + 1) * hd].iter().zip(&want) {
                    // Scores, and their rounding, grow with the queries.
                    assert!(
                        (f64::from(*got) - want).abs() < 1e-5 * f64::from(query_scale),
                        "pos {pos} head {head} {got} {want}"
                    );
                }
            }
        };

        let threads = tallow_threads::global().threads();
        let mut alone = Vec::new();
        for pos in 0..total {
            let (_, _, out) = run(&[(pos, 1)], threads);
            check(pos, &out);
            alone.push(out);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (mut saw_split, mut saw_parts) = ([false; 2], false);
        for chunks in chunk_sets {
            for threads in [1, 8] {
                let (split, parts, out) = run(chunks, threads);
                saw_split[usize::from(split)] = true;
                saw_parts |= parts;
                let mut rows = out.chunks_exact(q_dim);
                for &(first, len) in chunks {
                    for (pos, want) in alone.iter().enumerate().skip(first).take(len) {
                        let got = rows.next().unwrap();
                        assert_eq!(bits(got), bits(want), "{chunks:?} pos {pos}");
                    }
                }
            }
        }
        assert_eq!(saw_split, [true, true], "both ways of splitting are tested");
        assert!(saw_parts, "query heads cut between threads are tested");
    }

    /// Reading f16, bf16, Q8_0 and Q4_0 pages directly gives the bits of the kernel on the
    /// widened values (for any number of query rows, whether or not the kernel is picked for
    /// that many). Only AVX-512 has such a kernel.
    #[test]
    fn pages_read_in_place_equal_widened_rows() {
        use crate::pages::KvStorage;
        use tallow_kv::{KvDtype, KvKind, KvLayout, PageId, Slot};
        use tallow_quant::KvBlock;
        let kernel = super::attention_kernels();
        let mut rng = Lcg(13);
        for dtype in [KvDtype::F16, KvDtype::Bf16, KvDtype::Q8_0, KvDtype::Q4_0] {
            for (hd, rows) in [(64, 3), (64, 4), (64, 7), (128, 2), (128, 3)] {
                let layout = KvLayout::new(1, 1, hd).with_page_size(16).with_dtype(dtype);
                let Some(in_place) = kernel.rows_in_place(dtype.element_type(), hd, 16, 1) else {
                    assert!(tallow_quant::Isa::detected() < tallow_quant::Isa::Avx512);
                    return;
                };
                for n in [1usize, 5, 16, 17, 40, 63, 64] {
                    let q: Vec<f32> = (0..rows * hd).map(|_| rng.next()).collect();
                    // Whole pages of 16 positions, past the visible ones too.
                    let pages = n.div_ceil(16);
                    let mut storage = KvStorage::new(layout, pages).unwrap();
                    let slots: Vec<Slot> = (0..pages * 16)
                        .map(|i| Slot {
                            page: PageId((i / 16) as u32),
                            offset: i % 16,
                        })
                        .collect();
                    let mut random = || (0..slots.len() * hd).map(|_| rng.next()).collect();
                    let (k, v): (Vec<f32>, Vec<f32>) = (random(), random());
                    storage.write_tokens(&slots, 0, &k, &v).unwrap();
                    let blocks = |kind| -> Vec<KvBlock<'_>> {
                        (0..pages)
                            .map(|p| storage.block(PageId(p as u32), 0, 0, kind).unwrap())
                            .collect()
                    };
                    let (key_pages, value_pages) = (blocks(KvKind::Key), blocks(KvKind::Value));
                    let widen = |pages: &[KvBlock<'_>]| {
                        let mut out = vec![0f32; pages.len() * 16 * hd];
                        for (p, block) in pages.iter().enumerate() {
                            block.read_f32(hd, &mut out[p * 16 * hd..][..16 * hd]);
                        }
                        out.truncate(n * hd);
                        out
                    };
                    let start: Vec<f32> = (0..rows * (hd + 2)).map(|_| rng.next()).collect();
                    let mut want = start.clone();
                    let (k, v) = (widen(&key_pages), widen(&value_pages));
                    kernel.page(&mut want, &q, &k, &v, &mut vec![0.0; n]);
                    let mut got = start;
                    in_place.call(&mut got, &q, &key_pages, &value_pages, n, hd);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{dtype:?} hd {hd} rows {rows} n {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn pages_and_merges_give_softmax_attention() {
        let hd = 64;
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        };
        let n = 77;
        let q: Vec<f32> = (0..hd).map(|_| next()).collect();
        let keys: Vec<f32> = (0..n * hd).map(|_| next()).collect();
        let values: Vec<f32> = (0..n * hd).map(|_| next()).collect();
        let want = reference(&q, &keys, &values);
        let kernel = super::attention_kernels();
        // Two segments of pages of 16 (the last one partial), merged.
        let mut running = vec![0f32; hd + 2];
        super::empty(&mut running);
        for segment in [0..48, 48..n] {
            let mut state = vec![0f32; hd + 2];
            super::empty(&mut state);
            for start in segment.clone().step_by(16) {
                let end = segment.end.min(start + 16);
                let mut scores = vec![0f32; end - start];
                kernel.page(
                    &mut state,
                    &q,
                    &keys[start * hd..end * hd],
                    &values[start * hd..end * hd],
                    &mut scores,
                );
            }
            kernel.merge(&mut running, &state);
        }
        let mut out = vec![0f32; hd];
        super::finish(&running, None, &mut out);
        for (got, want) in out.iter().zip(&want) {
            assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want}");
        }
    }
}
