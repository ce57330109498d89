//! One step on the device: each operation launches its kernel as it comes, over buffers the
//! step allocates.

use std::sync::Arc;

use tallow_backend::{
    Activation, BackendError, Draw, Experts, GroupPlan, Moe, Output, OutputRows, Routing, Scores,
    Step, StepInput,
};
use tallow_kv::PagedKvCache;

use crate::gpu::{bytes_of, Args, Buffer, Device, DevicePtr, Gpu, ToNeBytes};
use crate::kernels::{
    attention_splits, attention_tile, element_blocks, for_format, row_threads, AttentionTile,
    Product, ATTENTION_THREADS, ATTENTION_TILE_TOKENS, DRAW_THREADS, MAX_TOP_K, NO_EXPERT,
    PRODUCT_TOKENS,
};
use crate::pages::Pages;
use crate::{GpuBackend, Matrix, Part, Vector};

/// Rows of activations on the device.
pub struct Rows<G: Gpu> {
    buffer: Buffer<G>,
    n: usize,
    width: usize,
}

impl<G: Gpu> Rows<G> {
    fn len(&self) -> usize {
        self.n * self.width
    }
}

/// Rows of activations quantized for the integer products (the `quantize_q8` kernel): a
/// signed byte a value, and 16 bytes of scale and sums a run of 32.
struct Quantized<G: Gpu> {
    values: Buffer<G>,
    runs: Buffer<G>,
}

/// What a layer group's attention reads, on the device.
struct GroupBuffers {
    /// (page, position) of each token.
    slots: DevicePtr,
    tables: DevicePtr,
    table_starts: DevicePtr,
}

/// Tiles of a step's attention (the `attention_tiles` kernels): blocks of (token, query
/// head) rows, each a run of one chunk's tokens by a KV head's query heads.
struct AttentionTiles {
    /// Where the (first token, tokens) of each tile are in the step's plan (an offset).
    tiles: usize,
    n_tiles: usize,
    /// The kernel's most head dimensions.
    head_dims: usize,
    tile: AttentionTile,
}

/// How a step's attention is cut: its chunks of [`ATTENTION_TILE_TOKENS`] tokens or more (a
/// prompt's) in tiles, where its heads fit a tiled kernel, and its other tokens (decoding,
/// drafts) a block per (token, head), split where they are few (the `attention` kernels).
struct AttentionCut {
    tiles: Option<AttentionTiles>,
    /// The tokens of a block per (token, head), on the host and where they are in the
    /// step's plan (an offset).
    singles: Vec<u32>,
    singles_at: Option<usize>,
}

/// A step's arrays for its kernels as they go to the device: each at its offset in one
/// buffer, written with one copy (a copy from the host is a call to the driver, which waits
/// for the device's queue; a step has a dozen arrays).
#[derive(Default)]
struct PlanBytes(Vec<u8>);

/// The alignment of each array in a [`PlanBytes`]: any API's for a buffer's offset.
const PLAN_ALIGN: usize = 256;

impl PlanBytes {
    /// Adds `values` and gives their offset.
    fn add<T: Copy + ToNeBytes>(&mut self, values: &[T]) -> usize {
        let at = self.0.len().next_multiple_of(PLAN_ALIGN);
        self.0.resize(at, 0);
        self.0.extend(bytes_of(values));
        // An empty array's address still lies in the buffer.
        self.0.resize(self.0.len().max(at + 4), 0);
        at
    }
}

impl AttentionCut {
    /// The cut of `input`'s attention, its arrays added to `plan`.
    fn of_step<G: Gpu>(
        device: &Device<G>,
        input: &StepInput<GpuBackend<G>>,
        plan: &mut PlanBytes,
    ) -> AttentionCut {
        let heads = input.heads;
        let group = heads.n_head / heads.n_head_kv.max(1);
        let tiled = attention_tile(heads.head_dim, group, |dims| {
            device.gpu.attention_tile(dims)
        });
        let (mut tiles, mut singles) = (Vec::new(), Vec::new());
        let mut first = 0;
        for chunk in &input.batch.chunks {
            let end = first + chunk.len;
            let tokens = first..end;
            match tiled {
                Some((_, tile)) if chunk.len >= ATTENTION_TILE_TOKENS => {
                    let per_tile = tile.rows / group;
                    for start in tokens.step_by(per_tile) {
                        tiles.extend([start, per_tile.min(end - start)].map(|v| v as u32));
                    }
                }
                _ => singles.extend(tokens.map(|t| t as u32)),
            }
            first += chunk.len;
        }
        let tiles = match tiled {
            Some((head_dims, tile)) if !tiles.is_empty() => Some(AttentionTiles {
                tiles: plan.add(&tiles),
                n_tiles: tiles.len() / 2,
                head_dims,
                tile,
            }),
            _ => None,
        };
        let singles_at = match singles.is_empty() {
            true => None,
            false => Some(plan.add(&singles)),
        };
        AttentionCut {
            tiles,
            singles,
            singles_at,
        }
    }
}

/// One step of the backend.
pub struct GpuStep<'s, G: Gpu> {
    device: &'s Arc<Device<G>>,
    input: &'s StepInput<'s, GpuBackend<G>>,
    /// The arrays below (the plan's, the ropes' angles, the attention cut's), uploaded at once.
    plan: Buffer<G>,
    /// The token ids.
    tokens: DevicePtr,
    positions: DevicePtr,
    token_chunks: DevicePtr,
    logit_rows: DevicePtr,
    hidden_rows: DevicePtr,
    /// For each RoPE, each token's cosines and sines.
    angles: Vec<DevicePtr>,
    groups: Vec<GroupBuffers>,
    /// About how many positions a block of a split attention takes.
    attention_span: usize,
    /// How the step's attention is cut between kernels.
    attention_cut: AttentionCut,
    /// The words of the draws the step knew ahead ([`StepInput::draws`]) that its device
    /// draws, [`DRAW_WORDS`] a row.
    draw_words: Option<DevicePtr>,
}

