//! The kernels of attention over KV pages: a tile of positions taken into the online-softmax
//! states of query rows, two states merged, f16 rows widened to f32. How a step splits
//! attention into tiles, segments and units of work is the CPU backend's; these are its
//! inner loops, one set per instruction set in the kernel table (see [`super::table`]).
//!
//! A state is `head_dim + 2` floats: the running maximum of the scores, the sum of the
//! weights `exp(score - max)`, and the weighted sum of the values. Every kernel gives a query
//! row the same bits whatever rows come with it.

pub(crate) mod loops;
#[cfg(test)]
mod tests;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::GgmlType;

/// Most positions in a tile a kernel takes at once.
pub const TILE_POSITIONS: usize = 64;

/// Positions per page of the kernels that read pages in place.
pub const IN_PLACE_PAGE: usize = 16;

/// Below this, a softmax weight `exp(x)` (`x`: a score less the running maximum) is taken as
/// 0. It is then under 2^-92 of the largest weight, far below what an f32 sum of weights
/// resolves; kept, its products with values are subnormal numbers (a state's weighted sum
/// starts at 0), which x86 cores compute many times slower: a long prompt's attention ran at
/// half speed on them.
pub const WEIGHT_CUTOFF: f32 = -64.0;

/// The softmax weight `exp(x)` of a score `x` below the running maximum (see
/// [`WEIGHT_CUTOFF`]; 0 where `x` is NaN: an empty state against an empty tile).
#[inline(always)]
pub(crate) fn weight(x: f32) -> f32 {
    if x >= WEIGHT_CUTOFF {
        crate::exp(x)
    } else {
        0.0
    }
}

/// The scale of plain attention's scores for heads of `head_dim` values.
#[inline(always)]
pub(crate) fn plain_scale(head_dim: usize) -> f32 {
    1.0 / (head_dim as f32).sqrt()
}

