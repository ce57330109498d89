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

use tallow_quant::GgmlType;

/// Whether CUDA's kernels take products of `ty` weights in integers: the quantized formats,
/// as dp4a and int8 tensor cores multiply bytes faster than f32 (matvec.cu, tiles.cu).
pub fn integer_products(ty: GgmlType) -> bool {
    tallow_backend_gpu::is_quantized(ty)
}

/// The CUDA backend on an NVIDIA GPU.
#[cfg(feature = "driver")]
pub type CudaBackend = GpuBackend<Driver>;