/// Words of a row's draw ([`Draw::words`]).
const DRAW_WORDS: usize = 6;

/// Whether `gpu`'s draw_rows takes `draws` (where not, the host draws).
fn draws_on_device<G: Gpu>(gpu: &G, draws: &[Draw]) -> bool {
    gpu.draws_at_temperature() || draws.iter().all(Draw::is_greedy)
}

/// The most blocks along a launch's y dimension.
const MAX_GRID_Y: usize = 65_535;

fn mismatch(what: &str, got: usize, want: usize) -> BackendError {
    BackendError::InvalidArgument(format!("{what}: {got} values where {want} are needed"))
}

impl<'s, G: Gpu> GpuStep<'s, G> {
    /// Uploads what the step's kernels read of its plan and RoPEs, with one copy.
    pub(crate) fn new(
        device: &'s Arc<Device<G>>,
        input: &'s StepInput<'s, GpuBackend<G>>,
        attention_span: usize,
    ) -> Result<Self, BackendError> {
        let plan = input.plan;
        let mut bytes = PlanBytes::default();
        let angles: Vec<usize> = (input.ropes.iter())
            .map(|rope| {
                let mut table = vec![0f32; plan.positions.len() * rope.angles_len()];
                rope.angles_of(&plan.positions, &mut table);
                bytes.add(&table)
            })
            .collect();
        let groups: Vec<[usize; 3]> = (plan.groups.iter())
            .map(|g: &GroupPlan| {
                let slots: Vec<u32> = g.slots.iter().flat_map(|s| [s.page, s.offset]).collect();
                [&slots, &g.tables, &g.table_starts].map(|values| bytes.add(values))
            })
            .collect();
        let [tokens, positions, token_chunks, logit_rows, hidden_rows] = [
            &input.batch.tokens,
            &plan.positions,
            &plan.token_chunks,
            &plan.logit_rows,
            &plan.hidden_rows,
        ]
        .map(|values| bytes.add(values));
        let attention_cut = AttentionCut::of_step(device, input, &mut bytes);
        let draw_words = (input
            .draws
            .filter(|draws| draws_on_device(&device.gpu, draws)))
        .map(|draws| bytes.add(&draws.iter().flat_map(Draw::words).collect::<Vec<u32>>()));
        let buffer = Buffer::with_for_step(device, &bytes.0)?;
        let at = |offset: usize| buffer.ptr().offset(offset);
        Ok(GpuStep {
            device,
            input,
            tokens: at(tokens),
            positions: at(positions),
            token_chunks: at(token_chunks),
            logit_rows: at(logit_rows),
            hidden_rows: at(hidden_rows),
            angles: angles.into_iter().map(at).collect(),
            groups: (groups.into_iter())
                .map(|[slots, tables, table_starts]| GroupBuffers {
                    slots: at(slots),
                    tables: at(tables),
                    table_starts: at(table_starts),
                })
                .collect(),
            attention_span,
            attention_cut,
            draw_words: draw_words.map(at),
            plan: buffer,
        })
    }

    fn n_tokens(&self) -> usize {
        self.input.batch.tokens.len()
    }

    fn launch(
        &self,
        name: &str,
        grid: [u32; 3],
        block: u32,
        args: &Args,
    ) -> Result<(), BackendError> {
        self.device.gpu.launch(name, grid, [block, 1, 1], args)
    }

    fn new_rows(&self, n: usize, width: usize) -> Result<Rows<G>, BackendError> {
        Ok(Rows {
            // The seam's rows are written before they are read.
            buffer: Buffer::scratch_for_step(self.device, n * width * 4)?,
            n,
            width,
        })
    }

    /// `out = x · mᵀ` (`out` holds `x.n` rows of `m.rows`).
    fn product(&self, x: &Rows<G>, m: &Matrix<G>, out: &mut Rows<G>) -> Result<(), BackendError> {
        self.product_of(x, &mut None, m, out)
    }

    /// `out = x · mᵀ`, taking x as `quantized` where it holds x's quantization (or leaving it
    /// there for the next product of the same x, where this one quantizes it). A matrix in
    /// parts takes a product per part, each part's columns then placed in `out`.
    fn product_of(
        &self,
        x: &Rows<G>,
        quantized: &mut Option<Quantized<G>>,
        m: &Matrix<G>,
        out: &mut Rows<G>,
    ) -> Result<(), BackendError> {
        if x.width != m.cols || out.n != x.n || out.width != m.rows {
            return Err(BackendError::InvalidArgument(format!(
                "a product of {}x{} rows and a {}x{} matrix into {}x{} rows",
                x.n, x.width, m.rows, m.cols, out.n, out.width
            )));
        }
        if let [part] = &m.parts[..] {
            return self.part_product(x, quantized, m, part, out.buffer.ptr());
        }
        for part in &m.parts {
            let columns = self.new_rows(x.n, part.rows)?;
            self.part_product(x, quantized, m, part, columns.buffer.ptr())?;
            let mut args = Args::new();
            args.ptr(columns.buffer.ptr()).ptr(out.buffer.ptr());
            args.int(columns.len())?
                .int(part.rows)?
                .int(m.rows)?
                .int(part.first_row)?;
            let blocks = [element_blocks(columns.len()), 1, 1];
            self.launch("place_columns", blocks, 256, &args)?;
        }
        Ok(())
    }

