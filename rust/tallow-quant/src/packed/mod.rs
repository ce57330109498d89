//! Weight matrices repacked at load time into groups of interleaved rows.
//!
//! In the GGUF layout each row's blocks follow one another, and a dot product ends with a
//! horizontal sum per row and block. Packed, the rows are taken in groups of 16 ([`PACK_ROWS`]:
//! one row per i32 lane of a 512-bit vector) and each group stores, block after block:
//!
//! - its f16 fields: the 16 rows' `d` (then, for Q4_1, `m`; for Q4_K and Q5_K, `dmin`);
//! - its *words*: runs of four bytes of each row's block that a kernel reads together, the 16
//!   rows' copies of one word side by side (see `layout`, which lists each format's words).
//!   Four columns of a row (a *step*) are one i32 lane of a vector.
//!
//! A block's scales come just before its quants, so that a kernel reads each group, and each
//! run of groups, front to back in one stream: the hardware prefetcher follows a stream, but
//! not two interleaved ones or one with gaps (a layout with a group's scales apart from its
//! quants read at half the bandwidth). The packed matrix is exactly as large as the GGUF one.
//! A kernel multiplies a block of the 16 rows by one token with 8 byte dot products against
//! the token's activation bytes broadcast four at a time, and reuses the unpacked block for
//! up to 8 tokens.

pub(crate) mod chunks;
mod layout;

use std::ops::Range;
use std::sync::Arc;

use tallow_threads::DisjointSlice;

pub(crate) use layout::{Layout, MAX_BLOCK_BYTES};

use self::chunks::StealingRanges;
use crate::aligned::AlignedBytes;
use crate::kernels::{Packed, WeightsAt, PACKED_TILE, PACK_ROWS, TILE_LANES};
use crate::{reference, sizes, GgmlType, Isa, QuantError, QuantizedActs};

/// The formats with a packed layout (and a packed kernel on every instruction set that packs:
/// the scalar kernels and AVX2; AVX-512 has its own for the first nine, and for IQ4_XS with
/// VNNI, and runs AVX2's for the rest).
pub const PACKED_FORMATS: [GgmlType; 11] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// Below this many multiply-adds a product runs on the calling thread.
const SERIAL_WORK: usize = 1 << 18;
/// [`PackedMatrix::pack_many`] reports its progress through a source in steps of about this
/// many bytes.
const PROGRESS_BYTES: usize = 4 << 20;

/// A weight matrix packed for the kernels of one instruction set (see the module docs).
pub struct PackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    kernel: Packed,
    /// Bytes of one group of [`PACK_ROWS`] rows.
    group_bytes: usize,
    /// The buffer this matrix was packed into (shared with the matrices packed with it), and
    /// its bytes there.
    storage: Arc<AlignedBytes>,
    range: Range<usize>,
}

/// A weight matrix in the GGUF layout, to pack: `rows` rows of `cols` elements of `ty`.
#[derive(Debug, Clone, Copy)]
pub struct WeightSource<'a> {
    pub ty: GgmlType,
    pub bytes: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

impl PackedMatrix {
    /// Whether [`PackedMatrix::pack`] packs a `rows` by `cols` matrix of `ty` for the running
    /// CPU: it needs a packed kernel for `ty` and whole groups of [`PACK_ROWS`] rows.
    pub fn can_pack(ty: GgmlType, rows: usize, cols: usize) -> bool {
        Self::can_pack_with(Isa::detected(), ty, rows, cols)
    }

    /// [`PackedMatrix::can_pack`] for instruction set `isa`.
    pub fn can_pack_with(isa: Isa, ty: GgmlType, rows: usize, cols: usize) -> bool {
        isa.kernels(ty).packed.is_some()
            && rows.is_multiple_of(PACK_ROWS)
            && cols.is_multiple_of(ty.block_len())
    }

