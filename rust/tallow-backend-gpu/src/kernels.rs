//! The kernels' launch shapes: what the host code and every API's kernels agree on, and the
//! kernel of each operation and weight format.

use tallow_quant::GgmlType;

use crate::WEIGHT_FORMATS;

/// Every kernel the backend may launch, by name, on a device whose products are `product`'s
/// (`Gpu::product`) and which has tiled attention kernels where `tiled_attention`
/// (`Gpu::attention_tile`): what an API's kernels must define.
pub fn names(product: impl Fn(GgmlType, usize) -> Product, tiled_attention: bool) -> Vec<String> {
    let mut names: Vec<String> = [
        "rms_norm",
        "add",
        "add_bias",
        "gated",
        "rope",
        "gather_rows",
        "softcap",
        "scale_by_sigmoid",
        "route_tokens",
        "group_pairs",
        "add_expert_biases",
        "combine_experts",
        "draw_rows",
        "attention_merge",
        "place_columns",
        "copy_bytes",
    ]
    .map(String::from)
    .into();
    for kv in ["f16", "q8_0"] {
        names.extend([format!("kv_write_{kv}"), format!("attention_{kv}")]);
        for head_dims in ATTENTION_TILE_HEAD_DIMS
            .into_iter()
            .filter(|_| tiled_attention)
        {
            names.push(format!("attention_tiles_{kv}_{head_dims}"));
        }
    }
    for ty in WEIGHT_FORMATS {
        let name = ty.name().to_lowercase();
        // The f32 products of every format, which a mixture falls back on.
        let mut kernels = vec!["matmul", "matmul_experts", "embed"];
        for n_tokens in [1, PRODUCT_TOKENS + 1] {
            kernels.extend(product(ty, n_tokens).kernels());
        }
        names.extend(kernels.iter().map(|k| format!("{k}_{name}")));
    }
    let integer = |ty| {
        [1, PRODUCT_TOKENS + 1]
            .iter()
            .any(|&n| product(ty, n).is_integer())
    };
    if WEIGHT_FORMATS.into_iter().any(integer) {
        names.push("quantize_q8".into());
    }
    names.sort();
    names.dedup();
    names
}

/// The kernel of `operation` (`"matmul"`, `"embed"`) for weights of `ty`: `matmul_q4_k`.
pub(crate) fn for_format(operation: &str, ty: GgmlType) -> String {
    format!("{operation}_{}", ty.name().to_lowercase())
}

/// Tokens a product's block takes (PRODUCT_TOKENS in the kernels).
pub const PRODUCT_TOKENS: usize = 8;

/// Weight rows a product's block takes, a warp each (the matmul kernels' ROWS).
pub(crate) const PRODUCT_ROWS: usize = 8;

/// Weight rows an integer product's block takes, a warp each (the matvec kernels' VEC_ROWS).
pub(crate) const INTEGER_PRODUCT_ROWS: usize = 4;

/// Weight rows and tokens of a tiled integer product's block (the tiles kernels' TILE_ROWS and
/// TILE_TOKENS), and its threads.
pub(crate) const TILE: usize = 64;
pub(crate) const TILE_THREADS: u32 = 256;

/// Weight rows and tokens of a tiled f32 product's block (the matmul_tiles kernels' TILE_ROWS
/// and TILE_TOKENS), and its threads.
pub(crate) const FLOAT_TILE_ROWS: usize = 64;
pub(crate) const FLOAT_TILE_TOKENS: usize = 32;
pub(crate) const FLOAT_TILE_THREADS: u32 = 128;

/// The kernels of a product of weights by a step's activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    /// `matmul_*`: f32 arithmetic over the decoded weights, a weight row a warp.
    Float,
    /// `matmul_tiles_*`: the same f32 products in tiles of 64 rows by 32 tokens, on the
    /// device's matrix units (Metal's simdgroup matrices).
    FloatTiles,
    /// `matvec_*`: the activations quantized to bytes, integer products a weight row a warp.
    Vector,
    /// `tiles_*`: the same integer products in tiles of 64 rows by 64 tokens.
    Tiles,
}

impl Product {
    /// Whether it takes the activations quantized to bytes.
    pub fn is_integer(self) -> bool {
        matches!(self, Product::Vector | Product::Tiles)
    }

    /// Its kernels' names, before the format's.
    pub fn kernels(self) -> [&'static str; 2] {
        match self {
            Product::Float => ["matmul", "matmul_experts"],
            Product::FloatTiles => ["matmul_tiles", "matmul_tiles_experts"],
            Product::Vector => ["matvec", "matvec_experts"],
            Product::Tiles => ["tiles", "tiles_experts"],
        }
    }

    /// Weight rows and tokens of one block, and its threads.
    pub(crate) fn block(self) -> (usize, usize, u32) {
        match self {
            Product::Float => (PRODUCT_ROWS, PRODUCT_TOKENS, 32 * PRODUCT_ROWS as u32),
            Product::FloatTiles => (FLOAT_TILE_ROWS, FLOAT_TILE_TOKENS, FLOAT_TILE_THREADS),
            Product::Vector => (
                INTEGER_PRODUCT_ROWS,
                PRODUCT_TOKENS,
                32 * INTEGER_PRODUCT_ROWS as u32,
            ),
            Product::Tiles => (TILE, TILE, TILE_THREADS),
        }
    }

    /// Whether its blocks take tokens along the grid's x and rows along y (the tiles, whose
    /// neighbouring blocks share their weights), rather than rows along x.
    pub(crate) fn tokens_along_x(self) -> bool {
        matches!(self, Product::FloatTiles | Product::Tiles)
    }
}