    /// `out = x · partᵀ` (`out` holds `x.n` rows of `part.rows`), for `part` of `m`.
    fn part_product(
        &self,
        x: &Rows<G>,
        quantized: &mut Option<Quantized<G>>,
        m: &Matrix<G>,
        part: &Part<G>,
        out: DevicePtr,
    ) -> Result<(), BackendError> {
        let product = self.device.gpu.product(m.ty, x.n);
        let (block_rows, block_tokens, threads) = product.block();
        if product.tokens_along_x() && part.rows.div_ceil(block_rows) > MAX_GRID_Y {
            return Err(BackendError::Unsupported(format!(
                "a product of a matrix of {} rows on {}",
                part.rows,
                self.device.gpu.api()
            )));
        }
        let mut args = Args::new();
        args.ptr(part.ptr());
        self.activations(&mut args, product, x, quantized)?;
        args.ptr(out);
        args.int(part.rows)?
            .int(m.cols)?
            .int(m.row_bytes)?
            .int(x.n)?;
        let (rows, tokens) = (part.rows.div_ceil(block_rows), x.n.div_ceil(block_tokens));
        let grid = match product.tokens_along_x() {
            true => [tokens as u32, rows as u32, 1],
            false => [rows as u32, tokens as u32, 1],
        };
        let kernel = product.kernels()[0];
        self.launch(&for_format(kernel, m.ty), grid, threads, &args)
    }

    /// The activations' arguments of a `product` kernel: x, or for the integer products x's
    /// quantization (`quantized`, made here where it does not hold it yet).
    fn activations(
        &self,
        args: &mut Args,
        product: Product,
        x: &Rows<G>,
        quantized: &mut Option<Quantized<G>>,
    ) -> Result<(), BackendError> {
        if !product.is_integer() {
            args.ptr(x.buffer.ptr());
            return Ok(());
        }
        let q = match quantized {
            Some(q) => q,
            None => quantized.insert(self.quantize(x)?),
        };
        args.ptr(q.values.ptr()).ptr(q.runs.ptr());
        Ok(())
    }

    /// x's rows (of whole runs of 32 values) quantized for the integer products.
    fn quantize(&self, x: &Rows<G>) -> Result<Quantized<G>, BackendError> {
        let n_runs = x.len() / 32;
        let quantized = Quantized {
            values: Buffer::scratch_for_step(self.device, x.len())?,
            runs: Buffer::scratch_for_step(self.device, n_runs * 16)?,
        };
        let mut args = Args::new();
        args.ptr(x.buffer.ptr())
            .ptr(quantized.values.ptr())
            .ptr(quantized.runs.ptr());
        args.int(n_runs)?;
        let blocks = [n_runs.div_ceil(8) as u32, 1, 1];
        self.launch("quantize_q8", blocks, 256, &args)?;
        Ok(quantized)
    }

    /// RMSNorm of each row of `width` values of `x` into `out` (which may be `x`).
    fn norm(
        &self,
        x: &Buffer<G>,
        rows: usize,
        gain: &Vector<G>,
        eps: f32,
        out: &Buffer<G>,
    ) -> Result<(), BackendError> {
        let mut args = Args::new();
        args.ptr(x.ptr())
            .ptr(gain.buffer.ptr())
            .f32(eps)
            .ptr(out.ptr());
        args.int(gain.len)?;
        self.launch(
            "rms_norm",
            [rows as u32, 1, 1],
            row_threads(gain.len),
            &args,
        )
    }
}

impl<'s, G: Gpu> GpuStep<'s, G> {
    /// The rows of `part` of `table` that the `n` ids of `ids` name (rows of the part), times
    /// `scale`, into the `n` rows from `out`.
    fn embed_rows(
        &self,
        table: &Matrix<G>,
        part: &Part<G>,
        ids: DevicePtr,
        n: usize,
        scale: f32,
        out: DevicePtr,
    ) -> Result<(), BackendError> {
        let mut args = Args::new();
        args.ptr(part.ptr()).ptr(ids).int(table.cols)?;
        args.int(table.row_bytes)?.f32(scale).ptr(out);
        self.launch(&for_format("embed", table.ty), [n as u32, 1, 1], 64, &args)
    }
}

/// A mixture-of-experts block's pairs, grouped by expert on the device.
struct Grouped<G: Gpu> {
    /// Each pair's expert and weight.
    chosen: Buffer<G>,
    weights: Buffer<G>,
    /// The pairs by expert, and the tiles of products over them (the group_pairs kernel).
    pairs: Buffer<G>,
    tiles: Buffer<G>,
    n_tiles: usize,
    /// The most pairs of a tile: the tokens of a block of every product of the mixture
    /// where they agree (the tiles' where every product takes tiles), PRODUCT_TOKENS
    /// otherwise.
    per_tile: usize,
}

