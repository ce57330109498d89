//! Activations quantized once per layer input and read by every matrix that takes that input.

use tallow_threads::DisjointSlice;

use crate::blocks::{as_blocks, BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::fp16::f16_to_f32;
use crate::kernels::{Quantizer, SubBlockPairs, TileActs, TileScales, PACKED_TILE, TILE_LANES};
use crate::{sizes, GgmlType, Isa, QuantError};

/// Below this many elements, activations are quantized on the calling thread: about the
/// work (a microsecond or two) that handing half of it to another thread saves.
const SERIAL_QUANTIZE: usize = 1 << 12;
/// Elements per task when quantizing many on the thread pool (tasks claimed as threads free
/// up even out what they get).
const ELEMENTS_PER_TASK: usize = 1 << 13;

/// The activations of several tokens quantized to a weight format's
/// [`GgmlType::vec_dot_type`], reused by every weight matrix that reads the same input
/// (q/k/v, gate/up). Borrows buffers its caller owns (an arena, or an [`ActsBuffer`]), so
/// quantizing allocates nothing.
///
/// Besides the quantized rows it holds, in Q8_0, Q8_1 or Q8_K, the block scales and sums as f32
/// laid out for the tile and packed kernels (see [`TileScales`]): `d` of each block, and `s`,
/// which is the Q8_1 block's own `s` (`d * sum(q)`) or, for Q8_0 and Q8_K, the integer `sum(q)`;
/// for Q8_K also its sub-blocks' sums ([`SubBlockPairs`]).
#[derive(Debug, Clone, Copy)]
pub struct QuantizedActs<'a> {
    ty: GgmlType,
    n_tokens: usize,
    cols: usize,
    row_bytes: usize,
    data: &'a [u8],
    /// Per group of [`TILE_LANES`] tokens, `blocks * TILE_LANES` block scales (`d`), then as
    /// many block sums (`s`). Empty when there are no tile scales.
    d: &'a [f32],
    s: &'a [f32],
    /// Laid out as `d`, for Q8_K; else empty.
    pairs: &'a [SubBlockPairs],
}

/// Buffer lengths that [`QuantizedActs::quantize`] needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActsLen {
    /// Bytes of quantized rows.
    pub bytes: usize,
    /// f32 tile scales.
    pub scales: usize,
}

impl<'a> QuantizedActs<'a> {
    /// The buffer lengths for `n_tokens` rows of `cols` values in `vec_dot_type`.
    pub fn buffer_len(
        vec_dot_type: GgmlType,
        n_tokens: usize,
        cols: usize,
    ) -> Result<ActsLen, QuantError> {
        let row_bytes = sizes::row_bytes(vec_dot_type, cols, "activation row")?;
        let bytes = sizes::product(n_tokens, row_bytes, "quantized activations")?;
        let scales = if has_tile_scales(vec_dot_type, n_tokens) {
            let per_group = sizes::product(cols / vec_dot_type.block_len(), TILE_LANES, "scales")?;
            let per_lane = 2 + pair_words(vec_dot_type);
            sizes::product(
                n_tokens.div_ceil(TILE_LANES) * per_lane,
                per_group,
                "scales",
            )?
        } else {
            0
        };
        Ok(ActsLen { bytes, scales })
    }

    /// Quantizes `n_tokens` rows of `cols` values (`x`, token-major) to `vec_dot_type` into
    /// the front of `bytes` and `scales`, which must be at least [`QuantizedActs::buffer_len`]
    /// long; every value of those fronts is written, whatever they held before. Inputs of
    /// 4096 values or more are quantized on the global thread pool.
    pub fn quantize(
        vec_dot_type: GgmlType,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
        bytes: &'a mut [u8],
        scales: &'a mut [f32],
    ) -> Result<Self, QuantError> {
        // Activations take the formats weights are multiplied with (F32, Q8_0, Q8_1, Q8_K).
        let unsupported = QuantError::Unsupported {
            op: "activation quantization",
            ty: vec_dot_type,
        };
        if vec_dot_type.vec_dot_type() != vec_dot_type {
            return Err(unsupported);
        }
        let quantizer = Isa::detected()
            .kernels(vec_dot_type)
            .quantize
            .ok_or(unsupported)?;
        let len = Self::buffer_len(vec_dot_type, n_tokens, cols)?;
        let elements = sizes::product(n_tokens, cols, "activations")?;
        sizes::expect_len("activation elements", elements, x.len())?;
        let too_small = |what, needed, actual| QuantError::BufferTooSmall {
            what,
            needed,
            actual,
        };
        let (bytes_len, scales_len) = (bytes.len(), scales.len());
        let data = (bytes.get_mut(..len.bytes)).ok_or(too_small(
            "activation bytes",
            len.bytes,
            bytes_len,
        ))?;
        let scales = (scales.get_mut(..len.scales)).ok_or(too_small(
            "activation scales",
            len.scales,
            scales_len,
        ))?;
        let row_bytes = sizes::row_bytes(vec_dot_type, cols, "activation row")?;
        if len.bytes > 0 {
            quantize_blocks(quantizer, vec_dot_type, x, data);
        }
        let data: &'a [u8] = data;
        let lanes = len.scales / (2 + pair_words(vec_dot_type));
        let (d, rest) = scales.split_at_mut(lanes);
        let (s, pairs) = rest.split_at_mut(lanes);
        let pairs = as_pairs(pairs);
        if len.scales > 0 {
            fill_tile_scales(vec_dot_type, data, row_bytes, n_tokens, cols, d, s, pairs);
        }
        Ok(QuantizedActs {
            ty: vec_dot_type,
            n_tokens,
            cols,
            row_bytes,
            data,
            d,
            s,
            pairs,
        })
    }

