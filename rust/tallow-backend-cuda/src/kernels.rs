//! The kernels' sources, and the kernel of each operation and weight format.

use tallow_quant::GgmlType;

/// Every source of `kernels-cuda/` (name, text): what NVRTC compiles for a device, headers
/// included.
pub const SOURCES: [(&str, &str); 12] = [
    (
        "tallow.cuh",
        include_str!("../../../kernels-cuda/tallow.cuh"),
    ),
    (
        "formats.cuh",
        include_str!("../../../kernels-cuda/formats.cuh"),
    ),
    (
        "attention.cu",
        include_str!("../../../kernels-cuda/attention.cu"),
    ),
    ("embed.cu", include_str!("../../../kernels-cuda/embed.cu")),
    (
        "experts.cu",
        include_str!("../../../kernels-cuda/experts.cu"),
    ),
    ("kv.cu", include_str!("../../../kernels-cuda/kv.cu")),
    ("logits.cu", include_str!("../../../kernels-cuda/logits.cu")),
    ("matmul.cu", include_str!("../../../kernels-cuda/matmul.cu")),
    ("matvec.cu", include_str!("../../../kernels-cuda/matvec.cu")),
    ("rope.cu", include_str!("../../../kernels-cuda/rope.cu")),
    ("rows.cu", include_str!("../../../kernels-cuda/rows.cu")),
    ("tiles.cu", include_str!("../../../kernels-cuda/tiles.cu")),
];

/// The kernel of `operation` (`"matmul"`, `"embed"`) for weights of `ty`: `matmul_q4_k`.
pub(crate) fn for_format(operation: &str, ty: GgmlType) -> String {
    format!("{operation}_{}", ty.name().to_lowercase())
}

/// Tokens a product's block takes (tallow.cuh's PRODUCT_TOKENS).
pub(crate) const PRODUCT_TOKENS: usize = 8;

/// Weight rows a product's block takes, a warp each (matmul.cu's ROWS).
pub(crate) const PRODUCT_ROWS: usize = 8;

/// Weight rows an integer product's block takes, a warp each (matvec.cu's VEC_ROWS).
pub(crate) const INTEGER_PRODUCT_ROWS: usize = 4;

/// Weight rows and tokens of a tiled integer product's block (tiles.cu's TILE_ROWS and
/// TILE_TOKENS), and its threads.
pub(crate) const TILE: usize = 64;
pub(crate) const TILE_THREADS: u32 = 256;

/// The kernels of a product of weights by a step's activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Product {
    /// matmul.cu: f32 arithmetic over the decoded weights.
    Float,
    /// matvec.cu: the activations quantized to bytes, `dp4a` products a weight row a warp.
    Vector,
    /// tiles.cu: the same integer products in tiles of 64 rows by 64 tokens.
    Tiles,
}

impl Product {
    /// How products of `ty` weights run in a step of `n_tokens` tokens: the quantized formats
    /// take the integer kernels, vectors for up to one block's tokens (decode, where a product
    /// streams its weights once) and tiles for more; the float formats take f32 arithmetic.
    pub(crate) fn of(ty: GgmlType, n_tokens: usize) -> Product {
        if !crate::is_quantized(ty) {
            Product::Float
        } else if n_tokens <= PRODUCT_TOKENS {
            Product::Vector
        } else {
            Product::Tiles
        }
    }
}

/// The most experts a token may choose (experts.cu's MAX_TOP_K).
pub(crate) const MAX_TOP_K: usize = 32;

/// Threads of an attention block (attention.cu's TILE).
pub(crate) const ATTENTION_THREADS: u32 = 128;

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
    use super::SOURCES;

    #[test]
    fn every_source_of_the_kernels_directory_is_built_in() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels-cuda");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".cu") || name.ends_with(".cuh"))
            .collect();
        on_disk.sort();
        let mut built_in: Vec<String> = SOURCES.iter().map(|(n, _)| n.to_string()).collect();
        built_in.sort();
        assert_eq!(built_in, on_disk);
    }
}