impl<'s, G: Gpu> GpuStep<'s, G> {
    /// Routes each token and groups the pairs by expert.
    fn group_pairs(
        &self,
        router: &Rows<G>,
        n_expert: usize,
        moe: Moe,
        per_tile: usize,
    ) -> Result<Grouped<G>, BackendError> {
        let (n, k) = (self.n_tokens(), moe.top_k);
        if k == 0 || k > MAX_TOP_K || k > n_expert {
            return Err(BackendError::Unsupported(format!(
                "{k} of {n_expert} experts a token on {} (at most {MAX_TOP_K})",
                self.device.gpu.api()
            )));
        }
        // Every expert's run ends in a tile that may not be full.
        let n_tiles = (n * k).div_ceil(per_tile) + n_expert.min(n * k);
        if n_tiles > MAX_GRID_Y {
            return Err(BackendError::Unsupported(format!(
                "{n} tokens in one step of a mixture of experts on {}",
                self.device.gpu.api()
            )));
        }
        let grouped = Grouped {
            // route_tokens and group_pairs write these whole.
            chosen: Buffer::scratch_for_step(self.device, n * k * 4)?,
            weights: Buffer::scratch_for_step(self.device, n * k * 4)?,
            pairs: Buffer::scratch_for_step(self.device, n * k * 4)?,
            tiles: Buffer::scratch_for_step(self.device, n_tiles * 16)?,
            n_tiles,
            per_tile,
        };
        let mut args = Args::new();
        args.ptr(router.buffer.ptr())
            .ptr(grouped.chosen.ptr())
            .ptr(grouped.weights.ptr());
        args.int(n)?.int(n_expert)?.int(k)?;
        args.i32(i32::from(moe.routing == Routing::SoftmaxTopK));
        self.launch("route_tokens", [element_blocks(n), 1, 1], 256, &args)?;
        // group_pairs zeroes its counts first.
        let starts = Buffer::scratch_for_step(self.device, (n_expert + 1) * 4)?;
        let mut args = Args::new();
        args.ptr(grouped.chosen.ptr())
            .ptr(grouped.pairs.ptr())
            .ptr(starts.ptr())
            .ptr(grouped.tiles.ptr());
        args.int(n * k)?
            .int(n_expert)?
            .int(per_tile)?
            .int(n_tiles)?;
        self.launch("group_pairs", [1, 1, 1], 32, &args)?;
        Ok(grouped)
    }

    /// Each pair's row of `out` is its expert's matrix of `matrices` times its row of `input`
    /// (row `pair / divisor`), taking `input` as `quantized` as [`Self::product_of`] does.
    fn expert_products(
        &self,
        input: &Rows<G>,
        quantized: &mut Option<Quantized<G>>,
        divisor: usize,
        matrices: &[Matrix<G>],
        grouped: &Grouped<G>,
        out: &Rows<G>,
    ) -> Result<(), BackendError> {
        let m = &matrices[0];
        let same = |e: &Matrix<G>| e.ty == m.ty && e.rows == m.rows && e.cols == m.cols;
        if !matrices.iter().all(same) || input.width != m.cols || out.width != m.rows {
            return Err(BackendError::InvalidArgument(format!(
                "experts' products of {}x{} rows by {}x{} matrices into {}x{} rows",
                input.n, input.width, m.rows, m.cols, out.n, out.width
            )));
        }
        if let Some(e) = matrices.iter().find(|e| e.parts.len() > 1) {
            return Err(BackendError::Unsupported(format!(
                "an expert's matrix of {} bytes on {}, larger than one of its buffers",
                e.rows * e.row_bytes,
                self.device.gpu.api()
            )));
        }
        // A launch for each buffer the experts lie in (one, but where the device's parts
        // cut a stack): each expert's offset from the buffer's start, NO_EXPERT for the
        // experts in other buffers, whose tiles the launch leaves.
        let places: Vec<(DevicePtr, usize)> = matrices.iter().map(|e| e.parts[0].place()).collect();
        let mut bases: Vec<DevicePtr> = places.iter().map(|&(base, _)| base).collect();
        bases.sort_by_key(|b| b.0);
        bases.dedup();
        for base in bases {
            let offsets = (places.iter())
                .map(|&(b, offset)| match b == base {
                    true => u32::try_from(offset).ok().filter(|&o| o != NO_EXPERT),
                    false => Some(NO_EXPERT),
                })
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    BackendError::Unsupported(format!(
                        "experts of one block 4 GiB or more apart on {}",
                        self.device.gpu.api()
                    ))
                })?;
            let mut args = Args::new();
            args.ptr(base).ptr(self.device.offset_table(&offsets)?);
            self.experts_launch(&mut args, input, quantized, m, grouped, out, divisor)?;
        }
        Ok(())
    }

    /// The launch of an experts' product of [`Self::expert_products`], after its matrices'
    /// arguments `args`.
    #[allow(clippy::too_many_arguments)]
    fn experts_launch(
        &self,
        args: &mut Args,
        input: &Rows<G>,
        quantized: &mut Option<Quantized<G>>,
        m: &Matrix<G>,
        grouped: &Grouped<G>,
        out: &Rows<G>,
        divisor: usize,
    ) -> Result<(), BackendError> {
        let product = match self.device.gpu.product(m.ty, self.n_tokens()) {
            // Where another of the block's matrices cannot take this product's tiles, they
            // are cut for all, and this one takes f32 products.
            product if product.block().1 != grouped.per_tile => Product::Float,
            product => product,
        };
        self.activations(args, product, input, quantized)?;
        args.ptr(out.buffer.ptr());
        args.int(m.rows)?.int(m.cols)?.int(m.row_bytes)?;
        args.ptr(grouped.pairs.ptr())
            .ptr(grouped.tiles.ptr())
            .int(divisor)?;
        let (block_rows, _, threads) = product.block();
        let (tiles, rows) = (grouped.n_tiles as u32, m.rows.div_ceil(block_rows) as u32);
        let grid = match product.tokens_along_x() {
            true => [tiles, rows, 1],
            false => [rows, tiles, 1],
        };
        let kernel = product.kernels()[1];
        self.launch(&for_format(kernel, m.ty), grid, threads, args)
    }

    /// Adds each pair's expert's bias (`biases`: every expert's, a row each).
    fn expert_biases(
        &self,
        rows: &Rows<G>,
        biases: &Vector<G>,
        grouped: &Grouped<G>,
    ) -> Result<(), BackendError> {
        let mut args = Args::new();
        args.ptr(rows.buffer.ptr())
            .ptr(biases.buffer.ptr())
            .ptr(grouped.chosen.ptr());
        args.int(rows.len())?.int(rows.width)?;
        let blocks = [element_blocks(rows.len()), 1, 1];
        self.launch("add_expert_biases", blocks, 256, &args)
    }
}

