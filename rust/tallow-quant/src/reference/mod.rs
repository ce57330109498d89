//! Scalar reference implementations. They define what every format means; the SIMD kernels
//! are tested against them, and they serve the formats and CPUs that have no SIMD kernel.

pub(crate) mod decode;
pub(crate) mod dequantize;
pub(crate) mod quantize;
mod quantize_iq4;
mod quantize_k;
pub(crate) mod vec_dot;
