//! GGML block formats: dequantization, activation quantization and quantized dot products.
//!
//! Weights stay in their GGUF block format (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q2_K..Q6_K). Activations are quantized once per step to the weights'
//! [`GgmlType::vec_dot_type`] (Q8_0, Q8_1 or Q8_K; F32 for float weights), and each output is
//! an integer dot product inside every block with one float multiply-add per block, as in
//! ggml. Every kernel has a scalar reference; SIMD versions (AVX2, AVX-512 with or without
//! VNNI, NEON) are chosen at run time for the running CPU, see [`Isa`].
//!
//! The same tree, one table per instruction set, holds the CPU's other inner loops: attention
//! over KV pages in f32, f16, bf16 or a block format ([`attention_kernels`]) and the gated
//! activations ([`activation_kernels`]).

mod acts;
mod aligned;
mod blocks;
mod error;
mod fp16;
mod kernels;
mod matmul;
mod packed;
mod reference;
mod sizes;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod types;

#[cfg(test)]
mod tests;

pub use acts::{ActsBuffer, ActsLen, QuantizedActs};
pub use aligned::AlignedBytes;
pub use blocks::codebook_words;
pub use error::QuantError;
pub use kernels::activations::ActivationKernels;
pub use kernels::attention::{
    AttentionKernels, KvBlock, RowsInPlace, IN_PLACE_PAGE, TILE_POSITIONS, WEIGHT_CUTOFF,
};
pub use kernels::exp::exp;
pub use kernels::{activation_kernels, attention_kernels, Isa, ISA_ENV};
pub use matmul::{matmul, matmul_with};
pub use packed::{PackedMatrix, Product, WeightSource, PACKED_FORMATS};
pub use types::GgmlType;

/// Dequantizes `src` (whole blocks of `ty`) into `dst`, which must hold exactly the elements
/// of `src`. Bit-identical to ggml's `dequantize_row_*` and to `gguf.quants.dequantize`; with
/// SIMD for Q8_0 and Q4_0 (the KV cache's formats) where the CPU has it.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let n = sizes::elements_in(ty, src.len(), "dequantize source")?;
    sizes::expect_len("dequantize destination elements", n, dst.len())?;
    match Isa::detected().kernels(ty).dequantize {
        Some(kernel) => kernel.call(src, dst),
        None => reference::dequantize::dequantize(ty, src, dst),
    }
    Ok(())
}

/// Quantizes one row of f32 values (whole blocks of `ty`) into `dst` (exactly their bytes),
/// rounding as ggml's `quantize_row_*_ref`. Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
/// Q5_1, Q8_0, Q8_1, Q8_K and the K-quants Q2_K to Q6_K (whose scale searches take about
/// 20 times Q4_0's time); the IQ, MXFP4 and ternary formats are not (their quantizers search
/// codebooks and belong to an offline tool).
pub fn quantize_row(ty: GgmlType, x: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let quantize = reference::quantize::quantizer(ty).ok_or(QuantError::Unsupported {
        op: "quantize_row",
        ty,
    })?;
    let bytes = sizes::row_bytes(ty, x.len(), "quantize_row input")?;
    sizes::expect_len("quantize_row destination bytes", bytes, dst.len())?;
    // The activation quantizers give the reference's bytes, faster where the CPU has SIMD.
    match Isa::detected().kernels(ty).quantize {
        Some(kernel) => kernel.call(x, dst),
        None => quantize(x, dst),
    }
    Ok(())
}

/// Dot product of one weight row `w` of type `ty` with one activation row `act` already
/// quantized to `ty.vec_dot_type()`; `n` is the number of elements of each. Uses the best
/// kernel for the running CPU.
pub fn vec_dot(ty: GgmlType, w: &[u8], act: &[u8], n: usize) -> Result<f32, QuantError> {
    let kernel = vec_dot_kernel(ty)?;
    sizes::expect_len(
        "weight row bytes",
        sizes::row_bytes(ty, n, "weight row")?,
        w.len(),
    )?;
    let act_bytes = sizes::row_bytes(ty.vec_dot_type(), n, "activation row")?;
    sizes::expect_len("activation row bytes", act_bytes, act.len())?;
    Ok(kernel.call(w, act))
}

fn vec_dot_kernel(ty: GgmlType) -> Result<kernels::VecDot, QuantError> {
    Isa::detected()
        .kernels(ty)
        .vec_dot
        .ok_or(QuantError::Unsupported { op: "vec_dot", ty })
}