impl<'s, G: Gpu> Step<GpuBackend<G>> for GpuStep<'s, G> {
    type Rows = Rows<G>;

    fn rows(&mut self, n: usize, width: usize) -> Result<Rows<G>, BackendError> {
        self.new_rows(n, width)
    }

    fn upload(&mut self, values: &[f32], width: usize) -> Result<Rows<G>, BackendError> {
        if width == 0 || !values.len().is_multiple_of(width) {
            return Err(mismatch("rows", values.len(), width));
        }
        Ok(Rows {
            buffer: Buffer::with_for_step(self.device, &bytes_of(values))?,
            n: values.len() / width,
            width,
        })
    }

    fn read(&mut self, x: &Rows<G>, out: &mut [f32]) -> Result<(), BackendError> {
        if out.len() > x.len() {
            return Err(mismatch("a read", out.len(), x.len()));
        }
        let mut bytes = vec![0u8; out.len() * 4];
        self.device.gpu.read(x.buffer.ptr(), &mut bytes)?;
        for (v, b) in out.iter_mut().zip(bytes.as_chunks::<4>().0) {
            *v = f32::from_ne_bytes(*b);
        }
        Ok(())
    }

    fn embed(
        &mut self,
        table: &Matrix<G>,
        scale: f32,
        out: &mut Rows<G>,
    ) -> Result<(), BackendError> {
        let n = self.n_tokens();
        if out.n != n || out.width != table.cols {
            return Err(mismatch("an embedding", out.len(), n * table.cols));
        }
        if let Some(&id) = self
            .input
            .batch
            .tokens
            .iter()
            .find(|&&t| t as usize >= table.rows)
        {
            return Err(BackendError::InvalidArgument(format!(
                "token {id} of a table of {} rows",
                table.rows
            )));
        }
        if let [part] = &table.parts[..] {
            return self.embed_rows(table, part, self.tokens, n, scale, out.buffer.ptr());
        }
        // A table in parts: each part's tokens embedded into consecutive rows, then gathered
        // into the tokens' order.
        let embedded = self.new_rows(n, table.cols)?;
        let mut order = vec![0u32; n];
        let mut done = 0;
        for part in &table.parts {
            let rows = part.first_row..part.first_row + part.rows;
            let mut ids = Vec::new();
            for (t, &id) in self.input.batch.tokens.iter().enumerate() {
                if rows.contains(&(id as usize)) {
                    order[t] = (done + ids.len()) as u32;
                    ids.push(id - part.first_row as u32);
                }
            }
            if ids.is_empty() {
                continue;
            }
            let ids_buffer = Buffer::with_for_step(self.device, &bytes_of(&ids))?;
            let at = embedded.buffer.ptr().offset(done * table.cols * 4);
            self.embed_rows(table, part, ids_buffer.ptr(), ids.len(), scale, at)?;
            done += ids.len();
        }
        let order = Buffer::with_for_step(self.device, &bytes_of(&order))?;
        let mut args = Args::new();
        args.ptr(embedded.buffer.ptr())
            .ptr(order.ptr())
            .ptr(out.buffer.ptr());
        args.int(table.cols)?;
        let threads = row_threads(table.cols);
        self.launch("gather_rows", [n as u32, 1, 1], threads, &args)
    }

    fn rms_norm(
        &mut self,
        x: &Rows<G>,
        gain: &Vector<G>,
        eps: f32,
        out: &mut Rows<G>,
    ) -> Result<(), BackendError> {
        if x.width != gain.len || out.len() != x.len() {
            return Err(mismatch("a norm's gain", gain.len, x.width));
        }
        self.norm(&x.buffer, x.n, gain, eps, &out.buffer)
    }

    fn rms_norm_in_place(
        &mut self,
        x: &mut Rows<G>,
        gain: &Vector<G>,
        eps: f32,
    ) -> Result<(), BackendError> {
        if gain.len == 0 || !x.width.is_multiple_of(gain.len) {
            return Err(mismatch("a norm's gain", gain.len, x.width));
        }
        self.norm(&x.buffer, x.len() / gain.len, gain, eps, &x.buffer)
    }

    fn matmul<const N: usize>(
        &mut self,
        input: &Rows<G>,
        matrices: [&Matrix<G>; N],
        outs: [&mut Rows<G>; N],
    ) -> Result<(), BackendError> {
        let mut quantized = None;
        for (m, out) in matrices.into_iter().zip(outs) {
            self.product_of(input, &mut quantized, m, out)?;
        }
        Ok(())
    }