    /// Packs `weight`, `rows` rows of `cols` elements of `ty` in the GGUF layout, for the
    /// running CPU's kernels; `None` where it cannot ([`PackedMatrix::can_pack`]).
    pub fn pack(
        ty: GgmlType,
        weight: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Option<Self>, QuantError> {
        Self::pack_with(Isa::detected(), ty, weight, rows, cols)
    }

    /// [`PackedMatrix::pack`] for the kernels of instruction set `isa`.
    pub fn pack_with(
        isa: Isa,
        ty: GgmlType,
        weight: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Option<Self>, QuantError> {
        let source = WeightSource {
            ty,
            bytes: weight,
            rows,
            cols,
        };
        let mut packed = Self::pack_many_with(isa, &[source], |_, _| {})?;
        Ok(packed.pop().flatten())
    }

    /// Packs every matrix of `sources` that this CPU can pack ([`PackedMatrix::can_pack`])
    /// into one allocation, which is large enough for huge pages when the matrices are: a
    /// model's weights stream through every step, and huge pages spare the page walks.
    /// Reports progress as `packed(i, bytes)`: the bytes `bytes` of source `i` are packed and
    /// no longer read (in order, a few MiB at a time, so that the caller can let the pages
    /// of a large source go while the rest of it is packed). `None` for the sources it leaves
    /// unpacked; an error when a source's size does not match its shape.
    pub fn pack_many(
        sources: &[WeightSource<'_>],
        packed: impl FnMut(usize, Range<usize>),
    ) -> Result<Vec<Option<Self>>, QuantError> {
        Self::pack_many_with(Isa::detected(), sources, packed)
    }

    /// [`PackedMatrix::pack_many`] for the kernels of instruction set `isa`.
    pub fn pack_many_with(
        isa: Isa,
        sources: &[WeightSource<'_>],
        mut packed: impl FnMut(usize, Range<usize>),
    ) -> Result<Vec<Option<Self>>, QuantError> {
        // Each packable source's kernel, group size and place in the shared buffer.
        let mut places = Vec::with_capacity(sources.len());
        let mut total = 0usize;
        for s in sources {
            let row_bytes = sizes::row_bytes(s.ty, s.cols, "weight row")?;
            sizes::expect_len(
                "weight bytes",
                sizes::product(s.rows, row_bytes, "weight")?,
                s.bytes.len(),
            )?;
            let place = match (isa.kernels(s.ty).packed, Layout::of(s.ty)) {
                (Some(kernel), Some(layout)) if Self::can_pack_with(isa, s.ty, s.rows, s.cols) => {
                    let group_bytes = s.cols / s.ty.block_len() * layout.packed_block_bytes();
                    let size = sizes::product(s.rows / PACK_ROWS, group_bytes, "packed")?;
                    let offset = total;
                    // Each matrix starts on a cache line.
                    total = offset
                        .checked_add(size.next_multiple_of(64))
                        .ok_or(QuantError::SizeOverflow { what: "packed" })?;
                    Some((kernel, group_bytes, offset..offset + size))
                }
                _ => None,
            };
            places.push(place);
        }
        let mut storage = AlignedBytes::zeroed(total);
        let pool = tallow_threads::global();
        for (i, (s, place)) in sources.iter().zip(&places).enumerate() {
            let Some((_, group_bytes, range)) = place else {
                continue;
            };
            let layout = Layout::of(s.ty).expect("only formats with a layout are packed");
            let src_group_bytes = PACK_ROWS * (s.bytes.len() / s.rows);
            let dst = DisjointSlice::new(&mut storage.as_mut_slice()[range.clone()]);
            let groups = s.rows / PACK_ROWS;
            // The pool packs the groups of about PROGRESS_BYTES of the source at a time.
            let batch = (PROGRESS_BYTES / src_group_bytes).max(1);
            for first in (0..groups).step_by(batch) {
                let end = groups.min(first + batch);
                pool.run(end - first, &|k, _| {
                    let g = first + k;
                    let src = &s.bytes[g * src_group_bytes..(g + 1) * src_group_bytes];
                    // SAFETY: each task writes its own group.
                    let group = unsafe { dst.range_mut(g * group_bytes..(g + 1) * group_bytes) };
                    layout.pack_group(src, group);
                });
                packed(i, first * src_group_bytes..end * src_group_bytes);
            }
        }
        let storage = Arc::new(storage);
        Ok(sources
            .iter()
            .zip(places)
            .map(|(s, place)| {
                place.map(|(kernel, group_bytes, range)| PackedMatrix {
                    ty: s.ty,
                    rows: s.rows,
                    cols: s.cols,
                    kernel,
                    group_bytes,
                    storage: Arc::clone(&storage),
                    range,
                })
            })
            .collect())
    }

    /// The weight format.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of packed weights (as many as in the GGUF layout).
    pub fn size_bytes(&self) -> usize {
        self.rows / PACK_ROWS * self.group_bytes
    }

    fn bytes(&self) -> &[u8] {
        &self.storage.as_slice()[self.range.clone()]
    }

    fn group(&self, g: usize) -> &[u8] {
        &self.bytes()[g * self.group_bytes..(g + 1) * self.group_bytes]
    }

    /// Dequantizes row `row` into `out` (`cols` values), as [`crate::dequantize`] of the
    /// row before packing. Allocates nothing.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), QuantError> {
        if row >= self.rows {
            return Err(QuantError::SizeMismatch {
                what: "row index below the row count",
                expected: self.rows,
                actual: row,
            });
        }
        sizes::expect_len("dequantized row elements", self.cols, out.len())?;
        let group = self.group(row / PACK_ROWS);
        let lane = row % PACK_ROWS;
        let layout = Layout::of(self.ty).expect("only formats with a layout are packed");
        let mut block = [0u8; MAX_BLOCK_BYTES];
        let block = &mut block[..self.ty.block_bytes()];
        for (b, out) in out.chunks_exact_mut(self.ty.block_len()).enumerate() {
            layout.unpack_block(group, b, lane, block);
            reference::dequantize::dequantize(self.ty, block, out);
        }
        Ok(())
    }

    /// `out[t * rows + r] = dot(weight row r, activations of token t)`, as [`crate::matmul`]
    /// does for the matrix before packing (to within rounding: the sums run in another
    /// order). A token's outputs do not depend on the other tokens of `acts`. Runs on the
    /// global thread pool, split by groups of rows.
    pub fn matmul(&self, acts: &QuantizedActs<'_>, out: &mut [f32]) -> Result<(), QuantError> {
        Self::matmul_many([self], acts, [out])
    }

    /// Checks that `acts` are activations this matrix multiplies: of its format's activation
    /// type, as many columns as it has.
    fn check_acts(&self, acts: &QuantizedActs<'_>) -> Result<(), QuantError> {
        if acts.ty() != self.ty.vec_dot_type() {
            return Err(QuantError::ActivationType {
                weights: self.ty,
                expected: self.ty.vec_dot_type(),
                actual: acts.ty(),
            });
        }
        sizes::expect_len("activation columns", self.cols, acts.cols())
    }

    /// The outputs of the weight rows `rows` alone: `out[t * rows.len() + i] = dot(weight row
    /// rows[i], activations of token t)`, equal bit for bit to those of
    /// [`PackedMatrix::matmul`]. Computes the groups that hold them, on the calling thread:
    /// for the few rows of an output layer that a scoring request reads.
    pub fn matmul_rows(
        &self,
        rows: &[u32],
        acts: &QuantizedActs<'_>,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        self.check_acts(acts)?;
        let n_tokens = acts.n_tokens();
        let out_len = sizes::product(n_tokens, rows.len(), "output")?;
        sizes::expect_len("output elements", out_len, out.len())?;
        if let Some(&row) = rows.iter().find(|&&r| r as usize >= self.rows) {
            return Err(QuantError::SizeMismatch {
                what: "row index below the row count",
                expected: self.rows,
                actual: row as usize,
            });
        }
        if self.cols == 0 {
            out.fill(0.0);
            return Ok(());
        }
        let group_of = |i: usize| rows[i] as usize / PACK_ROWS;
        // Each group once, where its first row is listed; its outputs a tile of tokens at a
        // time, on the stack (nothing is allocated).
        for (i, g) in (0..rows.len()).map(|i| (i, group_of(i))) {
            if (0..i).any(|j| group_of(j) == g) {
                continue;
            }
            for tile in 0..acts.packed_tiles() {
                let (first, a, scales) = acts.packed_tile(tile);
                let n = a.len();
                let mut outputs = [[0f32; PACK_ROWS]; PACKED_TILE];
                let mut outs: [&mut [f32]; PACKED_TILE] = outputs.each_mut().map(|o| &mut o[..]);
                let source = WeightsAt::of_tile(tile);
                self.kernel
                    .call(self.group(g), source, a, &scales, &mut outs[..n]);
                for (j, &row) in rows.iter().enumerate().skip(i) {
                    if row as usize / PACK_ROWS == g {
                        for (t, lane) in outputs[..n].iter().enumerate() {
                            out[(first + t) * rows.len() + j] = lane[row as usize % PACK_ROWS];
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// [`PackedMatrix::matmul`] of several matrices that read the same activations (a layer's
    /// query, key and value projections), in one parallel loop over all their row groups:
    /// `outs[i]` gets the product of `matrices[i]`.
    pub fn matmul_many<const N: usize>(
        matrices: [&PackedMatrix; N],
        acts: &QuantizedActs<'_>,
        outs: [&mut [f32]; N],
    ) -> Result<(), QuantError> {
        let mut outs = outs.into_iter();
        let products = matrices.map(|matrix| Product {
            matrix,
            acts: *acts,
            out: DisjointSlice::new(outs.next().expect("one output per matrix")),
        });
        Self::matmul_each(&products)
    }

    /// Several products, each of a matrix with its own activations (the experts of a
    /// mixture, each with the tokens that chose it), in one parallel loop over all their row
    /// groups. One loop instead of one per product saves a synchronization per product and
    /// spreads small matrices over every thread.
    pub fn matmul_each(products: &[Product<'_>]) -> Result<(), QuantError> {
        let mut work = 0usize;
        for Product {
            matrix: m,
            acts,
            out,
        } in products
        {
            m.check_acts(acts)?;
            let out_len = sizes::product(acts.n_tokens(), m.rows, "output")?;
            sizes::expect_len("output elements", out_len, out.len())?;
            work = work.saturating_add(out_len.saturating_mul(m.cols));
        }
        for p in products.iter().filter(|p| p.acts.cols() == 0) {
            // SAFETY: no loop runs yet; each product's output is its own.
            unsafe { p.out.range_mut(0..p.out.len()) }.fill(0.0);
        }
        // Row groups of a product; none where there is nothing to compute.
        let groups = |p: &Product<'_>| match p.acts.cols() == 0 || p.acts.n_tokens() == 0 {
            true => 0,
            false => p.matrix.rows / PACK_ROWS,
        };
        let total: usize = products.iter().map(groups).sum();
        if total == 0 {
            return Ok(());
        }
        // Runs the groups `range` of the products' groups taken one after the other.
        let run = |range: Range<usize>| {
            let mut first = 0;
            for p in products {
                let n = groups(p);
                let (start, end) = (range.start.max(first), range.end.min(first + n));
                if start < end {
                    p.matrix
                        .groups_into(start - first..end - first, &p.acts, &p.out);
                }
                first += n;
            }
        };
        let pool = tallow_threads::global();
        let threads = pool.threads();
        if threads == 1 || work < SERIAL_WORK {
            run(0..total);
            return Ok(());
        }
        let chunks = StealingRanges::new(total, threads);
        pool.run(threads, &|_, worker| {
            while let Some(range) = chunks.claim(worker) {
                run(range);
            }
        });
        Ok(())
    }

    /// The outputs of the row groups `range` for every token, in tiles of up to
    /// [`PACKED_TILE`] tokens. Up to [`TILE_LANES`] tokens (one group of tile scales) run over
    /// all the groups in one call; more run a run of groups at a time (as many as
    /// [`run_weight_bytes`] hold), every tile over the whole run while its weights are in the
    /// L2 cache. That holds for a single tile of 9 to 16 tokens too, which most kernels take
    /// one group of tile scales after the other: over the whole range the second group
    /// re-read it from memory (2 threads, 16384x8192 Q4_1 with VNNI, 9 tokens: 466 GFLOP/s
    /// that way, 622 in runs, 663 for 8 tokens).
    fn groups_into(&self, range: Range<usize>, acts: &QuantizedActs<'_>, out: &DisjointSlice<f32>) {
        let tiles = acts.packed_tiles();
        let step = if acts.n_tokens() <= TILE_LANES {
            range.len()
        } else {
            (run_weight_bytes() / self.group_bytes).max(1)
        };
        for start in range.clone().step_by(step.max(1)) {
            let groups = start..range.end.min(start + step);
            let bytes =
                &self.bytes()[groups.start * self.group_bytes..groups.end * self.group_bytes];
            let rows = groups.start * PACK_ROWS..groups.end * PACK_ROWS;
            for tile in 0..tiles {
                let (first, a, scales) = acts.packed_tile(tile);
                let n = a.len();
                let mut outs: [&mut [f32]; PACKED_TILE] = std::array::from_fn(|t| {
                    let at = (first + t) * self.rows;
                    if t < n {
                        // SAFETY: this task owns the rows of groups `range`, for every token.
                        unsafe { out.range_mut(at + rows.start..at + rows.end) }
                    } else {
                        &mut []
                    }
                });
                let source = WeightsAt::of_tile(tile);
                self.kernel.call(bytes, source, a, &scales, &mut outs[..n]);
            }
        }
    }
}

/// One product of [`PackedMatrix::matmul_each`]: `out[t * rows + r] = dot(weight row r of
/// matrix, activations of token t)`.
pub struct Product<'a> {
    pub matrix: &'a PackedMatrix,
    pub acts: QuantizedActs<'a>,
    /// Written by the product alone: no two products of one call share an output.
    pub out: DisjointSlice<'a, f32>,
}

/// Weight bytes a product of several tiles takes at a time: every tile of tokens runs over
/// these groups before the next ones. A quarter of the core's L2 cache, which keeps them from
/// one tile to the next, and at least [`MIN_RUN_WEIGHT_BYTES`]; each pass over the prompt's
/// activations, which do not fit in the L2 at 1B sizes and up, then serves as many groups, and
/// AVX2's tiles copy each column of their activations once per run (2 MiB L2, 3B Q4_K_M,
/// pp512 capped to AVX2: 62-63 t/s with 256 KiB runs, 67-68 with 512 KiB).
fn run_weight_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| (l2_cache_bytes().unwrap_or(0) / 4).max(MIN_RUN_WEIGHT_BYTES))
}

/// The least [`run_weight_bytes`]: a quarter of a 1 MiB L2 cache, half of a 512 KiB one. (Runs
/// of 16 KiB, for the L1 cache, streamed a 1B model's activations once per group, and its FFN
/// products with 2048 inputs ran a fifth slower: calls of a few thousand cycles each, each
/// waiting on its first loads.)
const MIN_RUN_WEIGHT_BYTES: usize = 256 * 1024;

/// A core's L2 cache, as the CPU reports it.
fn l2_cache_bytes() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // Leaf 0x8000_0006, which AMD's and Intel's CPUs both have: the L2 cache's size in
        // KiB in bits 16..32 of ECX.
        if __cpuid(0x8000_0000).eax >= 0x8000_0006 {
            let kib = (__cpuid(0x8000_0006).ecx >> 16) as usize;
            return (kib > 0).then_some(kib << 10);
        }
    }
    None
}
