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

use tallow_quant::GgmlType;

/// Whether Metal's kernels take products of `ty` weights in integers: never, as Apple GPUs
/// have no byte dot products and multiply f32 (and f16) at full rate; weights are decoded to
/// f32 where they are read.
pub fn integer_products(_ty: GgmlType) -> bool {
    false
}