    fn add_bias(&mut self, x: &mut Rows<G>, bias: &Vector<G>) -> Result<(), BackendError> {
        if x.width != bias.len {
            return Err(mismatch("a bias", bias.len, x.width));
        }
        let mut args = Args::new();
        args.ptr(x.buffer.ptr())
            .ptr(bias.buffer.ptr())
            .int(x.len())?
            .int(x.width)?;
        self.launch("add_bias", [element_blocks(x.len()), 1, 1], 256, &args)
    }

    fn rope(&mut self, rope: usize, x: &mut Rows<G>) -> Result<(), BackendError> {
        let (r, angles) = match (self.input.ropes.get(rope), self.angles.get(rope)) {
            (Some(r), Some(a)) => (r, a),
            _ => return Err(BackendError::InvalidArgument(format!("no RoPE {rope}"))),
        };
        if x.n != self.n_tokens() || !x.width.is_multiple_of(r.head_dim()) {
            return Err(mismatch(
                "RoPE's rows",
                x.len(),
                self.n_tokens() * r.head_dim(),
            ));
        }
        let mut args = Args::new();
        args.ptr(x.buffer.ptr())
            .ptr(*angles)
            .int(x.width)?
            .int(r.head_dim())?;
        args.int(r.angles_len() / 2)?;
        args.i32(i32::from(r.style() == tallow_backend::RopeStyle::Halves));
        self.launch("rope", [x.n as u32, 1, 1], 64, &args)
    }

    fn write_kv(
        &mut self,
        cache: &mut PagedKvCache,
        layer: usize,
        k: &mut Rows<G>,
        v: &mut Rows<G>,
    ) -> Result<(), BackendError> {
        let group = self.input.plan.group_of(layer)?;
        let pages = cache.store::<Pages<G>>()?;
        let l = *cache.layout();
        let n = self.n_tokens();
        let row = l.n_head_kv * l.head_dim;
        if k.n != n || v.n != n || k.width != row || v.width != row {
            return Err(mismatch("keys and values", k.len(), n * row));
        }
        let mut args = Args::new();
        args.ptr(k.buffer.ptr())
            .ptr(v.buffer.ptr())
            .ptr(self.groups[group].slots);
        args.ptr(pages.of_layer(layer)?)
            .int(l.n_head_kv)?
            .int(l.head_dim)?;
        args.int(pages.n_pages())?.int(l.page_size)?;
        let name = format!("kv_write_{}", l.dtype.name());
        self.launch(&name, [n as u32, 1, 1], 64, &args)?;
        for copy in &self.input.plan.groups[group].copies {
            pages.copy_positions(copy, layer)?;
        }
        Ok(())
    }

    fn attention(
        &mut self,
        cache: &PagedKvCache,
        layer: usize,
        scores: Scores,
        sinks: Option<&Vector<G>>,
        q: &mut Rows<G>,
        out: &mut Rows<G>,
    ) -> Result<(), BackendError> {
        let group = &self.groups[self.input.plan.group_of(layer)?];
        let pages = cache.store::<Pages<G>>()?;
        let l = *cache.layout();
        let heads = self.input.heads;
        let n = self.n_tokens();
        if q.n != n || q.width != heads.q_dim() || out.n != n || out.width != heads.q_dim() {
            return Err(mismatch("queries", q.len(), n * heads.q_dim()));
        }
        let mut args = Args::new();
        args.ptr(q.buffer.ptr())
            .ptr(out.buffer.ptr())
            .ptr(pages.of_layer(layer)?);
        args.ptr(group.tables).ptr(group.table_starts);
        args.ptr(self.token_chunks).ptr(self.positions);
        args.int(heads.n_head)?
            .int(heads.n_head_kv)?
            .int(heads.head_dim)?;
        args.int(pages.n_pages())?
            .int(l.page_size)?
            .f32(scores.scale);
        args.f32(scores.softcap.unwrap_or(0.0))
            .int(scores.window.unwrap_or(0))?;
        let (sinks, has_sinks) = match sinks {
            Some(sinks) if sinks.len != heads.n_head => {
                return Err(mismatch("attention sinks", sinks.len, heads.n_head));
            }
            Some(sinks) => (sinks.buffer.ptr(), 1),
            // Without sinks the kernels read none: any address will do.
            None => (q.buffer.ptr(), 0),
        };
        args.ptr(sinks).i32(has_sinks);
        let cut = &self.attention_cut;
        if let Some(tiles) = &cut.tiles {
            let mut args = args.clone();
            args.ptr(self.plan.ptr().offset(tiles.tiles));
            let grid = [tiles.n_tiles as u32, heads.n_head_kv as u32, 1];
            let name = format!("attention_tiles_{}_{}", l.dtype.name(), tiles.head_dims);
            self.launch(&name, grid, tiles.tile.threads(), &args)?;
        }
        let Some(singles) = cut.singles_at.map(|at| self.plan.ptr().offset(at)) else {
            return Ok(());
        };
        // The most positions one of those tokens sees.
        let window = scores.window.filter(|&w| w > 0).unwrap_or(usize::MAX);
        let positions = &self.input.plan.positions;
        let visible = (cut.singles.iter())
            .map(|&t| (positions[t as usize] as usize + 1).min(window))
            .max();
        let n_singles = cut.singles.len();
        let n_blocks = n_singles * heads.n_head;
        let (splits, span) = attention_splits(n_blocks, visible.unwrap_or(1), self.attention_span);
        let width = heads.head_dim + 2;
        let partials = match splits {
            1 => None,
            _ => Some(Buffer::scratch_for_step(
                self.device,
                n_blocks * splits * width * 4,
            )?),
        };
        args.int(span)?.int(splits)?;
        // Without splits the kernels write no partial results: any address will do.
        args.ptr(partials.as_ref().map_or(out.buffer.ptr(), Buffer::ptr));
        args.ptr(singles);
        let grid = [n_singles as u32, heads.n_head as u32, splits as u32];
        let name = format!("attention_{}", l.dtype.name());
        self.launch(&name, grid, ATTENTION_THREADS, &args)?;
        let Some(partials) = partials else {
            return Ok(());
        };
        let mut args = Args::new();
        args.ptr(partials.ptr()).ptr(out.buffer.ptr());
        args.int(heads.n_head)?.int(heads.head_dim)?.int(splits)?;
        args.ptr(sinks).i32(has_sinks).ptr(singles);
        let grid = [n_singles as u32, heads.n_head as u32, 1];
        self.launch("attention_merge", grid, ATTENTION_THREADS, &args)
    }

