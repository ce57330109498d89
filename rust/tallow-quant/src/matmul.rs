//! Matrix products of weights in a block format with quantized activations, on all cores.

use std::ops::Range;

use rayon::prelude::*;

use crate::blocks::{as_blocks, BlockQ8_0, BlockQ8_1};
use crate::fp16::f16_to_f32;
use crate::kernels::{Rows, Tile, TileScales, VecDot, TILE_LANES};
use crate::{reference, sizes, GgmlType, Isa, QuantError};

/// Below this many multiply-adds a product runs on the calling thread: waking the pool would
/// cost more than it saves.
const SERIAL_WORK: usize = 1 << 18;
/// Row chunks per thread, so that threads that finish early can steal work.
const CHUNKS_PER_THREAD: usize = 4;
const MIN_CHUNK_ROWS: usize = 8;
/// Tokens that reuse one weight row while it is in L1; their activations (a few KiB each)
/// stay in L2 across the rows of a chunk.
const TOKEN_BLOCK: usize = 16;
/// Rows per call of a row kernel (one token), written out through a buffer on the stack.
const ROW_BLOCK: usize = 64;
/// Below this many elements, activations are quantized on the calling thread.
const SERIAL_QUANTIZE: usize = 1 << 16;

/// The activations of several tokens, quantized once and reused by every weight matrix that
/// reads the same input (q/k/v, gate/up). The buffer is kept between calls.
#[derive(Debug, Clone)]
pub struct QuantizedActs {
    ty: GgmlType,
    n_tokens: usize,
    cols: usize,
    row_bytes: usize,
    pub(crate) data: Vec<u8>,
}

impl Default for QuantizedActs {
    fn default() -> Self {
        Self::new()
    }
}

impl QuantizedActs {
    /// An empty set (no tokens) that allocates on first use.
    pub fn new() -> Self {
        Self {
            ty: GgmlType::F32,
            n_tokens: 0,
            cols: 0,
            row_bytes: 0,
            data: Vec::new(),
        }
    }

    /// Quantizes `n_tokens` rows of `cols` values (`x`, token-major) to `vec_dot_type`,
    /// replacing the previous contents and reusing the buffer. On error the previous contents
    /// are kept.
    pub fn quantize(
        &mut self,
        vec_dot_type: GgmlType,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
    ) -> Result<(), QuantError> {
        let quantize =
            reference::quantize::quantizer(vec_dot_type).ok_or(QuantError::Unsupported {
                op: "activation quantization",
                ty: vec_dot_type,
            })?;
        let row_bytes = sizes::row_bytes(vec_dot_type, cols, "activation row")?;
        let elements = sizes::product(n_tokens, cols, "activations")?;
        sizes::expect_len("activation elements", elements, x.len())?;
        let total = sizes::product(n_tokens, row_bytes, "quantized activations")?;

        self.data.resize(total, 0);
        self.ty = vec_dot_type;
        self.n_tokens = n_tokens;
        self.cols = cols;
        self.row_bytes = row_bytes;
        if total == 0 {
            return Ok(());
        }
        let quantize = |(dst, x): (&mut [u8], &[f32])| quantize(x, dst);
        let rows = self.data.chunks_exact_mut(row_bytes);
        if elements < SERIAL_QUANTIZE || n_tokens == 1 {
            rows.zip(x.chunks_exact(cols)).for_each(quantize);
        } else {
            self.data
                .par_chunks_exact_mut(row_bytes)
                .zip(x.par_chunks_exact(cols))
                .for_each(quantize);
        }
        Ok(())
    }

    /// The format the activations are in.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The quantized row of token `t`, or `None` past the last token.
    pub fn token(&self, t: usize) -> Option<&[u8]> {
        if t < self.n_tokens {
            Some(&self.data[t * self.row_bytes..(t + 1) * self.row_bytes])
        } else {
            None
        }
    }

    fn row(&self, t: usize) -> &[u8] {
        &self.data[t * self.row_bytes..(t + 1) * self.row_bytes]
    }
}

/// `out[t * rows + r] = dot(weight row r, activations of token t)`, where `weight` is `rows`
/// contiguous rows of `cols` elements of type `ty`, and `acts` holds `cols` columns in
/// `ty.vec_dot_type()`. Runs on the current rayon pool, split by output rows; every length
/// is checked first. Uses the best kernels of the running CPU ([`Isa::detected`]).
pub fn matmul(
    ty: GgmlType,
    weight: &[u8],
    rows: usize,
    cols: usize,
    acts: &QuantizedActs,
    out: &mut [f32],
) -> Result<(), QuantError> {
    matmul_with(Isa::detected(), ty, weight, rows, cols, acts, out)
}

