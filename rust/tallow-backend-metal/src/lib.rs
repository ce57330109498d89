//! The Metal backend: tallow-backend-gpu's host code on an Apple GPU (on macOS), its kernels
//! the Metal Shading Language sources of `kernels-metal/` (with the formats they share with
//! CUDA's kernels, `kernels-gpu/formats.h`), compiled from source when a device is first
//! opened. tallow-gpu-emulation runs the same kernels on the CPU for the tests.

#[cfg(all(target_os = "macos", feature = "device"))]
mod device;
mod sources;

#[cfg(all(target_os = "macos", feature = "device"))]
pub use device::{devices, Metal};
pub use sources::{library_source, SOURCES};

/// The Metal backend on an Apple GPU.
#[cfg(all(target_os = "macos", feature = "device"))]
pub type MetalBackend = tallow_backend_gpu::GpuBackend<Metal>;

use tallow_backend_gpu::{AttentionTile, Product, PRODUCT_TOKENS};
use tallow_quant::GgmlType;

/// The kernels Metal takes a product of `ty` weights by `n_tokens` tokens with: f32 products
/// over the weights decoded where they are read, as Apple GPUs have no byte dot products;
/// a SIMD-group a weight row for up to a block's tokens (decode, where a product streams its
/// weights once: matmul.metal), simdgroup-matrix tiles for more (tiles.metal).
pub fn product(_ty: GgmlType, n_tokens: usize) -> Product {
    match n_tokens <= PRODUCT_TOKENS {
        true => Product::Float,
        false => Product::FloatTiles,
    }
}

/// How attention.metal's tiled attention for heads of at most `head_dims` dimensions cuts a
/// step (its AttentionShape<D>): 8 rows a SIMD-group (a SIMD-group matrix's), 32 rows a
/// threadgroup, 16 for heads of 256 (whose f32 queries fill half the threadgroup memory).
pub fn attention_tile(head_dims: usize) -> AttentionTile {
    AttentionTile {
        rows: if head_dims <= 128 { 32 } else { 16 },
        warp_rows: 8,
    }
}