    fn gated(
        &mut self,
        activation: Activation,
        gate: &mut Rows<G>,
        up: &Rows<G>,
    ) -> Result<(), BackendError> {
        if gate.len() != up.len() {
            return Err(mismatch("a gated activation", up.len(), gate.len()));
        }
        let activation = match activation {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
            Activation::ClampedSwiglu => 2,
        };
        let mut args = Args::new();
        args.ptr(gate.buffer.ptr())
            .ptr(up.buffer.ptr())
            .int(gate.len())?;
        args.i32(activation);
        self.launch("gated", [element_blocks(gate.len()), 1, 1], 256, &args)
    }

    fn experts(
        &mut self,
        x: &Rows<G>,
        router: &Rows<G>,
        experts: &Experts<GpuBackend<G>>,
        moe: Moe,
        out: &mut Rows<G>,
    ) -> Result<(), BackendError> {
        let (n, k, n_expert) = (self.n_tokens(), moe.top_k, experts.len());
        let d = x.width;
        let ff = experts.gate[0].rows;
        if x.n != n || router.n != n || router.width != n_expert || out.len() != x.len() {
            return Err(mismatch(
                "a mixture of experts' rows",
                router.len(),
                n * n_expert,
            ));
        }
        // Tiles of pairs as large as every product's blocks take, or as the f32 products'.
        let block_tokens = |m: &[Matrix<G>]| self.device.gpu.product(m[0].ty, n).block().1;
        let per_tile = match [&experts.gate, &experts.up, &experts.down].map(|m| block_tokens(m)) {
            [a, b, c] if a == b && b == c => a,
            _ => PRODUCT_TOKENS,
        };
        let grouped = self.group_pairs(router, n_expert, moe, per_tile)?;
        let mut gate = self.new_rows(n * k, ff)?;
        let up = self.new_rows(n * k, ff)?;
        let mut quantized = None;
        self.expert_products(x, &mut quantized, k, &experts.gate, &grouped, &gate)?;
        self.expert_products(x, &mut quantized, k, &experts.up, &grouped, &up)?;
        if let Some([gate_bias, up_bias, _]) = &experts.biases {
            self.expert_biases(&gate, gate_bias, &grouped)?;
            self.expert_biases(&up, up_bias, &grouped)?;
        }
        self.gated(moe.activation, &mut gate, &up)?;
        let down = self.new_rows(n * k, d)?;
        self.expert_products(&gate, &mut None, 1, &experts.down, &grouped, &down)?;
        if let Some([_, _, down_bias]) = &experts.biases {
            self.expert_biases(&down, down_bias, &grouped)?;
        }
        let mut args = Args::new();
        args.ptr(out.buffer.ptr())
            .ptr(down.buffer.ptr())
            .ptr(grouped.weights.ptr());
        args.int(out.len())?.int(d)?.int(k)?;
        let blocks = [element_blocks(out.len()), 1, 1];
        self.launch("combine_experts", blocks, 256, &args)
    }

    fn scale_by_sigmoid(&mut self, x: &mut Rows<G>, gates: &Rows<G>) -> Result<(), BackendError> {
        if gates.len() != x.n {
            return Err(mismatch("sigmoid gates", gates.len(), x.n));
        }
        let mut args = Args::new();
        args.ptr(x.buffer.ptr()).ptr(gates.buffer.ptr());
        args.int(x.len())?.int(x.width)?;
        let blocks = [element_blocks(x.len()), 1, 1];
        self.launch("scale_by_sigmoid", blocks, 256, &args)
    }

    fn add(&mut self, x: &mut Rows<G>, y: &Rows<G>) -> Result<(), BackendError> {
        if x.len() != y.len() {
            return Err(mismatch("an addition", y.len(), x.len()));
        }
        let mut args = Args::new();
        args.ptr(x.buffer.ptr()).ptr(y.buffer.ptr()).int(x.len())?;
        self.launch("add", [element_blocks(x.len()), 1, 1], 256, &args)
    }

