//! Matrix products of weights in a block format with quantized activations, on all cores.

use std::ops::Range;

use tallow_threads::DisjointSlice;

use crate::kernels::{Decoding, Rows, Tile, VecDot, WeightsAt, PACKED_TILE, PACK_ROWS, TILE_LANES};
use crate::{sizes, GgmlType, Isa, QuantError, QuantizedActs};

/// Below this many multiply-adds a product runs on the calling thread: waking the pool would
/// cost more than it saves.
const SERIAL_WORK: usize = 1 << 18;
/// Row chunks per thread, so that threads that finish early can take more.
const CHUNKS_PER_THREAD: usize = 4;
const MIN_CHUNK_ROWS: usize = 8;
/// Tokens that reuse one weight row while it is in L1; their activations (a few KiB each)
/// stay in L2 across the rows of a chunk.
const TOKEN_BLOCK: usize = 16;
/// Rows per call of a row kernel (one token), written out through a buffer on the stack.
const ROW_BLOCK: usize = 64;

/// `out[t * rows + r] = dot(weight row r, activations of token t)`, where `weight` is `rows`
/// contiguous rows of `cols` elements of type `ty`, and `acts` holds `cols` columns in
/// `ty.vec_dot_type()`. Runs on the current rayon pool, split by output rows; every length
/// is checked first. Uses the best kernels of the running CPU ([`Isa::detected`]).
pub fn matmul(
    ty: GgmlType,
    weight: &[u8],
    rows: usize,
    cols: usize,
    acts: &QuantizedActs<'_>,
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
    acts: &QuantizedActs<'_>,
    out: &mut [f32],
) -> Result<(), QuantError> {
    if acts.ty() != ty.vec_dot_type() {
        return Err(QuantError::ActivationType {
            weights: ty,
            expected: ty.vec_dot_type(),
            actual: acts.ty(),
        });
    }
    if !isa.is_available() {
        return Err(QuantError::Unsupported {
            op: "matmul on an instruction set this CPU lacks",
            ty,
        });
    }
    let kernels = isa.kernels(ty);
    let kernel = kernels
        .vec_dot
        .ok_or(QuantError::Unsupported { op: "vec_dot", ty })?;
    sizes::expect_len("activation columns", cols, acts.cols())?;
    let row_bytes = sizes::row_bytes(ty, cols, "weight row")?;
    let weight_bytes = sizes::product(rows, row_bytes, "weight")?;
    sizes::expect_len("weight bytes", weight_bytes, weight.len())?;
    let out_len = sizes::product(acts.n_tokens(), rows, "output")?;
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
    let tile = kernels
        .tile
        .filter(|_| acts.has_tile_scales() && acts.n_tokens() >= 2);
    // More tokens than a tile takes: a decoding, where this set has one for `ty`, decodes each
    // group of 16 weight rows once for all of them, with the same bits as `kernel`.
    let decoding = kernels
        .decoding
        .filter(|_| acts.has_tile_scales() && acts.n_tokens() > TILE_LANES);
    // One token: a row kernel, where this set has one for `ty`, takes each activation block
    // through several weight rows at once, with the same bits as `kernel`.
    let row_kernel = kernels.rows.filter(|_| acts.n_tokens() == 1);
    let product = Product {
        kernel,
        tile,
        decoding,
        blocks: cols / ty.block_len(),
        row_kernel,
        weight,
        row_bytes,
        rows,
        acts,
    };

    let pool = tallow_threads::global();
    let threads = pool.threads();
    let work = out_len.saturating_mul(cols);
    if threads == 1 || work < SERIAL_WORK {
        product.rows_into(0..rows, |i, v| out[i] = v);
        return Ok(());
    }
    let chunk_rows = rows
        .div_ceil(threads * CHUNKS_PER_THREAD)
        .max(MIN_CHUNK_ROWS);
    // A decoding decodes whole groups of rows.
    let chunk_rows = match decoding {
        Some(_) => chunk_rows.next_multiple_of(PACK_ROWS),
        None => chunk_rows,
    };
    let shared = DisjointSlice::new(out);
    pool.run(rows.div_ceil(chunk_rows), &|chunk, _| {
        let range = chunk * chunk_rows..rows.min((chunk + 1) * chunk_rows);
        // SAFETY: `rows_into` only writes indices t * rows + r with r in `range`; the chunks'
        // row ranges are disjoint, so no index is written by two tasks.
        product.rows_into(range, |i, v| unsafe { shared.write(i, v) });
    });
    Ok(())
}