/// [`matmul`] with the dot-product kernels of instruction set `isa` (falling back to lesser
/// sets, then to the scalar reference, where `isa` has no kernel for `ty`), on the same
/// threads and in the same order. `Isa::Scalar` gives the scalar reference product, which
/// the benches set beside the SIMD one. Fails with [`QuantError::Unsupported`] when the
/// running CPU lacks `isa`.
pub fn matmul_with(
    isa: Isa,
    ty: GgmlType,
    weight: &[u8],
    rows: usize,
    cols: usize,
    acts: &QuantizedActs,
    out: &mut [f32],
) -> Result<(), QuantError> {
    if acts.ty != ty.vec_dot_type() {
        return Err(QuantError::ActivationType {
            weights: ty,
            expected: ty.vec_dot_type(),
            actual: acts.ty,
        });
    }
    if !isa.is_available() {
        return Err(QuantError::Unsupported {
            op: "matmul on an instruction set this CPU lacks",
            ty,
        });
    }
    let kernel = isa
        .vec_dot(ty)
        .ok_or(QuantError::Unsupported { op: "vec_dot", ty })?;
    sizes::expect_len("activation columns", cols, acts.cols)?;
    let row_bytes = sizes::row_bytes(ty, cols, "weight row")?;
    let weight_bytes = sizes::product(rows, row_bytes, "weight")?;
    sizes::expect_len("weight bytes", weight_bytes, weight.len())?;
    let out_len = sizes::product(acts.n_tokens, rows, "output")?;
    sizes::expect_len("output elements", out_len, out.len())?;

    if out_len == 0 {
        return Ok(());
    }
    if cols == 0 {
        out.fill(0.0);
        return Ok(());
    }
    // Several tokens: a tile kernel, where this set has one for `ty`, reuses each unpacked
    // weight block across up to eight tokens, with the same bits as `kernel`.
    let tile = match isa.tile(ty) {
        Some(tile) if acts.n_tokens >= 2 => Some(TilePlan::new(tile, acts, cols / ty.block_len())),
        _ => None,
    };
    // One token: a row kernel, where this set has one for `ty`, takes each activation block
    // through several weight rows at once, with the same bits as `kernel`.
    let row_kernel = isa.rows(ty).filter(|_| acts.n_tokens == 1);
    let product = Product {
        kernel,
        tile,
        row_kernel,
        weight,
        row_bytes,
        rows,
        acts,
    };

    let threads = rayon::current_num_threads();
    let work = out_len.saturating_mul(cols);
    if threads == 1 || work < SERIAL_WORK {
        product.rows_into(0..rows, |i, v| out[i] = v);
        return Ok(());
    }
    let chunk_rows = rows
        .div_ceil(threads * CHUNKS_PER_THREAD)
        .max(MIN_CHUNK_ROWS);
    let shared = SharedOut(out.as_mut_ptr());
    (0..rows.div_ceil(chunk_rows))
        .into_par_iter()
        .for_each(|chunk| {
            let range = chunk * chunk_rows..rows.min((chunk + 1) * chunk_rows);
            // SAFETY: `rows_into` only writes indices t * rows + r with t < n_tokens and r in
            // `range` (below `out.len()`, checked above); the chunks' row ranges are disjoint,
            // so no index is written twice, and `out` is borrowed mutably for the whole call.
            product.rows_into(range, |i, v| unsafe { shared.write(i, v) });
        });
    Ok(())
}

/// A tile kernel with the f32 activation scales it reads, per group of [`TILE_LANES`] tokens
/// (see [`TileScales`]).
struct TilePlan {
    tile: Tile,
    blocks: usize,
    d: Vec<f32>,
    s: Vec<f32>,
}

impl TilePlan {
    /// `acts` in Q8_0 or Q8_1, `blocks` blocks per token.
    fn new(tile: Tile, acts: &QuantizedActs, blocks: usize) -> Self {
        let group_len = blocks * TILE_LANES;
        let len = acts.n_tokens.div_ceil(TILE_LANES) * group_len;
        let mut d = vec![0.0; len];
        let mut s = Vec::new();
        if acts.ty == GgmlType::Q8_1 {
            s.resize(len, 0.0);
        }
        for t in 0..acts.n_tokens {
            let first = t / TILE_LANES * group_len + t % TILE_LANES;
            let lanes = (first..).step_by(TILE_LANES);
            if acts.ty == GgmlType::Q8_1 {
                for (i, block) in lanes.zip(as_blocks::<BlockQ8_1>(acts.row(t))) {
                    d[i] = f16_to_f32(block.d);
                    s[i] = f16_to_f32(block.s);
                }
            } else {
                for (i, block) in lanes.zip(as_blocks::<BlockQ8_0>(acts.row(t))) {
                    d[i] = f16_to_f32(block.d);
                }
            }
        }
        Self { tile, blocks, d, s }
    }

