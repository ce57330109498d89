//! Activation quantization to Q8_0 and Q8_1 with AVX-512: the same bytes as the scalar
//! quantizers (`crate::reference::quantize`), 32 values per block in two vectors. A block
//! with a value that is not finite, or whose scale is not a normal number, goes through the
//! scalar quantizer, so every input gives exactly the reference's bytes.
//!
//! # Safety
//! Every function here needs AVX-512 F and BW; `crate::kernels::Isa::kernels` only hands them out
//! when the CPU has them.

use std::arch::x86_64::*;

/// The scale `d` and the 32 quants of a block, with their sum, as the scalar
/// `q8_symmetric` computes them; `None` where the block takes the scalar path.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q8_block(x: &[f32; 32]) -> Option<(f32, [i8; 32], i32)> {
    let halves = [
        _mm512_loadu_ps(x[..16].as_ptr()),
        _mm512_loadu_ps(x[16..].as_ptr()),
    ];
    let finite = |v: __m512| {
        // Not finite: all exponent bits set.
        let exponent = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7f80_0000));
        _mm512_cmpneq_epi32_mask(exponent, _mm512_set1_epi32(0x7f80_0000)) == 0xffff
    };
    if !finite(halves[0]) || !finite(halves[1]) {
        return None;
    }
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(
        _mm512_abs_ps(halves[0]),
        _mm512_abs_ps(halves[1]),
    ));
    let d = amax / 127.0;
    if !d.is_normal() {
        return None;
    }
    let id = _mm512_set1_ps(1.0 / d);
    let mut qs = [0i8; 32];
    let mut sum = _mm512_setzero_si512();
    for (h, half) in halves.into_iter().enumerate() {
        // round_half_away: the integer part of |v|, plus one if the rest is at least 1/2.
        let v = _mm512_mul_ps(half, id);
        let a = _mm512_abs_ps(v);
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a);
        let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_sub_ps(a, t), _mm512_set1_ps(0.5));
        let r = _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0));
        let r = _mm512_cvttps_epi32(r);
        let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, _mm512_setzero_ps());
        let r = _mm512_mask_sub_epi32(r, negative, _mm512_setzero_si512(), r);
        sum = _mm512_add_epi32(sum, r);
        let bytes = _mm512_cvtsepi32_epi8(r);
        _mm_storeu_si128(qs[16 * h..].as_mut_ptr().cast(), bytes);
    }
    Some((d, qs, _mm512_reduce_add_epi32(sum)))
}

q8_row_quantizers!("avx512f,avx512bw");