    /// No tokens of `cols` values in `ty`: a product with these computes nothing.
    pub fn empty(ty: GgmlType, cols: usize) -> Self {
        let row_bytes = cols / ty.block_len() * ty.block_bytes();
        QuantizedActs {
            ty,
            n_tokens: 0,
            cols,
            row_bytes,
            data: &[],
            d: &[],
            s: &[],
            pairs: &[],
        }
    }

    /// The format the activations are in.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Number of tokens (rows).
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Values per token.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The quantized row of token `t`, or `None` past the last token.
    pub fn token(&self, t: usize) -> Option<&'a [u8]> {
        (t < self.n_tokens).then(|| self.row(t))
    }

    pub(crate) fn row(&self, t: usize) -> &'a [u8] {
        &self.data[t * self.row_bytes..(t + 1) * self.row_bytes]
    }

    /// Whether tile kernels can read these activations.
    pub(crate) fn has_tile_scales(&self) -> bool {
        !self.d.is_empty()
    }

    /// Token group `g` of [`TILE_LANES`] tokens (the last one possibly shorter), as one tile:
    /// its first token, its rows and its scales.
    pub(crate) fn tile(&self, g: usize) -> (usize, TileActs<'a>, TileScales<'a>) {
        self.tile_of(g, TILE_LANES)
    }

    /// Tile `i` of a packed product: [`PACKED_TILE`] tokens (the last one possibly fewer).
    pub(crate) fn packed_tile(&self, i: usize) -> (usize, TileActs<'a>, TileScales<'a>) {
        self.tile_of(i * PACKED_TILE / TILE_LANES, PACKED_TILE)
    }

    /// Tiles of a packed product.
    pub(crate) fn packed_tiles(&self) -> usize {
        self.n_tokens.div_ceil(PACKED_TILE)
    }

    /// Up to `len` tokens from group `g` on, with their groups' scales.
    fn tile_of(&self, g: usize, len: usize) -> (usize, TileActs<'a>, TileScales<'a>) {
        let first = g * TILE_LANES;
        let n = len.min(self.n_tokens - first);
        let rows = &self.data[first * self.row_bytes..(first + n) * self.row_bytes];
        let group_len = self.d.len() / self.n_tokens.div_ceil(TILE_LANES);
        let groups = g * group_len..(g + n.div_ceil(TILE_LANES)) * group_len;
        let scales = TileScales {
            d: &self.d[groups.clone()],
            s: &self.s[groups.clone()],
            pairs: self.pairs.get(groups).unwrap_or_default(),
        };
        (first, TileActs::new(rows, self.row_bytes, n), scales)
    }
}

fn has_tile_scales(ty: GgmlType, n_tokens: usize) -> bool {
    n_tokens >= 1 && matches!(ty, GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K)
}

/// The f32 words of tile scales that a block's [`SubBlockPairs`] take per token: 4 for Q8_K,
/// none for the formats without sub-blocks.
fn pair_words(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_K => size_of::<SubBlockPairs>() / size_of::<f32>(),
        _ => 0,
    }
}

/// The blocks of `x` (rows one after the other) quantized by `quantizer` into `data`: blocks
/// are independent, so tasks take runs of them across rows, each thread an equal share of a
/// few tokens' (quantized on one thread, with the buffers zeroed first, a short prompt's ten
/// tokens were a tenth of smollm2-135m's forward).
fn quantize_blocks(quantizer: Quantizer, ty: GgmlType, x: &[f32], data: &mut [u8]) {
    let pool = tallow_threads::global();
    let (block_len, block_bytes) = (ty.block_len(), ty.block_bytes());
    let blocks = x.len() / block_len;
    let tasks = match x.len() < SERIAL_QUANTIZE {
        true => 1,
        false => (x.len() / ELEMENTS_PER_TASK)
            .max(pool.threads())
            .min(blocks),
    };
    if tasks == 1 {
        return quantizer.call(x, data);
    }
    let per_task = blocks.div_ceil(tasks);
    let out = DisjointSlice::new(data);
    pool.run(blocks.div_ceil(per_task), &|task, _| {
        let run = task * per_task..blocks.min((task + 1) * per_task);
        // SAFETY: each task writes the blocks of its own run.
        let dst = unsafe { out.range_mut(run.start * block_bytes..run.end * block_bytes) };
        quantizer.call(&x[run.start * block_len..run.end * block_len], dst);
    });
}