    /// The scales of token group `g`, for the tile that starts at lane `lane0`.
    fn scales(&self, g: usize, lane0: usize) -> TileScales<'_> {
        let group = g * self.blocks * TILE_LANES..(g + 1) * self.blocks * TILE_LANES;
        TileScales {
            d: &self.d[group.clone()],
            s: if self.s.is_empty() {
                &[]
            } else {
                &self.s[group]
            },
            lane0,
        }
    }
}

/// The validated operands of one [`matmul`].
struct Product<'a> {
    kernel: VecDot,
    tile: Option<TilePlan>,
    row_kernel: Option<Rows>,
    weight: &'a [u8],
    row_bytes: usize,
    rows: usize,
    acts: &'a QuantizedActs,
}

impl Product<'_> {
    /// Computes the outputs of weight rows `range` for every token, handing each to `write`
    /// with its index in `out`.
    fn rows_into(&self, range: Range<usize>, mut write: impl FnMut(usize, f32)) {
        let n_tokens = self.acts.n_tokens;
        if let Some(plan) = &self.tile {
            return self.tiles_into(plan, range, write);
        }
        if let Some(rows) = self.row_kernel {
            // One token: outputs are indexed by row.
            let mut out = [0f32; ROW_BLOCK];
            for first in range.clone().step_by(ROW_BLOCK) {
                let n = ROW_BLOCK.min(range.end - first);
                let w = &self.weight[first * self.row_bytes..(first + n) * self.row_bytes];
                rows.call(w, self.acts.row(0), &mut out[..n]);
                for (i, &v) in out[..n].iter().enumerate() {
                    write(first + i, v);
                }
            }
            return;
        }
        for first in (0..n_tokens).step_by(TOKEN_BLOCK) {
            let tokens = first..n_tokens.min(first + TOKEN_BLOCK);
            for r in range.clone() {
                let w = &self.weight[r * self.row_bytes..(r + 1) * self.row_bytes];
                for t in tokens.clone() {
                    write(t * self.rows + r, self.kernel.call(w, self.acts.row(t)));
                }
            }
        }
    }
}

impl Product<'_> {
    /// [`Product::rows_into`] with tile kernels: per group of [`TILE_LANES`] tokens, each
    /// weight row against the group as tiles of 8, or of 4, 2 and 1 tokens for a last, short
    /// group.
    fn tiles_into(&self, plan: &TilePlan, range: Range<usize>, mut write: impl FnMut(usize, f32)) {
        let n_tokens = self.acts.n_tokens;
        let mut out = [0f32; TILE_LANES];
        for g in 0..n_tokens.div_ceil(TILE_LANES) {
            let first = g * TILE_LANES;
            let n = TILE_LANES.min(n_tokens - first);
            let a: [&[u8]; TILE_LANES] =
                std::array::from_fn(|i| self.acts.row((first + i).min(n_tokens - 1)));
            // (first lane, tokens) of each tile: n in binary when the group is short.
            let tiles = [TILE_LANES, 4, 2, 1].into_iter().filter(move |&size| {
                if n == TILE_LANES {
                    size == TILE_LANES
                } else {
                    size < TILE_LANES && n & size != 0
                }
            });
            for r in range.clone() {
                let w = &self.weight[r * self.row_bytes..(r + 1) * self.row_bytes];
                let mut lane0 = 0;
                for size in tiles.clone() {
                    let lanes = lane0..lane0 + size;
                    let out = &mut out[..size];
                    plan.tile
                        .call(w, &a[lanes.clone()], &plan.scales(g, lane0), out);
                    for (lane, &v) in lanes.zip(out.iter()) {
                        write((first + lane) * self.rows + r, v);
                    }
                    lane0 += size;
                }
            }
        }
    }
}

/// The output buffer of a parallel [`matmul`], written through by its row chunks.
struct SharedOut(*mut f32);

impl SharedOut {
    /// # Safety
    /// `i` is in bounds of the buffer and no other thread accesses index `i` meanwhile.
    unsafe fn write(&self, i: usize, v: f32) {
        self.0.add(i).write(v);
    }
}

// SAFETY: the tasks write disjoint indices (see `matmul`).
unsafe impl Sync for SharedOut {}
