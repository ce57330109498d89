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
//! merged afterwards; otherwise a unit merges its segments itself.

use std::ops::Range;
use std::sync::OnceLock;

use half::f16;
use tallow_backend::{BackendError, Batch, Heads, Scores, StepPlan};
use tallow_kv::{KvKind, KvLayout, PageId};
use tallow_threads::DisjointSlice;

use crate::pages::{KvBlock, KvStorage};

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod fma;

/// Pages per segment.
const SEGMENT_PAGES: usize = 8;
/// Most positions per tile: whole pages, as many as fit, in a number that divides
/// [`SEGMENT_PAGES`].
const TILE_POSITIONS: usize = 64;
/// Tokens of one chunk per unit of work.
const TOKEN_BLOCK: usize = 16;
/// Split units by segment when there are fewer than this many units per thread.
const UNITS_PER_THREAD: usize = 2;

/// Below this, a softmax weight `exp(x)` (`x`: a score less the running maximum) is taken as
/// 0. It is then under 2^-92 of the largest weight, far below what an f32 sum of weights
/// resolves; kept, its products with values are subnormal numbers (a state's weighted sum
/// starts at 0), which x86 cores compute many times slower: a long prompt's attention ran at
/// half speed on them.
const WEIGHT_CUTOFF: f32 = -64.0;

