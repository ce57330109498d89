//! Activation quantization to Q8_0, Q8_1 and Q8_K with AVX-512: the same bytes as the scalar
//! quantizers (`crate::reference::quantize`). Q8_0 and Q8_1: 32 values per block in two
//! vectors, sixteen blocks at a time: each block's largest magnitude and quant sum are reduced across the
//! sixteen blocks' vectors at once (three instructions a block, where one block's reduction
//! took eight), and their scales divided and converted to f16 in one vector. A block with a
//! value that is not finite, or whose scale is not a normal number, goes through the scalar
//! quantizer, so every input gives exactly the reference's bytes. Q8_K: a block of 256
//! values is sixteen vectors, one per group of its sums, which are taken at once.
//!
//! # Safety
//! Every function here needs AVX-512 F and BW; `crate::kernels::Isa::kernels` only hands them out
//! when the CPU has them.

use std::arch::x86_64::*;

use crate::blocks::BlockQ8K;
use crate::kernels::x86::Q8Group;

/// Blocks a row quantizer takes at a time.
const GROUP: usize = 16;

/// `half` (16 values of a block) times `id`, rounded half away from zero, as i32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn round_scaled(half: __m512, id: __m512) -> __m512i {
    // round_half_away: the integer part of |v|, plus one if the rest is at least 1/2.
    let v = _mm512_mul_ps(half, id);
    let a = _mm512_abs_ps(v);
    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a);
    let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_sub_ps(a, t), _mm512_set1_ps(0.5));
    let r = _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0));
    let r = _mm512_cvttps_epi32(r);
    let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, _mm512_setzero_ps());
    _mm512_mask_sub_epi32(r, negative, _mm512_setzero_si512(), r)
}

/// The i32 quants of a block (two vectors) as its 32 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn to_bytes(q: [__m512i; 2], out: &mut [i8; 32]) {
    _mm_storeu_si128(out[..16].as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(q[0]));
    _mm_storeu_si128(out[16..].as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(q[1]));
}

/// Lane `b` of the result: the maximum (`MAX`, of values read as unsigned) or the sum of the
/// 16 lanes of `v[b]`. Four rounds each halve the vectors, pairing their lanes with a
/// shuffle (the 128-bit quarters, then within them), so that the last vector holds block
/// `b` in lane `4 * (b % 4) + b / 4`, which one permutation puts back in order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn across<const MAX: bool>(v: [__m512i; 16]) -> __m512i {
    #[inline(always)]
    unsafe fn op<const MAX: bool>(a: __m512i, b: __m512i) -> __m512i {
        if MAX {
            _mm512_max_epu32(a, b)
        } else {
            _mm512_add_epi32(a, b)
        }
    }
    // Quarters 0-1 of block 2k and 2-3 of block 2k + 1, each holding 8 partials.
    let w: [__m512i; 8] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        op::<MAX>(
            _mm512_shuffle_i32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_i32x4::<0b11_10_11_10>(a, b),
        )
    });
    // Quarter j of u[k]: 4 partials of block 4k + j.
    let u: [__m512i; 4] = std::array::from_fn(|k| {
        let (a, b) = (w[2 * k], w[2 * k + 1]);
        op::<MAX>(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(a, b),
        )
    });
    // Quarter j of z[k]: 2 partials of block 8k + j, then 2 of block 8k + 4 + j.
    let z: [__m512i; 2] = std::array::from_fn(|k| {
        let (a, b) = (u[2 * k], u[2 * k + 1]);
        op::<MAX>(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
    });
    // Quarter j: blocks j, j + 4, 8 + j and 12 + j.
    let (a, b) = (_mm512_castsi512_ps(z[0]), _mm512_castsi512_ps(z[1]));
    let r = op::<MAX>(
        _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(a, b)),
        _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(a, b)),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_epi32(order, r)
}