/// The validated operands of one [`matmul`].
struct Product<'a> {
    kernel: VecDot,
    tile: Option<Tile>,
    decoding: Option<Decoding>,
    /// Blocks in a weight row.
    blocks: usize,
    row_kernel: Option<Rows>,
    weight: &'a [u8],
    row_bytes: usize,
    rows: usize,
    acts: &'a QuantizedActs<'a>,
}

impl Product<'_> {
    /// Computes the outputs of weight rows `range` for every token, handing each to `write`
    /// with its index in `out`.
    fn rows_into(&self, range: Range<usize>, mut write: impl FnMut(usize, f32)) {
        let n_tokens = self.acts.n_tokens();
        if let Some(decoding) = self.decoding {
            return self.decoded_into(decoding, range, write);
        }
        if let Some(tile) = self.tile {
            return self.tiles_into(tile, range, write);
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
                for t in tokens.clone() {
                    write(
                        t * self.rows + r,
                        self.kernel.call(self.row(r), self.acts.row(t)),
                    );
                }
            }
        }
    }
}

impl Product<'_> {
    /// Weight row `r`.
    fn row(&self, r: usize) -> &[u8] {
        &self.weight[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// [`Product::rows_into`] with tile kernels: per group of [`TILE_LANES`] tokens, each
    /// weight row against the whole group in one tile.
    fn tiles_into(&self, tile: Tile, range: Range<usize>, mut write: impl FnMut(usize, f32)) {
        let mut out = [0f32; TILE_LANES];
        for g in 0..self.acts.n_tokens().div_ceil(TILE_LANES) {
            let (first, a, scales) = self.acts.tile(g);
            let n = a.len();
            for r in range.clone() {
                tile.call(self.row(r), a, &scales, &mut out[..n]);
                for (lane, &v) in out[..n].iter().enumerate() {
                    write((first + lane) * self.rows + r, v);
                }
            }
        }
    }

    /// [`Product::rows_into`] through a decoding: [`PACK_ROWS`] weight rows decoded into a
    /// packed group at a time, then every packed tile of tokens against it.
    fn decoded_into(
        &self,
        decoding: Decoding,
        range: Range<usize>,
        mut write: impl FnMut(usize, f32),
    ) {
        let kernel = decoding.kernel();
        let mut group = vec![0u8; decoding.group_bytes(self.blocks)];
        let mut outputs = [[0f32; PACK_ROWS]; PACKED_TILE];
        for start in range.clone().step_by(PACK_ROWS) {
            let rows = start..range.end.min(start + PACK_ROWS);
            let w = &self.weight[rows.start * self.row_bytes..rows.end * self.row_bytes];
            decoding.decode(w, rows.len(), &mut group);
            for tile in 0..self.acts.packed_tiles() {
                let (first, a, scales) = self.acts.packed_tile(tile);
                let n = a.len();
                let mut outs = outputs.each_mut().map(|o| &mut o[..]);
                // Decoded just before, the group is in the cache.
                kernel.call(&group, WeightsAt::Cache, a, &scales, &mut outs[..n]);
                for (t, lanes) in outputs[..n].iter().enumerate() {
                    for (r, &v) in rows.clone().zip(lanes) {
                        write((first + t) * self.rows + r, v);
                    }
                }
            }
        }
    }
}