/// The softmax weight `exp(x)` of a score `x` below the running maximum (see
/// [`WEIGHT_CUTOFF`]; 0 where `x` is NaN: an empty state against an empty tile).
#[inline(always)]
fn weight(x: f32) -> f32 {
    if x >= WEIGHT_CUTOFF {
        crate::ops::exp(x)
    } else {
        0.0
    }
}

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
    /// Tokens per block (the longest chunk's length, up to [`TOKEN_BLOCK`]).
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
        let units: usize = (batch.chunks.iter())
            .map(|c| c.len.div_ceil(TOKEN_BLOCK) * heads.n_head_kv)
            .sum();
        let segment_len = SEGMENT_PAGES * page_size;
        let tile_pages = [8, 4, 2]
            .into_iter()
            .find(|&pages| {
                SEGMENT_PAGES.is_multiple_of(pages) && pages * page_size <= TILE_POSITIONS
            })
            .unwrap_or(1);
        let split = units < UNITS_PER_THREAD * threads && longest_seq > segment_len;
        // A row's result does not depend on the rows computed with it, so the query heads of
        // a KV head can go to different threads with the same bits.
        let head_parts = if split || units >= threads {
            1
        } else {
            threads.div_ceil(units).min(heads.group())
        };
        Plan {
            heads,
            page_size,
            tile_pages,
            blocks: longest_chunk.div_ceil(TOKEN_BLOCK),
            segments: longest_seq.div_ceil(segment_len),
            block_tokens: longest_chunk.min(TOKEN_BLOCK),
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
            let tokens = block * TOKEN_BLOCK..len.min((block + 1) * TOKEN_BLOCK);
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
        let kernel = kernels();
        // Pages go to the kernel as they are, without a widened copy, where it takes them.
        let rows_in_place = kernel.rows_in_place(storage.layout(), unit.tokens.len() * hg);
        running.chunks_exact_mut(state_len).for_each(empty);
        for segment in unit.segments.clone() {
            segment_states.chunks_exact_mut(state_len).for_each(empty);
            let start = segment * plan.segment_len();
            let end = visible_max.min(start + plan.segment_len());
            for tile_start in (start..end).step_by(plan.tile_len()) {
                let rows = plan.tile_len().min(end - tile_start);
                // The tile as the kernel reads it: pages as they are, or a widened copy.
                let mut key_pages = [KvBlock::F32(&[]); MAX_TILE_PAGES];
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
                        // SAFETY: `kernels` only picks functions whose features the CPU has;
                        // the kernel checks its operands.
                        unsafe { rows(states, q, k, v, n, hd) }
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
        let kernel = kernels();
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
                        self.scores,
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
        kernels().read(block(KvKind::Key)?, hd, &mut keys[rows.clone()]);
        kernels().read(block(KvKind::Value)?, hd, &mut values[rows]);
        Ok(())
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
                let first = self.step.first_pos[unit.chunk];
                for (ti, i) in unit.tokens.clone().enumerate() {
                    if !self.sees_segment(first + i, segment) {
                        continue;
                    }
                    for g in 0..hg {
                        let at = (ti * hg + g) * state_len;
                        let seg = &segment_states[at..at + state_len];
                        kernels().merge(&mut running[at..at + state_len], seg);
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
                finish(&running[(ti * hg + g) * state_len..][..state_len], dst);
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
        let kernel = kernels();
        let mut running = [0f32; MAX_STATE];
        let running = &mut running[..state_len];
        for (c, chunk) in self.batch.chunks.iter().enumerate() {
            let first = self.step.first_pos[c];
            for i in 0..chunk.len {
                let (block, ti) = (i / TOKEN_BLOCK, i % TOKEN_BLOCK);
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
                        finish(running, dst);
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

/// The attention output of a state: the weighted values over the sum.
fn finish(state: &[f32], out: &mut [f32]) {
    let inv = 1.0 / state[1];
    for (o, &a) in out.iter_mut().zip(&state[2..]) {
        *o = a * inv;
    }
}

/// `(states, q, keys, values, scores)`: see [`Kernels::page`].
type PageFn = unsafe fn(&mut [f32], &[f32], &[f32], &[f32], &mut [f32]);

/// `(states, q, key pages, value pages, positions, head_dim)`: [`Kernels::page`] over pages
/// of 16 positions as the pool holds them.
type RowsInPlaceFn = unsafe fn(&mut [f32], &[f32], &[KvBlock<'_>], &[KvBlock<'_>], usize, usize);

/// Most pages of 16 positions in a tile.
const MAX_TILE_PAGES: usize = TILE_POSITIONS / 16;

/// The inner loops, compiled for the best instruction set of the running CPU.
#[derive(Clone, Copy)]
struct Kernels {
    /// f16 keys or values to f32.
    widen: unsafe fn(&[f16], &mut [f32]),
    page: PageFn,
    /// Where the CPU has one, a kernel that reads pages directly.
    in_place: Option<InPlaceKernel>,
    merge: unsafe fn(&mut [f32], &[f32]),
    general: GeneralFn,
}

/// `(states, q, keys, values, scores, scale, softcap)`: [`Kernels::general`].
type GeneralFn = unsafe fn(&mut [f32], &[f32], &[f32], &[f32], &mut [f32], f32, Option<f32>);

/// A kernel that reads pages directly, and whether it reads those of a layout. (Only x86-64
/// has one so far.)
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct InPlaceKernel {
    rows: RowsInPlaceFn,
    /// Whether it reads the pages of a layout, for a number of query rows at a time.
    reads: fn(&KvLayout, usize) -> bool,
}

impl Kernels {
    /// The kernel that reads the pages of a cache of `layout` directly for `rows` query rows,
    /// where the CPU has one and it reads the layout's dtype, head size and page size for that
    /// many rows. (Its bits are those of the widened copy: the choice changes no result.)
    fn rows_in_place(&self, layout: &KvLayout, rows: usize) -> Option<RowsInPlaceFn> {
        self.in_place
            .filter(|k| (k.reads)(layout, rows))
            .map(|k| k.rows)
    }

    /// Takes `n = scores.len()` positions (`keys` and `values`, `n` rows of the head
    /// dimension) into the states of the query rows `q` (one state per row, side by side in
    /// `states`). Each row's result is the same whatever rows come with it.
    fn page(
        &self,
        states: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
    ) {
        check_operands(states, q, keys, values, scores);
        // SAFETY: `kernels` only picks functions whose features the CPU has.
        unsafe { (self.page)(states, q, keys, values, scores) }
    }

    /// The first `out.len()` values (rows of `head_dim`) of a KV block, as f32.
    fn read(&self, block: KvBlock<'_>, head_dim: usize, out: &mut [f32]) {
        match block {
            // SAFETY: `kernels` only picks functions whose features the CPU has.
            KvBlock::F16(b) => unsafe { (self.widen)(&b[..out.len()], out) },
            KvBlock::F32(b) => out.copy_from_slice(&b[..out.len()]),
            // A shift each (the compiler vectorizes the portable loop).
            KvBlock::Bf16(_) | KvBlock::Quantized(..) => block.read_f32(head_dim, out),
        }
    }

    /// [`Kernels::page`] with the scale and soft-cap of `params`.
    fn general(
        &self,
        states: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
        params: Scores,
    ) {
        check_operands(states, q, keys, values, scores);
        // SAFETY: `kernels` only picks functions whose features the CPU has.
        unsafe {
            (self.general)(
                states,
                q,
                keys,
                values,
                scores,
                params.scale,
                params.softcap,
            )
        }
    }

    /// Merges state `other` into `state`.
    fn merge(&self, state: &mut [f32], other: &[f32]) {
        // SAFETY: as above.
        unsafe { (self.merge)(state, other) }
    }
}

/// Panics unless the operands of a page kernel agree: `n = scores.len()` rows of keys and
/// values, whole query rows, and a state of `head_dim + 2` floats per query row.
fn check_operands(states: &[f32], q: &[f32], keys: &[f32], values: &[f32], scores: &[f32]) {
    let hd = keys.len() / scores.len();
    assert!(
        scores.len() * hd == keys.len()
            && keys.len() == values.len()
            && q.len().is_multiple_of(hd)
            && states.len() == q.len() / hd * (hd + 2)
    );
}

/// f16 to f32 with the `half` crate (which uses F16C where the CPU has it).
fn widen_portable(src: &[f16], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(out);
}

fn kernels() -> Kernels {
    static KERNELS: OnceLock<Kernels> = OnceLock::new();
    *KERNELS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use tallow_quant::Isa;
            if Isa::detected() >= Isa::Avx512 {
                return Kernels {
                    widen: avx512::widen,
                    page: avx512::rows,
                    in_place: Some(InPlaceKernel {
                        rows: avx512::rows_pages,
                        reads: avx512::reads_pages,
                    }),
                    merge: x86::merge_avx512,
                    general: fma::avx512::rows_with,
                };
            }
            if Isa::detected() >= Isa::Avx2 {
                return Kernels {
                    widen: x86::widen_f16c,
                    page: fma::rows_avx2,
                    in_place: None,
                    merge: x86::merge_avx2,
                    general: fma::avx2::rows_with,
                };
            }
        }
        Kernels {
            widen: widen_portable,
            page: portable::page,
            in_place: None,
            merge: portable::merge,
            general: portable::general,
        }
    })
}

/// The loops written once, compiled per instruction set by the wrappers below (the compiler
/// vectorizes them for the features of the function they are inlined into).
mod generic {
    use tallow_backend::Scores;

    use super::weight;
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // Sixteen independent sums: the compiler vectorizes them without reassociating.
        let mut acc = [0f32; 16];
        let (a16, a_tail) = a.as_chunks::<16>();
        let (b16, b_tail) = b.as_chunks::<16>();
        for (x, y) in a16.iter().zip(b16) {
            for i in 0..16 {
                acc[i] += x[i] * y[i];
            }
        }
        let tail: f32 = a_tail.iter().zip(b_tail).map(|(x, y)| x * y).sum();
        acc.iter().sum::<f32>() + tail
    }

    /// [`dot`] of `a` with each of the four rows of `b`, each the same bits as alone: the
    /// rows' sums are independent, and taking them side by side keeps the adds from waiting
    /// on one another (and each chunk of `a` is loaded once for the four).
    #[inline(always)]
    fn dots4(a: &[f32], b: &[f32]) -> [f32; 4] {
        let n = a.len();
        // Arrays spelt out: `std::array::from_fn` may stay out of line in the
        // `target_feature` functions that inline this one.
        let rows: [&[f32]; 4] = [&b[..n], &b[n..2 * n], &b[2 * n..3 * n], &b[3 * n..4 * n]];
        let mut acc = [[0f32; 16]; 4];
        let (a16, a_tail) = a.as_chunks::<16>();
        let [y0, y1, y2, y3] = rows.map(|r| r.as_chunks::<16>().0);
        for ((((x, y0), y1), y2), y3) in a16.iter().zip(y0).zip(y1).zip(y2).zip(y3) {
            for i in 0..16 {
                acc[0][i] += x[i] * y0[i];
                acc[1][i] += x[i] * y1[i];
                acc[2][i] += x[i] * y2[i];
                acc[3][i] += x[i] * y3[i];
            }
        }
        let done = a16.len() * 16;
        let total = |k: usize| {
            let tail: f32 = a_tail
                .iter()
                .zip(&rows[k][done..])
                .map(|(x, y)| x * y)
                .sum();
            acc[k].iter().sum::<f32>() + tail
        };
        [total(0), total(1), total(2), total(3)]
    }

    /// One page for one query head, with the plain scale (what the tests compare with).
    #[cfg(test)]
    #[inline(always)]
    pub(super) fn page(
        state: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
    ) {
        let scale = Scores::plain(q.len()).scale;
        page_with(state, q, keys, values, scores, scale, None)
    }

    /// [`page`] with scores `dot * scale`, soft-capped to `cap * tanh(score / cap)`.
    #[inline(always)]
    pub(super) fn page_with(
        state: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
        scale: f32,
        softcap: Option<f32>,
    ) {
        let hd = q.len();
        let (fours, rest) = scores.as_chunks_mut::<4>();
        for (s, k) in fours.iter_mut().zip(keys.chunks_exact(4 * hd)) {
            *s = dots4(q, k);
        }
        let done = fours.len() * 4;
        for (s, k) in rest.iter_mut().zip(keys[done * hd..].chunks_exact(hd)) {
            *s = dot(q, k);
        }
        let alpha = softmax(state, scores, scale, softcap);
        let acc = &mut state[2..];
        let done = weighted_values::<64>(acc, 0, alpha, scores, values);
        let done = weighted_values::<16>(acc, done, alpha, scores, values);
        weighted_values::<1>(acc, done, alpha, scores, values);
    }

    /// The scores of one page taken into a state `[max, sum, acc...]`: scaled (and
    /// soft-capped), turned into weights `exp(score - new max)` in place, their sum added to
    /// the state's rescaled sum; returns the factor `alpha` that rescales the state's
    /// accumulated values to the new max.
    #[inline(always)]
    pub(super) fn softmax(
        state: &mut [f32],
        scores: &mut [f32],
        scale: f32,
        softcap: Option<f32>,
    ) -> f32 {
        for s in scores.iter_mut() {
            *s *= scale;
            if let Some(cap) = softcap {
                *s = cap * (*s / cap).tanh();
            }
        }
        let page_max = lanes(scores, f32::NEG_INFINITY, f32::max);
        let new_max = state[0].max(page_max);
        let alpha = weight(state[0] - new_max);
        for s in scores.iter_mut() {
            *s = weight(*s - new_max);
        }
        let sum = lanes(scores, 0.0, |a, b| a + b);
        state[1] = state[1] * alpha + sum;
        state[0] = new_max;
        alpha
    }

    /// `values` folded by `op` in eight running results, then those in order and the values
    /// past the last eight: a loop with one running result is a chain of dependent operations
    /// that does not vectorize. (A maximum is the same in any order.)
    #[inline(always)]
    fn lanes(values: &[f32], start: f32, op: impl Fn(f32, f32) -> f32) -> f32 {
        let mut running = [start; 8];
        let (chunks, tail) = values.as_chunks::<8>();
        for chunk in chunks {
            for (r, &v) in running.iter_mut().zip(chunk) {
                *r = op(*r, v);
            }
        }
        let folded = running.into_iter().fold(start, &op);
        tail.iter().fold(folded, |a, &v| op(a, v))
    }

    /// `acc = acc * alpha + sum(p * v)` over the positions' weights `scores` and value rows
    /// `values`, for the elements of `acc` from `from` on in blocks of `N`; returns where the
    /// whole blocks end. Each element is scaled, then takes the positions in order, as a loop
    /// over positions would do it, but a block stays in registers across the positions
    /// instead of going through memory once per position (and `N` independent sums keep the
    /// adds from waiting on one another).
    #[inline(always)]
    fn weighted_values<const N: usize>(
        acc: &mut [f32],
        from: usize,
        alpha: f32,
        scores: &[f32],
        values: &[f32],
    ) -> usize {
        let hd = acc.len();
        let mut at = from;
        while at + N <= hd {
            let block: &mut [f32; N] = (&mut acc[at..at + N]).try_into().unwrap();
            let mut sums = block.map(|a| a * alpha);
            for (&p, v) in scores.iter().zip(values.chunks_exact(hd)) {
                let x: &[f32; N] = v[at..at + N].try_into().unwrap();
                for i in 0..N {
                    sums[i] += p * x[i];
                }
            }
            *block = sums;
            at += N;
        }
        at
    }

    /// [`page`] for each query row of `q`, with its state in `states`.
    #[inline(always)]
    pub(super) fn rows(
        states: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
    ) {
        let scale = Scores::plain(keys.len() / scores.len()).scale;
        rows_with(states, q, keys, values, scores, scale, None)
    }

    /// [`page_with`] for each query row of `q`: [`JOINT_ROWS`] rows at a time where the
    /// tile has at most [`super::TILE_POSITIONS`] positions, so that each key and value row is
    /// loaded once for them all; each row's result is the same bits as alone.
    #[inline(always)]
    pub(super) fn rows_with(
        states: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
        scale: f32,
        softcap: Option<f32>,
    ) {
        let n = scores.len();
        let hd = keys.len() / n;
        let rows = q.len() / hd;
        let joint = if n <= super::TILE_POSITIONS {
            rows / JOINT_ROWS * JOINT_ROWS
        } else {
            0
        };
        let (joint_states, states) = states.split_at_mut(joint * (hd + 2));
        let (joint_q, q) = q.split_at(joint * hd);
        for (states, q) in joint_states
            .chunks_exact_mut(JOINT_ROWS * (hd + 2))
            .zip(joint_q.chunks_exact(JOINT_ROWS * hd))
        {
            let mut rest = [0f32; (JOINT_ROWS - 1) * super::TILE_POSITIONS];
            joint_rows(states, q, keys, values, scores, &mut rest, scale, softcap);
        }
        for (state, q) in states.chunks_exact_mut(hd + 2).zip(q.chunks_exact(hd)) {
            page_with(state, q, keys, values, scores, scale, softcap);
        }
    }

    /// Query rows [`rows_with`] takes through the keys and values together.
    const JOINT_ROWS: usize = 4;

    /// [`page_with`] for [`JOINT_ROWS`] query rows at once: the scores of row 0 in `scores`,
    /// of the others in `rest`; every score and every element of a state computed with the
    /// operations of [`page_with`], in its order.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn joint_rows(
        states: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
        rest: &mut [f32],
        scale: f32,
        softcap: Option<f32>,
    ) {
        let n = scores.len();
        let hd = keys.len() / n;
        let (r1, rest) = rest.split_at_mut(n);
        let (r2, rest) = rest.split_at_mut(n);
        let r3 = &mut rest[..n];
        let mut rows: [&mut [f32]; JOINT_ROWS] = [scores, r1, r2, r3];
        let qr: [&[f32]; JOINT_ROWS] = [&q[..hd], &q[hd..2 * hd], &q[2 * hd..3 * hd], &q[3 * hd..]];
        // The scores: each key's chunks loaded once for the four rows, each row's sums as
        // `dot` makes them.
        let [q0, q1, q2, q3] = qr.map(|q| q.as_chunks::<16>().0);
        for (j, key) in keys.chunks_exact(hd).enumerate() {
            let mut acc = [[0f32; 16]; JOINT_ROWS];
            let (k16, k_tail) = key.as_chunks::<16>();
            for ((((y, x0), x1), x2), x3) in k16.iter().zip(q0).zip(q1).zip(q2).zip(q3) {
                for i in 0..16 {
                    acc[0][i] += x0[i] * y[i];
                    acc[1][i] += x1[i] * y[i];
                    acc[2][i] += x2[i] * y[i];
                    acc[3][i] += x3[i] * y[i];
                }
            }
            let done = k16.len() * 16;
            for ((row, acc), q) in rows.iter_mut().zip(&acc).zip(&qr) {
                let tail: f32 = q[done..].iter().zip(k_tail).map(|(x, y)| x * y).sum();
                row[j] = acc.iter().sum::<f32>() + tail;
            }
        }
        // The softmax of each row, as `page_with`.
        let mut alphas = [0f32; JOINT_ROWS];
        for ((row, state), alpha) in rows
            .iter_mut()
            .zip(states.chunks_exact_mut(hd + 2))
            .zip(&mut alphas)
        {
            *alpha = softmax(state, row, scale, softcap);
        }
        // The values: a block of 16 elements of the four rows in registers across the
        // positions, each value chunk loaded once for the four.
        let mut accs = states.chunks_exact_mut(hd + 2).map(|s| &mut s[2..]);
        let mut accs: [&mut [f32]; JOINT_ROWS] = [
            accs.next().unwrap(),
            accs.next().unwrap(),
            accs.next().unwrap(),
            accs.next().unwrap(),
        ];
        let mut at = 0;
        while at + 16 <= hd {
            let mut sums = [[0f32; 16]; JOINT_ROWS];
            for ((sums, acc), alpha) in sums.iter_mut().zip(&accs).zip(alphas) {
                for i in 0..16 {
                    sums[i] = acc[at + i] * alpha;
                }
            }
            let [w0, w1, w2, w3] = [&*rows[0], &*rows[1], &*rows[2], &*rows[3]];
            for ((((v, &w0), &w1), &w2), &w3) in
                values.chunks_exact(hd).zip(w0).zip(w1).zip(w2).zip(w3)
            {
                let x: &[f32; 16] = v[at..at + 16].try_into().unwrap();
                for i in 0..16 {
                    sums[0][i] += w0 * x[i];
                    sums[1][i] += w1 * x[i];
                    sums[2][i] += w2 * x[i];
                    sums[3][i] += w3 * x[i];
                }
            }
            for (sums, acc) in sums.iter().zip(&mut accs) {
                acc[at..at + 16].copy_from_slice(sums);
            }
            at += 16;
        }
        for ((acc, alpha), row) in accs.iter_mut().zip(alphas).zip(&rows) {
            let scores: &[f32] = row;
            weighted_values::<1>(acc, at, alpha, scores, values);
        }
    }

    #[inline(always)]
    pub(super) fn merge(state: &mut [f32], other: &[f32]) {
        let new_max = state[0].max(other[0]);
        let a = weight(state[0] - new_max);
        let b = weight(other[0] - new_max);
        state[0] = new_max;
        state[1] = state[1] * a + other[1] * b;
        for (x, &y) in state[2..].iter_mut().zip(&other[2..]) {
            *x = *x * a + y * b;
        }
    }
}

mod portable {
    pub(super) unsafe fn page(
        states: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
    ) {
        super::generic::rows(states, q, keys, values, scores)
    }

    pub(super) unsafe fn merge(state: &mut [f32], other: &[f32]) {
        super::generic::merge(state, other)
    }

    pub(super) unsafe fn general(
        states: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
        scale: f32,
        softcap: Option<f32>,
    ) {
        super::generic::rows_with(states, q, keys, values, scores, scale, softcap)
    }
}

/// `unsafe fn $name(args)` calling `generic::$generic(args)`, compiled with `$features`: the
/// generic loops vectorized for one instruction set.
#[cfg(target_arch = "x86_64")]
macro_rules! compiled_with {
    ($features:literal: $($name:ident => $generic:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name($($arg: $ty),*) {
                super::generic::$generic($($arg),*)
            }
        )*
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// f16 to f32 with F16C, eight values per instruction (exact, as every f16 conversion).
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn widen_f16c(src: &[f16], out: &mut [f32]) {
        assert_eq!(src.len(), out.len());
        let (src8, src_tail) = src.as_chunks::<8>();
        let (out8, out_tail) = out.as_chunks_mut::<8>();
        for (s, o) in src8.iter().zip(out8) {
            let halves = _mm_loadu_si128(s.as_ptr().cast());
            _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(halves));
        }
        for (s, o) in src_tail.iter().zip(out_tail) {
            *o = s.to_f32();
        }
    }

    compiled_with!("avx512f,avx2,fma":
        merge_avx512 => merge(state: &mut [f32], other: &[f32]);
    );
    compiled_with!("avx2,fma":
        merge_avx2 => merge(state: &mut [f32], other: &[f32]);
    );
}

#[cfg(test)]
mod tests {
    use tallow_backend::Scores;

    /// A reference softmax attention in f64.
    fn reference(q: &[f32], keys: &[f32], values: &[f32]) -> Vec<f64> {
        reference_with(q, keys, values, Scores::plain(q.len()))
    }

    /// [`reference`] with the scale and soft-cap of `params` (the caller picks the visible
    /// keys).
    fn reference_with(q: &[f32], keys: &[f32], values: &[f32], params: Scores) -> Vec<f64> {
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
        let total: f64 = weights.iter().sum();
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
        let chunks = [
            vec![(0, 75)],
            vec![(4, 5)],
            vec![(30, 9), (0, 3)],
            vec![(60, 15), (8, 20), (33, 1)],
        ];
        check_paged_attention(
            4,
            tallow_kv::KvDtype::F32,
            75,
            &chunks,
            Scores::plain(64),
            1.0,
        );
    }

    /// Sliding windows (shorter and longer than a segment), soft-capping and another scale,
    /// over f32 pages of 4 and f16 pages of 16: each token attends to its last `window`
    /// positions only, with the same bits alone or in any chunk.
    #[test]
    fn windowed_softcapped_attention_matches_the_reference_for_any_chunking() {
        let chunks = [
            vec![(0, 75)],
            vec![(4, 5)],
            vec![(30, 9), (0, 3)],
            vec![(60, 15), (8, 20), (33, 1)],
        ];
        for window in [1, 7, 37, 200] {
            let params = Scores {
                scale: 0.1,
                softcap: Some(1.5),
                window: Some(window),
            };
            check_paged_attention(4, tallow_kv::KvDtype::F32, 75, &chunks, params, 1.0);
        }
        let chunks = chunks_of_300_positions();
        let params = Scores {
            scale: 0.125,
            softcap: None,
            window: Some(150),
        };
        check_paged_attention(16, tallow_kv::KvDtype::F16, 300, &chunks, params, 1.0);
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
            check_paged_attention(16, dtype, 300, &chunks, params, query_scale);
        }
    }

    /// The same over Q8_0 and Q4_0 pages: the reference sees the values the blocks hold.
    #[test]
    fn paged_attention_over_quantized_pages_matches_the_reference_for_any_chunking() {
        let chunks = chunks_of_300_positions();
        for dtype in [tallow_kv::KvDtype::Q8_0, tallow_kv::KvDtype::Q4_0] {
            check_paged_attention(16, dtype, 300, &chunks, Scores::plain(64), 1.0);
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
            check_paged_attention(16, tallow_kv::KvDtype::Bf16, 300, &chunks, params, 1.0);
        }
    }

    #[test]
    fn a_weight_is_exp_down_to_the_cutoff_and_zero_below_it_or_for_nan() {
        assert_eq!(super::weight(0.0), 1.0);
        let near = super::WEIGHT_CUTOFF + 0.5;
        assert!((f64::from(super::weight(near)) / f64::from(near).exp() - 1.0).abs() < 1e-6);
        assert_eq!(super::weight(super::WEIGHT_CUTOFF - 0.5), 0.0);
        assert_eq!(super::weight(f32::NEG_INFINITY), 0.0);
        assert_eq!(super::weight(f32::NAN), 0.0);
    }

    fn check_paged_attention(
        page_size: usize,
        dtype: tallow_kv::KvDtype,
        total: usize,
        chunk_sets: &[Vec<(usize, usize)>],
        params: Scores,
        query_scale: f32,
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
                let want = reference_with(q, &pick(&keys), &pick(&values), params);
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

    /// The kernels picked for this CPU agree with the generic loops (the ones a CPU without
    /// AVX2 runs, and any head size or page size the SIMD kernel does not take).
    #[test]
    fn selected_kernels_agree_with_the_generic_loops() {
        let mut rng = Lcg(11);
        let kernel = super::kernels();
        for hd in [64, 128, 40, 48, 256] {
            for n in (1..=20).chain([31, 32, 33, 47, 48, 63, 64, 70]) {
                let q: Vec<f32> = (0..hd).map(|_| rng.next()).collect();
                let keys: Vec<f32> = (0..n * hd).map(|_| rng.next()).collect();
                let values: Vec<f32> = (0..n * hd).map(|_| rng.next()).collect();
                let mut start = vec![0f32; hd + 2];
                start[0] = 0.5;
                start[1] = 2.0;
                start[2..].iter_mut().for_each(|v| *v = rng.next());
                let (mut a, mut b) = (start.clone(), start.clone());
                kernel.page(&mut a, &q, &keys, &values, &mut vec![0.0; n]);
                super::generic::page(&mut b, &q, &keys, &values, &mut vec![0.0; n]);
                for (x, y) in a.iter().zip(&b) {
                    assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "hd {hd} n {n}");
                }
            }
        }
    }

    /// The selected f16 widening equals `half`'s for every f16 value.
    #[test]
    fn widening_matches_half_for_every_value() {
        use half::f16;
        let src: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut out = vec![0f32; src.len()];
        super::kernels().read(crate::pages::KvBlock::F16(&src), 1, &mut out);
        for (s, o) in src.iter().zip(&out) {
            let want = s.to_f32();
            assert!(
                want.to_bits() == o.to_bits() || (want.is_nan() && o.is_nan()),
                "{s}"
            );
        }
    }

    /// Several query rows in one call give each row the bits it gets alone.
    #[test]
    fn rows_together_equal_rows_alone() {
        let mut rng = Lcg(12);
        let kernel = super::kernels();
        for (hd, rows) in [
            (64, 3),
            (64, 4),
            (64, 7),
            (128, 2),
            (128, 3),
            (40, 2),
            (256, 5),
            (24, 6),
        ] {
            for n in [1, 5, 16, 17, 40, 64] {
                let q: Vec<f32> = (0..rows * hd).map(|_| rng.next()).collect();
                let keys: Vec<f32> = (0..n * hd).map(|_| rng.next()).collect();
                let values: Vec<f32> = (0..n * hd).map(|_| rng.next()).collect();
                let start: Vec<f32> = (0..rows * (hd + 2)).map(|_| rng.next()).collect();
                let mut together = start.clone();
                kernel.page(&mut together, &q, &keys, &values, &mut vec![0.0; n]);
                for r in 0..rows {
                    let mut alone = start[r * (hd + 2)..(r + 1) * (hd + 2)].to_vec();
                    let q = &q[r * hd..(r + 1) * hd];
                    kernel.page(&mut alone, q, &keys, &values, &mut vec![0.0; n]);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let got = &together[r * (hd + 2)..(r + 1) * (hd + 2)];
                    assert_eq!(bits(got), bits(&alone), "hd {hd} rows {rows} n {n} row {r}");
                }
            }
        }
    }

    /// Reading f16, bf16, Q8_0 and Q4_0 pages directly gives the bits of the kernel on the
    /// widened values.
    #[test]
    fn pages_read_in_place_equal_widened_rows() {
        use crate::pages::{KvBlock, KvStorage};
        use tallow_kv::{KvDtype, KvKind, KvLayout, PageId, Slot};
        let kernel = super::kernels();
        let Some(in_place) = kernel.in_place else {
            return;
        };
        let mut rng = Lcg(13);
        for dtype in [KvDtype::F16, KvDtype::Bf16, KvDtype::Q8_0, KvDtype::Q4_0] {
            for (hd, rows) in [(64, 3), (64, 4), (64, 7), (128, 2), (128, 3)] {
                let layout = KvLayout::new(1, 1, hd).with_page_size(16).with_dtype(dtype);
                assert!((in_place.reads)(&layout, 1), "{dtype:?} {hd}");
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
                    // SAFETY: only handed out for a CPU that has the features.
                    unsafe { (in_place.rows)(&mut got, &q, &key_pages, &value_pages, n, hd) };
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
        let kernel = super::kernels();
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
        super::finish(&running, &mut out);
        for (got, want) in out.iter().zip(&want) {
            assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want}");
        }
    }
}