/// Sixteen Q8_0/Q8_1 blocks of `x`, as the scalar `q8_symmetric` quantizes each.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn q8_group(x: &[f32; 32 * GROUP]) -> Q8Group<GROUP> {
    let blocks = x.as_chunks::<32>().0;
    let halves = |b: usize| {
        [
            _mm512_loadu_ps(blocks[b][..16].as_ptr()),
            _mm512_loadu_ps(blocks[b][16..].as_ptr()),
        ]
    };
    // Magnitudes compared as unsigned integers order as floats do, and put infinities and
    // NaN (all exponent bits set) above every finite value.
    let abs_bits = |v: __m512| _mm512_castps_si512(_mm512_abs_ps(v));
    let amax = _mm512_castsi512_ps(across::<true>(std::array::from_fn(|b| {
        let [lo, hi] = halves(b);
        _mm512_max_epu32(abs_bits(lo), abs_bits(hi))
    })));
    let finite = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(amax, _mm512_set1_ps(f32::INFINITY));
    let d = _mm512_div_ps(amax, _mm512_set1_ps(127.0));
    let normal = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(d, _mm512_set1_ps(f32::MIN_POSITIVE));
    let mut id = [0f32; GROUP];
    _mm512_storeu_ps(id.as_mut_ptr(), _mm512_div_ps(_mm512_set1_ps(1.0), d));
    let mut qs = [[0i8; 32]; GROUP];
    let sums = across::<false>(std::array::from_fn(|b| {
        let id = _mm512_set1_ps(id[b]);
        let q = halves(b).map(|h| round_scaled(h, id));
        to_bytes(q, &mut qs[b]);
        _mm512_add_epi32(q[0], q[1])
    }));
    let s = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), d);
    let mut bits = [[0u16; GROUP]; 2];
    for (bits, v) in bits.iter_mut().zip([d, s]) {
        let halves = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm256_storeu_si256(bits.as_mut_ptr().cast(), halves);
    }
    let [d, s] = bits;
    Q8Group {
        d,
        s,
        qs,
        fast: u32::from(finite & normal),
    }
}

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
    let q = halves.map(|h| round_scaled(h, id));
    let mut qs = [0i8; 32];
    to_bytes(q, &mut qs);
    Some((d, qs, _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]))))
}

q8_row_quantizers!("avx512f,avx512bw,f16c");

/// One Q8_K block as the scalar `q8_k` makes it (scale `-127 / max` of the value of largest
/// magnitude, the first one where several have it; halves to even); `false` where the block
/// takes the scalar path (a value not finite, all zeros, a scale that overflows).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q8_k_block(x: &[f32; 256], b: &mut BlockQ8K) -> bool {
    let v: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(x[16 * i..].as_ptr()));
    // Magnitudes compared as unsigned integers order as floats do, and put infinities and
    // NaN (all exponent bits set) above every finite value.
    let magnitudes = v.map(|v| _mm512_castps_si512(_mm512_abs_ps(v)));
    let largest = (magnitudes[1..].iter()).fold(magnitudes[0], |m, &a| _mm512_max_epu32(m, a));
    let amax = _mm512_reduce_max_epu32(largest);
    if amax == 0 || amax >= 0x7f80_0000 {
        return false;
    }
    let of_amax = |m: __m512i| _mm512_cmpeq_epi32_mask(m, _mm512_set1_epi32(amax as i32));
    let Some(at) = magnitudes.iter().position(|&m| of_amax(m) != 0) else {
        return false;
    };
    let max = x[16 * at + of_amax(magnitudes[at]).trailing_zeros() as usize];
    let iscale = -127.0 / max;
    if !iscale.is_finite() {
        return false;
    }
    let (scale, top) = (_mm512_set1_ps(iscale), _mm512_set1_epi32(127));
    // Round to nearest, halves to even: what ggml's `nearest_int` does for |v| <= 2^22.
    let q = v.map(|v| {
        let r = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(scale, v),
        );
        _mm512_min_epi32(r, top)
    });
    for (q, out) in q.iter().zip(b.qs.as_chunks_mut::<16>().0) {
        _mm_storeu_si128(out.as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(*q));
    }
    // Each group of 16 quants (a vector) sums into its i16 `bsums` entry.
    let sums = _mm512_cvtepi32_epi16(across::<false>(q));
    _mm256_storeu_si256(b.bsums.as_mut_ptr().cast(), sums);
    b.d = (1.0 / iscale).to_le_bytes();
    true
}