/// The words of `words` (as many as [`pair_words`] gives the tile scales), as sub-block pairs.
fn as_pairs(words: &mut [f32]) -> &mut [SubBlockPairs] {
    let n = size_of_val(words) / size_of::<SubBlockPairs>();
    // SAFETY: `SubBlockPairs` is four i32, of f32's size and alignment, and every bit pattern
    // is a valid i32; the `n` entries lie inside `words`, whose exclusive borrow moves here.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<SubBlockPairs>(), n) }
}

/// Writes the f32 block scales and sums of every token (and for Q8_K the sub-block pairs),
/// lane-interleaved per group of [`TILE_LANES`] tokens; lanes past the last token stay 0.
#[allow(clippy::too_many_arguments)]
fn fill_tile_scales(
    ty: GgmlType,
    data: &[u8],
    row_bytes: usize,
    n_tokens: usize,
    cols: usize,
    d: &mut [f32],
    s: &mut [f32],
    pairs: &mut [SubBlockPairs],
) {
    let group_len = cols / ty.block_len() * TILE_LANES;
    d.fill(0.0);
    s.fill(0.0);
    pairs.fill([0; 4]);
    for t in 0..n_tokens {
        let row = &data[t * row_bytes..(t + 1) * row_bytes];
        let first = t / TILE_LANES * group_len + t % TILE_LANES;
        let lanes = (first..).step_by(TILE_LANES);
        match ty {
            GgmlType::Q8_1 => {
                for (i, block) in lanes.zip(as_blocks::<BlockQ8_1>(row)) {
                    d[i] = f16_to_f32(block.d);
                    s[i] = f16_to_f32(block.s);
                }
            }
            GgmlType::Q8_K => {
                for (i, block) in lanes.zip(as_blocks::<BlockQ8K>(row)) {
                    d[i] = block.d();
                    // At most 256 * 127 in magnitude: exact in f32.
                    s[i] = (0..16).map(|g| block.bsum(g)).sum::<i32>() as f32;
                    let sub_block = |k: usize| block.bsum(2 * k) + block.bsum(2 * k + 1);
                    pairs[i] = std::array::from_fn(|j| {
                        (sub_block(2 * j) & 0xffff) | (sub_block(2 * j + 1) << 16)
                    });
                }
            }
            _ => {
                for (i, block) in lanes.zip(as_blocks::<BlockQ8_0>(row)) {
                    d[i] = f16_to_f32(block.d);
                    // At most 32 * 127 in magnitude: exact in f32.
                    s[i] = quant_sum(&block.qs) as f32;
                }
            }
        }
    }
}

/// The sum of a block's 32 quants, in sixteen lanes of two (at most 2 * 128 in magnitude)
/// added across at the end: one chain of 32 dependent adds was half the time of quantizing a
/// token's Q8_0 activations, these short ones a quarter less in all.
pub(crate) fn quant_sum(qs: &[i8; 32]) -> i32 {
    let mut lanes = [0i16; 16];
    for half in qs.as_chunks::<16>().0 {
        for (lane, &q) in lanes.iter_mut().zip(half) {
            *lane += i16::from(q);
        }
    }
    lanes.iter().map(|&l| i32::from(l)).sum()
}

/// Owned, growable buffers for [`QuantizedActs`]: the simple way to quantize activations when
/// no arena is at hand. Grows to the largest input seen and keeps that capacity.
#[derive(Debug, Default)]
pub struct ActsBuffer {
    bytes: Vec<u8>,
    scales: Vec<f32>,
}

impl ActsBuffer {
    /// Empty buffers; they allocate on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// [`QuantizedActs::quantize`] into these buffers, grown as needed.
    pub fn quantize(
        &mut self,
        vec_dot_type: GgmlType,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
    ) -> Result<QuantizedActs<'_>, QuantError> {
        let len = QuantizedActs::buffer_len(vec_dot_type, n_tokens, cols)?;
        if self.bytes.len() < len.bytes {
            self.bytes.resize(len.bytes, 0);
        }
        if self.scales.len() < len.scales {
            self.scales.resize(len.scales, 0.0);
        }
        QuantizedActs::quantize(
            vec_dot_type,
            x,
            n_tokens,
            cols,
            &mut self.bytes,
            &mut self.scales,
        )
    }
}