    fn output_rows(
        &mut self,
        x: &Rows<G>,
        which: OutputRows,
        out: &mut Rows<G>,
    ) -> Result<(), BackendError> {
        let rows = which.of(self.input.plan);
        if out.n != rows.len() || out.width != x.width {
            return Err(mismatch("output rows", out.len(), rows.len() * x.width));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let indices = match which {
            OutputRows::Logits => &self.logit_rows,
            OutputRows::Hidden => &self.hidden_rows,
        };
        let mut args = Args::new();
        args.ptr(x.buffer.ptr()).ptr(*indices).ptr(out.buffer.ptr());
        args.int(x.width)?;
        self.launch(
            "gather_rows",
            [rows.len() as u32, 1, 1],
            row_threads(x.width),
            &args,
        )
    }

    fn logits(
        &mut self,
        x: &Rows<G>,
        m: &Matrix<G>,
        softcap: Option<f32>,
        out: Output<'_>,
    ) -> Result<(), BackendError> {
        let want = out.len_for(x.n, m.rows);
        if out.len() != want {
            return Err(mismatch("logits", out.len(), want));
        }
        let limit = self.device.gpu.max_part().unwrap_or(usize::MAX);
        let per_block = (limit / (4 * m.rows).max(1)).clamp(1, x.n.max(1));
        if per_block >= x.n {
            return self.logits_block(x, m, softcap, out, 0);
        }
        // Blocks of rows whose logits fit a buffer: each block's rows of x copied out, and its
        // logits read back or its tokens drawn; where the host chooses, every row's logits
        // come back first.
        let n_vocab = m.rows;
        match out {
            Output::Draw { draws, tokens } if draws_on_device(&self.device.gpu, draws) => {
                for first in (0..x.n).step_by(per_block) {
                    let xs = self.rows_of(x, first, per_block)?;
                    let end = first + xs.n;
                    let out = Output::Draw {
                        draws: &draws[first..end],
                        tokens: &mut tokens[first..end],
                    };
                    self.logits_block(&xs, m, softcap, out, first)?;
                }
                Ok(())
            }
            Output::Logits(values) => {
                for first in (0..x.n).step_by(per_block) {
                    let xs = self.rows_of(x, first, per_block)?;
                    let rows = &mut values[first * n_vocab..(first + xs.n) * n_vocab];
                    self.logits_block(&xs, m, softcap, Output::Logits(rows), first)?;
                }
                Ok(())
            }
            chosen => {
                let mut all = vec![0f32; x.n * n_vocab];
                self.logits(x, m, softcap, Output::Logits(&mut all))?;
                chosen.take_from(&all, n_vocab)
            }
        }
    }
}

impl<'s, G: Gpu> GpuStep<'s, G> {
    /// Rows `first..first + n` of `x` (fewer past its end), copied.
    fn rows_of(&self, x: &Rows<G>, first: usize, n: usize) -> Result<Rows<G>, BackendError> {
        let n = n.min(x.n - first);
        let rows = self.new_rows(n, x.width)?;
        let row_bytes = x.width * 4;
        let from = x.buffer.ptr().offset(first * row_bytes);
        self.device
            .gpu
            .copy(from, rows.buffer.ptr(), n * row_bytes)?;
        Ok(rows)
    }

    /// [`Step::logits`] of rows whose logits fit one buffer, the step's rows of logits from
    /// `first` on.
    fn logits_block(
        &mut self,
        x: &Rows<G>,
        m: &Matrix<G>,
        softcap: Option<f32>,
        out: Output<'_>,
        first: usize,
    ) -> Result<(), BackendError> {
        let mut logits = self.new_rows(x.n, m.rows)?;
        self.product(x, m, &mut logits)?;
        if let Some(cap) = softcap {
            let mut args = Args::new();
            args.ptr(logits.buffer.ptr()).int(logits.len())?.f32(cap);
            self.launch("softcap", [element_blocks(logits.len()), 1, 1], 256, &args)?;
        }
        let on_host = match &out {
            Output::Logits(_) => false,
            Output::Selected { .. } => true,
            Output::Draw { draws, .. } => !draws_on_device(&self.device.gpu, draws),
        };
        match out {
            Output::Logits(values) => self.read(&logits, values),
            Output::Draw { draws, tokens } if !on_host => {
                if draws.len() != x.n {
                    return Err(mismatch("draws", draws.len(), x.n));
                }
                // The draws sent with the plan where the step knew them, else sent now.
                let sent = (self.input.draws)
                    .filter(|all| all.get(first..first + draws.len()) == Some(draws))
                    .and(self.draw_words);
                let mut now = None;
                let params = match sent {
                    Some(words) => words.offset(first * DRAW_WORDS * 4),
                    None => {
                        let words: Vec<u32> = draws.iter().flat_map(Draw::words).collect();
                        now.insert(Buffer::with_for_step(self.device, &bytes_of(&words))?)
                            .ptr()
                    }
                };
                // Each row's weights, for the filters' sums (written before they are read).
                let weights = Buffer::scratch_for_step(self.device, logits.len() * 4)?;
                let ids = Buffer::scratch_for_step(self.device, tokens.len() * 4)?;
                let mut args = Args::new();
                args.ptr(logits.buffer.ptr()).int(m.rows)?;
                args.ptr(params).ptr(weights.ptr()).ptr(ids.ptr());
                self.launch("draw_rows", [x.n as u32, 1, 1], DRAW_THREADS, &args)?;
                let mut bytes = vec![0u8; tokens.len() * 4];
                self.device.gpu.read(ids.ptr(), &mut bytes)?;
                for (t, b) in tokens.iter_mut().zip(bytes.as_chunks::<4>().0) {
                    *t = u32::from_ne_bytes(*b);
                }
                Ok(())
            }
            // A few tokens' logits, or draws the device's draw_rows does not take: all of
            // them come back and are chosen on the host.
            chosen => {
                let mut all = vec![0f32; x.n * m.rows];
                self.read(&logits, &mut all)?;
                chosen.take_from(&all, m.rows)
            }
        }
    }
}
