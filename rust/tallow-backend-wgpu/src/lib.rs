//! The wgpu backend: NVIDIA, AMD and Intel GPUs through Vulkan, Apple GPUs through Metal,
//! Windows through DX12, and Mesa's software rasterizer (llvmpipe) where there is no GPU.
//! It is tallow-backend-gpu's host code on a [`Wgpu`] device: weights in their GGUF block
//! formats, KV pages and every step's operations as on CUDA and Metal, each operation a WGSL
//! kernel (the repository's `kernels-wgsl/`) taking the same arguments as theirs.

mod codebooks;
mod device;
mod gpu;
mod kernels;

pub use device::{devices, open, open_with, WgpuOptions};
pub use gpu::Wgpu;

/// The backend on a GPU through wgpu.
pub type WgpuBackend = tallow_backend_gpu::GpuBackend<Wgpu>;
