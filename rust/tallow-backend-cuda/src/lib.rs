//! The CUDA backend: tallow-backend-gpu's host code on an NVIDIA GPU through the driver
//! (the `driver` feature), its kernels the `.cu` sources of `kernels-cuda/`, compiled by NVRTC
//! for the device's exact architecture. tallow-gpu-emulation runs the same kernels on the CPU
//! for the tests.

#[cfg(feature = "driver")]
mod driver;
#[cfg(feature = "driver")]
mod graph;
#[cfg(feature = "driver")]
mod nvrtc;
mod sources;

#[cfg(feature = "driver")]
pub use driver::{cubins, devices, kernel_usage, Driver, KernelUsage};
#[cfg(feature = "driver")]
pub use graph::CudaGraph;
pub use sources::SOURCES;
pub use tallow_backend_gpu::{GpuBackend, Replayed};

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

/// The CUDA backend on an NVIDIA GPU, its steps' runs of launches replayed as CUDA graphs.
#[cfg(feature = "driver")]
pub type CudaBackend = GpuBackend<Replayed<Driver>>;

/// The CUDA backend on device `ordinal`. Its steps run as CUDA graphs unless
/// `TALLOW_CUDA_GRAPHS=0`, which launches every kernel as it comes.
#[cfg(feature = "driver")]
pub fn open(ordinal: usize) -> Result<CudaBackend, tallow_backend::BackendError> {
    let driver = Driver::open(ordinal)?;
    let graphs = std::env::var("TALLOW_CUDA_GRAPHS").map_or(true, |v| v != "0");
    Ok(GpuBackend::new(match graphs {
        true => Replayed::new(driver),
        false => Replayed::direct(driver),
    }))
}
