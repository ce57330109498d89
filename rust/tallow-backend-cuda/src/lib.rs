//! The CUDA backend: tallow-backend-gpu's host code on an NVIDIA GPU through the driver
//! (the `driver` feature), its kernels the `.cu` sources of `kernels-cuda/`, compiled by NVRTC
//! for the device's exact architecture. tallow-gpu-emulation runs the same kernels on the CPU
//! for the tests.

#[cfg(feature = "driver")]
mod driver;
#[cfg(feature = "driver")]
mod nvrtc;
mod sources;

#[cfg(feature = "driver")]
pub use driver::{cubins, devices, kernel_usage, Driver, KernelUsage};
pub use sources::SOURCES;
pub use tallow_backend_gpu::GpuBackend;

use tallow_backend_gpu::{is_quantized, AttentionTile, Product, PRODUCT_TOKENS};
use tallow_quant::GgmlType;

/// The kernels CUDA takes a product of `ty` weights by `n_tokens` tokens with: for the
/// quantized formats integer products, as dp4a and int8 tensor cores multiply bytes faster
/// than f32 (matvec.cu for up to a block's tokens, where a product streams its weights once,
/// and tiles.cu's tensor-core tiles for more); f32 products for the float formats.
pub fn product(ty: GgmlType, n_tokens: usize) -> Product {
    match (is_quantized(ty), n_tokens <= PRODUCT_TOKENS) {
        (false, _) => Product::Float,
        (true, true) => Product::Vector,
        (true, false) => Product::Tiles,
    }
}

/// How attention.cu's tiled attention for heads of at most `head_dims` dimensions cuts a step
/// (its AttentionShape<D>): 16 rows a warp (an mma's), 64 rows a block, 32 for heads of 256 (whose
/// queries fill the shared memory).
pub fn attention_tile(head_dims: usize) -> AttentionTile {
    AttentionTile {
        rows: if head_dims <= 128 { 64 } else { 32 },
        warp_rows: 16,
    }
}

/// The CUDA backend on an NVIDIA GPU.
#[cfg(feature = "driver")]
pub type CudaBackend = GpuBackend<Driver>;