/// One (page, layer, K or V, KV head) block of a KV pool: `page_size` rows of `head_dim`
/// values, slot `s` at `[s * head_dim..(s + 1) * head_dim]` (of a quantized pool, bytes
/// `[s * row_bytes..(s + 1) * row_bytes]`, a row being whole blocks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBlock<'a> {
    /// The pool stores f16.
    F16(&'a [f16]),
    /// The pool stores f32.
    F32(&'a [f32]),
    /// The pool stores bfloat16.
    Bf16(&'a [bf16]),
    /// The pool stores rows of GGML blocks of this format.
    Quantized(GgmlType, &'a [u8]),
}

impl KvBlock<'_> {
    /// Converts the first `out.len() / head_dim` rows to f32 into `out` with the portable
    /// conversions (the attention kernels have faster ones).
    pub fn read_f32(&self, head_dim: usize, out: &mut [f32]) {
        let rows = out.len() / head_dim;
        match *self {
            KvBlock::F16(b) => b[..out.len()].convert_to_f32_slice(out),
            KvBlock::F32(b) => out.copy_from_slice(&b[..out.len()]),
            KvBlock::Bf16(b) => b[..out.len()].convert_to_f32_slice(out),
            KvBlock::Quantized(format, b) => {
                let row = head_dim / format.block_len() * format.block_bytes();
                crate::dequantize(format, &b[..rows * row], out)
                    .expect("whole rows of whole blocks");
            }
        }
    }
}

/// `(states, q, keys, values, scores)`: see [`AttentionKernels::page`].
pub(crate) type RawPage = unsafe fn(&mut [f32], &[f32], &[f32], &[f32], &mut [f32]);

/// `(states, q, keys, values, scores, scale, softcap)`: see [`AttentionKernels::general`].
pub(crate) type RawGeneral =
    unsafe fn(&mut [f32], &[f32], &[f32], &[f32], &mut [f32], f32, Option<f32>);

/// `(states, q, key pages, value pages, positions, head_dim)`: see [`RowsInPlace::call`].
pub(crate) type RawRowsInPlace =
    unsafe fn(&mut [f32], &[f32], &[KvBlock<'_>], &[KvBlock<'_>], usize, usize);

/// f16 keys or values to f32.
pub(crate) type RawWiden = unsafe fn(&[f16], &mut [f32]);

/// Merges a state into another.
pub(crate) type RawMerge = unsafe fn(&mut [f32], &[f32]);

/// A kernel that reads pages as the pool holds them, and which pages it reads: their element
/// type, head size and page size, for a number of query rows at a time.
#[derive(Clone, Copy)]
pub(crate) struct RawInPlace {
    pub(crate) rows: RawRowsInPlace,
    pub(crate) reads: fn(GgmlType, usize, usize, usize) -> bool,
}

/// The attention kernels one instruction set has of its own.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawAttention {
    pub(crate) widen: Option<RawWiden>,
    pub(crate) page: Option<RawPage>,
    pub(crate) in_place: Option<RawInPlace>,
    pub(crate) merge: Option<RawMerge>,
    pub(crate) general: Option<RawGeneral>,
}

impl RawAttention {
    /// This set's kernels, each missing one taken from `below` (the next set down's, whole;
    /// `None` for the scalar set, which has every kernel but the in-place reader).
    pub(crate) fn resolve(self, below: Option<AttentionKernels>) -> AttentionKernels {
        let missing = "the scalar set has every attention kernel";
        AttentionKernels {
            widen: self.widen.or(below.map(|b| b.widen)).expect(missing),
            page: self.page.or(below.map(|b| b.page)).expect(missing),
            in_place: self.in_place.or(below.and_then(|b| b.in_place)),
            merge: self.merge.or(below.map(|b| b.merge)).expect(missing),
            general: self.general.or(below.map(|b| b.general)).expect(missing),
        }
    }
}

/// The attention kernels of an instruction set the running CPU has, fallbacks included (see
/// [`crate::attention_kernels`]).
#[derive(Clone, Copy)]
pub struct AttentionKernels {
    widen: RawWiden,
    page: RawPage,
    in_place: Option<RawInPlace>,
    merge: RawMerge,
    general: RawGeneral,
}

impl AttentionKernels {
    /// Takes `n = scores.len()` positions (`keys` and `values`, `n` rows of the head
    /// dimension) into the states of the query rows `q` (one state per row, side by side in
    /// `states`) with the plain scale `1 / sqrt(head_dim)`. Each row's result is the same
    /// whatever rows come with it. `scores` is scratch.
    pub fn page(
        &self,
        states: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
    ) {
        check_operands(states, q, keys, values, scores);
        // SAFETY: only built by the kernel table of a set the CPU has.
        unsafe { (self.page)(states, q, keys, values, scores) }
    }

    /// [`AttentionKernels::page`] with scores `dot * scale`, soft-capped to
    /// `cap * tanh(score / cap)` where `softcap` is given.
    #[allow(clippy::too_many_arguments)]
    pub fn general(
        &self,
        states: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
        scale: f32,
        softcap: Option<f32>,
    ) {
        check_operands(states, q, keys, values, scores);
        // SAFETY: as above.
        unsafe { (self.general)(states, q, keys, values, scores, scale, softcap) }
    }

    /// The first `out.len()` values (rows of `head_dim`) of a KV block, as f32.
    pub fn read(&self, block: KvBlock<'_>, head_dim: usize, out: &mut [f32]) {
        match block {
            // SAFETY: as above; the slices are of one length.
            KvBlock::F16(b) => unsafe { (self.widen)(&b[..out.len()], out) },
            KvBlock::F32(b) => out.copy_from_slice(&b[..out.len()]),
            // A shift each (the compiler vectorizes the portable loop).
            KvBlock::Bf16(_) | KvBlock::Quantized(..) => block.read_f32(head_dim, out),
        }
    }

    /// Merges state `other` into `state` (both of the same head size).
    pub fn merge(&self, state: &mut [f32], other: &[f32]) {
        assert!(state.len() == other.len() && state.len() >= 2);
        // SAFETY: as above.
        unsafe { (self.merge)(state, other) }
    }

    /// The kernel that reads pages of `page_size` positions of `head_dim` values stored as
    /// `element` (F16, F32, BF16 or a block format) in place for `rows` query rows at a time,
    /// where the CPU has one that reads them. Its bits are those of
    /// [`AttentionKernels::page`] on the widened rows: the choice changes no result.
    pub fn rows_in_place(
        &self,
        element: GgmlType,
        head_dim: usize,
        page_size: usize,
        rows: usize,
    ) -> Option<RowsInPlace> {
        self.in_place
            .filter(|k| (k.reads)(element, head_dim, page_size, rows))
            .map(|k| RowsInPlace(k.rows))
    }
}

/// A kernel that reads KV pages in place (see [`AttentionKernels::rows_in_place`]).
#[derive(Clone, Copy)]
pub struct RowsInPlace(RawRowsInPlace);

impl RowsInPlace {
    /// [`AttentionKernels::page`] over the first `n` positions (at most [`TILE_POSITIONS`])
    /// of `keys` and `values`, pages of [`IN_PLACE_PAGE`] positions of the element type,
    /// head size and page size the kernel was picked for, all of one type.
    pub fn call(
        &self,
        states: &mut [f32],
        q: &[f32],
        keys: &[KvBlock<'_>],
        values: &[KvBlock<'_>],
        n: usize,
        head_dim: usize,
    ) {
        // SAFETY: only handed out for a set the CPU has; the kernel checks its operands.
        unsafe { (self.0)(states, q, keys, values, n, head_dim) }
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
