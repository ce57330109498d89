//! The kernels' launch shapes: what the host code and every API's kernels agree on, and the
//! kernel of each operation and weight format.

use tallow_quant::GgmlType;

use crate::WEIGHT_FORMATS;

/// Every kernel the backend may launch, by name, on a device whose products of a format are
/// in integers where `integer` says so (`Gpu::integer_products`): what an API's kernels
/// must define.
pub fn names(integer: impl Fn(GgmlType) -> bool) -> Vec<String> {
    let fixed = [
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
        "argmax_rows",
    ];
    let fixed = fixed.into_iter().map(String::from);
    let per_kv = ["f16", "q8_0"]
        .into_iter()
        .flat_map(|t| [format!("kv_write_{t}"), format!("attention_{t}")]);
    let per_format = WEIGHT_FORMATS.iter().flat_map(|ty| {
        let name = ty.name().to_lowercase();
        [
            format!("matmul_{name}"),
            format!("matmul_experts_{name}"),
            format!("embed_{name}"),
        ]
    });
    let integer: Vec<GgmlType> = WEIGHT_FORMATS
        .into_iter()
        .filter(|&ty| integer(ty))
        .collect();
    let quantize = (!integer.is_empty()).then(|| "quantize_q8".to_string());
    let per_integer = integer.into_iter().flat_map(|ty| {
        let name = ty.name().to_lowercase();
        [
            format!("matvec_{name}"),
            format!("matvec_experts_{name}"),
            format!("tiles_{name}"),
            format!("tiles_experts_{name}"),
        ]
    });
    (fixed
        .chain(quantize)
        .chain(per_kv)
        .chain(per_format)
        .chain(per_integer))
    .collect()
}

/// The kernel of `operation` (`"matmul"`, `"embed"`) for weights of `ty`: `matmul_q4_k`.
pub(crate) fn for_format(operation: &str, ty: GgmlType) -> String {
    format!("{operation}_{}", ty.name().to_lowercase())
}

/// Tokens a product's block takes (PRODUCT_TOKENS in the kernels).
pub(crate) const PRODUCT_TOKENS: usize = 8;

/// Weight rows a product's block takes, a warp each (the matmul kernels' ROWS).
pub(crate) const PRODUCT_ROWS: usize = 8;

/// Weight rows an integer product's block takes, a warp each (the matvec kernels' VEC_ROWS).
pub(crate) const INTEGER_PRODUCT_ROWS: usize = 4;

/// Weight rows and tokens of a tiled integer product's block (the tiles kernels' TILE_ROWS and
/// TILE_TOKENS), and its threads.
pub(crate) const TILE: usize = 64;
pub(crate) const TILE_THREADS: u32 = 256;

/// The kernels of a product of weights by a step's activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    /// `matmul_*`: f32 arithmetic over the decoded weights.
    Float,
    /// `matvec_*`: the activations quantized to bytes, integer products a weight row a warp.
    Vector,
    /// `tiles_*`: the same integer products in tiles of 64 rows by 64 tokens.
    Tiles,
}

impl Product {
    /// How products run in a step of `n_tokens` tokens: where they are `integer`, vectors
    /// for up to one block's tokens (decode, where a product streams its weights once) and
    /// tiles for more; otherwise in f32.
    pub fn of(integer: bool, n_tokens: usize) -> Product {
        if !integer {
            Product::Float
        } else if n_tokens <= PRODUCT_TOKENS {
            Product::Vector
        } else {
            Product::Tiles
        }
    }
}

/// The most experts a token may choose (the experts kernels' MAX_TOP_K).
pub(crate) const MAX_TOP_K: usize = 32;

/// Threads of an attention block (the attention kernels' TILE).
pub(crate) const ATTENTION_THREADS: u32 = 128;

/// Threads of a block over one row of `width` values: whole warps, at most 256.
pub(crate) fn row_threads(width: usize) -> u32 {
    (width.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// Blocks of 256 threads over `n` values.
pub(crate) fn element_blocks(n: usize) -> u32 {
    n.div_ceil(256).max(1) as u32
}
