//! Dequantization of Q8_0 and Q4_0 rows with AVX2: eight values per vector, the same bits as
//! the scalar reference (`crate::reference::dequantize`): each value is one product of a small
//! integer and the block's scale, exact in f32 either way. KV pages in these formats are read
//! through them, a tile of positions at a time.
//!
//! # Safety
//! Every function here needs AVX2 and F16C; `crate::kernels::Isa::kernels` only hands them out when the
//! CPU has them. `dst` holds exactly the elements of `src`'s whole blocks.

use std::arch::x86_64::*;

use super::fp16;
use crate::blocks::{as_blocks, BlockQ4_0, BlockQ8_0};

/// Eight signed bytes (the low 64 bits of `bytes`) times `d`, stored at `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_scaled(bytes: __m128i, d: __m256, out: &mut [f32; 8]) {
    let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(v, d));
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ8_0>(src)
        .iter()
        .zip(dst.as_chunks_mut::<32>().0)
    {
        let d = _mm256_set1_ps(fp16(b.d));
        let (halves, _) = b.qs.as_chunks::<16>();
        let (outs, _) = out.as_chunks_mut::<8>();
        for (h, q) in halves.iter().enumerate() {
            let q = _mm_loadu_si128(q.as_ptr().cast());
            store_scaled(q, d, &mut outs[2 * h]);
            store_scaled(_mm_unpackhi_epi64(q, q), d, &mut outs[2 * h + 1]);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_0(src: &[u8], dst: &mut [f32]) {
    let (mask, eight) = (_mm_set1_epi8(0x0f), _mm_set1_epi8(8));
    for (b, out) in as_blocks::<BlockQ4_0>(src)
        .iter()
        .zip(dst.as_chunks_mut::<32>().0)
    {
        let d = _mm256_set1_ps(fp16(b.d));
        let q = _mm_loadu_si128(b.qs.as_ptr().cast());
        // Elements 0..16 are the low nibbles, 16..32 the high ones, each minus 8.
        let low = _mm_sub_epi8(_mm_and_si128(q, mask), eight);
        let high = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(q), mask), eight);
        let (outs, _) = out.as_chunks_mut::<8>();
        store_scaled(low, d, &mut outs[0]);
        store_scaled(_mm_unpackhi_epi64(low, low), d, &mut outs[1]);
        store_scaled(high, d, &mut outs[2]);
        store_scaled(_mm_unpackhi_epi64(high, high), d, &mut outs[3]);
    }
}