/// An expert's offset in the table of a launch of experts' products whose buffer does not
/// hold the expert (the experts kernels' NO_EXPERT): its tiles are another launch's.
pub(crate) const NO_EXPERT: u32 = u32::MAX;

/// The most experts a token may choose (the experts kernels' MAX_TOP_K).
pub(crate) const MAX_TOP_K: usize = 32;

/// Threads of a block drawing one row's token (the draw_rows kernels).
pub(crate) const DRAW_THREADS: u32 = 256;

/// Threads of an attention block (the attention kernels' TILE).
pub(crate) const ATTENTION_THREADS: u32 = 128;

/// A step's attention blocks (tokens × heads) that keep a GPU busy: with fewer, each
/// token's positions are split between blocks (flash decoding), whose partial softmaxes
/// `attention_merge` combines.
pub(crate) const ATTENTION_BLOCKS: usize = 256;

/// The positions a block of a split attention takes, about, by default: two tiles of 128.
pub const ATTENTION_SPAN: usize = 256;

/// The most blocks a token's positions are split between.
pub(crate) const MAX_ATTENTION_SPLITS: usize = 32;

/// The tiled attention kernels (`attention_tiles_<kv>_<dims>`) take heads of at most `dims`
/// dimensions, one of these.
pub const ATTENTION_TILE_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// How an API's tiled attention kernel for heads of some size cuts a step: blocks of `rows`
/// (token, query head) rows, `warp_rows` of them to a warp (SIMD-group) of 32 threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionTile {
    pub rows: usize,
    pub warp_rows: usize,
}

impl AttentionTile {
    /// Threads of a block.
    pub(crate) fn threads(self) -> u32 {
        (32 * self.rows / self.warp_rows) as u32
    }
}

/// A chunk of this many tokens or more (a prompt's) takes its attention in tiles; shorter
/// ones (decoding, drafts) a block per (token, head), so that a decoding sequence beside a
/// prompt keeps its split attention.
pub(crate) const ATTENTION_TILE_TOKENS: usize = 8;

/// The tiled attention kernel (its head size, and its tile as `tile` gives it for a head
/// size) for heads of `head_dim` dimensions, `group` query heads a KV head: none where the
/// API has none, the heads are larger than the largest kernel's or a KV head's group does
/// not fit in a block.
pub(crate) fn attention_tile(
    head_dim: usize,
    group: usize,
    tile: impl Fn(usize) -> Option<AttentionTile>,
) -> Option<(usize, AttentionTile)> {
    let dims = ATTENTION_TILE_HEAD_DIMS
        .into_iter()
        .find(|&d| head_dim <= d)?;
    Some((dims, tile(dims)?)).filter(|(_, tile)| group <= tile.rows)
}

/// How many blocks take each (token, head) of a step's attention, and how many positions
/// each takes: `n_blocks` (token, head) pairs over at most `visible` positions each, split
/// where there are fewer than [`ATTENTION_BLOCKS`] pairs into blocks of about `span`
/// positions (more where that would make more than [`MAX_ATTENTION_SPLITS`]).
pub(crate) fn attention_splits(n_blocks: usize, visible: usize, span: usize) -> (usize, usize) {
    if n_blocks >= ATTENTION_BLOCKS || visible <= span {
        return (1, visible.max(1));
    }
    let splits = visible.div_ceil(span).min(MAX_ATTENTION_SPLITS);
    (splits, visible.div_ceil(splits))
}

/// Threads of a block over one row of `width` values: whole warps, at most 256.
pub(crate) fn row_threads(width: usize) -> u32 {
    (width.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// Blocks of 256 threads over `n` values.
pub(crate) fn element_blocks(n: usize) -> u32 {
    n.div_ceil(256).max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_take_the_smallest_tiled_kernel_that_holds_them() {
        let tile = |dims| AttentionTile {
            rows: if dims <= 128 { 64 } else { 32 },
            warp_rows: 16,
        };
        let chosen = |head_dim, group| attention_tile(head_dim, group, |dims| Some(tile(dims)));
        assert_eq!(chosen(64, 4), Some((64, tile(64))));
        assert_eq!(chosen(80, 8), Some((128, tile(128))));
        assert_eq!(chosen(256, 32), Some((256, tile(256))));
        // Larger than the largest kernel's heads, or a group larger than a block's rows.
        assert_eq!(chosen(288, 1), None);
        assert_eq!(chosen(256, 33), None);
        assert_eq!(tile(256).threads(), 64);
        // An API without tiled attention.
        assert_eq!(attention_tile(64, 4, |_| None), None);
    }

    #[test]
    fn few_blocks_over_long_contexts_split_their_positions() {
        // Enough blocks, or contexts within one span: no split.
        assert_eq!(attention_splits(ATTENTION_BLOCKS, 4096, 256), (1, 4096));
        assert_eq!(attention_splits(32, 200, 256), (1, 200));
        assert_eq!(attention_splits(32, 0, 256), (1, 1));
        // One sequence of 32 heads at 4096 positions: 16 blocks of 256 each.
        assert_eq!(attention_splits(32, 4096, 256), (16, 256));
        assert_eq!(attention_splits(32, 4097, 256), (17, 241));
        // Past the most splits, longer spans; every position in one of them.
        for visible in [8192, 100_000, 1 << 20] {
            let (splits, span) = attention_splits(8, visible, 256);
            assert_eq!(splits, MAX_ATTENTION_SPLITS);
            assert!(splits * span >= visible && (splits - 1) * span < visible);
        }
    }
}
