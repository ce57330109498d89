//! Activation quantization to Q8_0, Q8_1 and Q8_K with AVX2: the same bytes as the scalar
//! quantizers (`crate::reference::quantize`), eight values per vector; Q8_0 and Q8_1 eight
//! blocks at a time, their largest magnitudes and quant sums reduced across the blocks'
//! vectors at once and their scales divided and converted to f16 in one vector. A block with
//! a value that is not finite, or (Q8_0/Q8_1) whose scale is not a normal number, goes
//! through the scalar quantizer, so every input gives exactly the reference's bytes.
//!
//! # Safety
//! Every function here needs AVX2, FMA and F16C; `crate::kernels::Isa::kernels` only hands
//! them out when the CPU has them.

use std::arch::x86_64::*;

use crate::blocks::BlockQ8K;
use crate::kernels::x86::Q8Group;

/// The eight vectors of `N` values.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load<const N: usize, const V: usize>(x: &[f32; N]) -> [__m256; V] {
    let mut v = [_mm256_setzero_ps(); V];
    for (v, c) in v.iter_mut().zip(x.as_chunks::<8>().0) {
        *v = _mm256_loadu_ps(c.as_ptr());
    }
    v
}

/// |v| in each lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn abs(v: __m256) -> __m256 {
    _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)))
}

/// Whether every value is finite (its exponent bits are not all set).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn all_finite(v: &[__m256]) -> bool {
    let exponent = _mm256_set1_epi32(0x7f80_0000);
    let mut bad = _mm256_setzero_si256();
    for &v in v {
        let e = _mm256_and_si256(_mm256_castps_si256(v), exponent);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exponent));
    }
    _mm256_testz_si256(bad, bad) == 1
}

/// The largest |v| of the vectors.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn abs_max(v: &[__m256]) -> f32 {
    let mut m = _mm256_setzero_ps();
    for &v in v {
        m = _mm256_max_ps(m, abs(v));
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    _mm_cvtss_f32(m)
}

/// The sum of the eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Four vectors of i32 quants (within -128..=127) as 32 bytes, in order.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn to_bytes(q: [__m256i; 4], out: &mut [i8; 32]) {
    // The packs work within each 128-bit half; the permutation puts the four-byte groups back
    // in order.
    let words = [
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    ];
    let bytes = _mm256_packs_epi16(words[0], words[1]);
    let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(out.as_mut_ptr().cast(), ordered);
}

/// Blocks a row quantizer takes at a time.
const GROUP: usize = 8;

/// `v` (8 values of a block) times `id`, rounded half away from zero, as i32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn round_scaled(v: __m256, id: __m256) -> __m256i {
    // round_half_away: the integer part of |v|, plus one if the rest is at least 1/2, with
    // v's sign.
    let v = _mm256_mul_ps(v, id);
    let a = abs(v);
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a);
    let up = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5));
    let r = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_set1_ps(1.0)));
    // `sign` negates where v's bits read as a negative integer (v < 0, or -0 whose quant is
    // 0 anyway) and zeroes where they read as 0 (v = +0, quant 0 too).
    _mm256_sign_epi32(_mm256_cvttps_epi32(r), _mm256_castps_si256(v))
}

/// Lane `b` of the result: the maximum (`MAX`, of values read as unsigned) or the sum of the
/// 8 lanes of `v[b]`. Three rounds each halve the vectors, pairing their lanes with a
/// shuffle (the 128-bit halves, then within them), so that the last vector holds the even
/// blocks in its low half and the odd ones in its high half, which one permutation puts back
/// in order.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn across<const MAX: bool>(v: [__m256i; 8]) -> __m256i {
    #[inline(always)]
    unsafe fn op<const MAX: bool>(a: __m256i, b: __m256i) -> __m256i {
        if MAX {
            _mm256_max_epu32(a, b)
        } else {
            _mm256_add_epi32(a, b)
        }
    }
    // Half 0 of w[k]: 4 partials of block 2k, half 1: of block 2k + 1.
    let w: [__m256i; 4] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        op::<MAX>(
            _mm256_permute2x128_si256::<0x20>(a, b),
            _mm256_permute2x128_si256::<0x31>(a, b),
        )
    });
    // Half h of u[k]: 2 partials of block 4k + h, then 2 of block 4k + 2 + h.
    let u: [__m256i; 2] = std::array::from_fn(|k| {
        let (a, b) = (w[2 * k], w[2 * k + 1]);
        op::<MAX>(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b))
    });
    // Half h: blocks h, 2 + h, 4 + h and 6 + h.
    let (a, b) = (_mm256_castsi256_ps(u[0]), _mm256_castsi256_ps(u[1]));
    let r = op::<MAX>(
        _mm256_castps_si256(_mm256_shuffle_ps::<0b10_00_10_00>(a, b)),
        _mm256_castps_si256(_mm256_shuffle_ps::<0b11_01_11_01>(a, b)),
    );
    _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Eight Q8_0/Q8_1 blocks of `x`, as the scalar `q8_symmetric` quantizes each.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_group(x: &[f32; 32 * GROUP]) -> Q8Group<GROUP> {
    let blocks = x.as_chunks::<32>().0;
    // Magnitudes compared as unsigned integers order as floats do, and put infinities and
    // NaN (all exponent bits set) above every finite value.
    let abs_bits = |v: __m256| _mm256_castps_si256(abs(v));
    let amax = _mm256_castsi256_ps(across::<true>(std::array::from_fn(|b| {
        let v: [__m256; 4] = load(&blocks[b]);
        let m = [
            _mm256_max_epu32(abs_bits(v[0]), abs_bits(v[1])),
            _mm256_max_epu32(abs_bits(v[2]), abs_bits(v[3])),
        ];
        _mm256_max_epu32(m[0], m[1])
    })));
    let finite = _mm256_cmp_ps::<_CMP_LT_OQ>(amax, _mm256_set1_ps(f32::INFINITY));
    let d = _mm256_div_ps(amax, _mm256_set1_ps(127.0));
    let normal = _mm256_cmp_ps::<_CMP_GE_OQ>(d, _mm256_set1_ps(f32::MIN_POSITIVE));
    let mut id = [0f32; GROUP];
    _mm256_storeu_ps(id.as_mut_ptr(), _mm256_div_ps(_mm256_set1_ps(1.0), d));
    let mut qs = [[0i8; 32]; GROUP];
    let sums = across::<false>(std::array::from_fn(|b| {
        let id = _mm256_set1_ps(id[b]);
        let v: [__m256; 4] = load(&blocks[b]);
        let q = v.map(|v| round_scaled(v, id));
        to_bytes(q, &mut qs[b]);
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]))
    }));
    let s = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), d);
    let mut bits = [[0u16; GROUP]; 2];
    for (bits, v) in bits.iter_mut().zip([d, s]) {
        let halves = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm_storeu_si128(bits.as_mut_ptr().cast(), halves);
    }
    let [d, s] = bits;
    Q8Group {
        d,
        s,
        qs,
        fast: _mm256_movemask_ps(_mm256_and_ps(finite, normal)) as u32,
    }
}

/// The scale `d`, the 32 quants and their sum of a Q8_0/Q8_1 block, as the scalar
/// `q8_symmetric` computes them (rounding halves away from zero); `None` where the block
/// takes the scalar path.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_block(x: &[f32; 32]) -> Option<(f32, [i8; 32], i32)> {
    let v: [__m256; 4] = load(x);
    if !all_finite(&v) {
        return None;
    }
    let d = abs_max(&v) / 127.0;
    if !d.is_normal() {
        return None;
    }
    let id = _mm256_set1_ps(1.0 / d);
    let q = v.map(|v| round_scaled(v, id));
    let mut qs = [0i8; 32];
    to_bytes(q, &mut qs);
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    Some((d, qs, sum_i32(sum)))
}

q8_row_quantizers!("avx2,fma,f16c");

/// Vector `i` of a Q8_K block: its values `8i..8i + 8`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn eight(x: &[f32; 256], i: usize) -> __m256 {
    _mm256_loadu_ps(x[8 * i..8 * i + 8].as_ptr())
}

/// One Q8_K block as the scalar `q8_k` makes it (scale `-127 / max` of the value of largest
/// magnitude, the first one where several have it; halves to even); `false` where the block
/// takes the scalar path. Its 32 vectors are loaded where they are used, again from the L1
/// cache: held as an array, they went through memory by `memcpy`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_k_block(x: &[f32; 256], b: &mut BlockQ8K) -> bool {
    let exponent = _mm256_set1_epi32(0x7f80_0000);
    let (mut bad, mut largest) = (_mm256_setzero_si256(), _mm256_setzero_ps());
    for i in 0..32 {
        let v = eight(x, i);
        let e = _mm256_and_si256(_mm256_castps_si256(v), exponent);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exponent));
        largest = _mm256_max_ps(largest, abs(v));
    }
    if _mm256_testz_si256(bad, bad) != 1 {
        return false;
    }
    let amax = abs_max(&[largest]);
    if amax == 0.0 {
        return false;
    }
    let of_amax =
        |v: __m256| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs(v), _mm256_set1_ps(amax)));
    let first = (0..32)
        .find(|&i| of_amax(eight(x, i)) != 0)
        .expect("amax is one of the values");
    let max = x[first * 8 + of_amax(eight(x, first)).trailing_zeros() as usize];
    let iscale = -127.0 / max;
    let scale = _mm256_set1_ps(iscale);
    let top = _mm256_set1_epi32(127);
    for (g, qs) in b.qs.as_chunks_mut::<32>().0.iter_mut().enumerate() {
        let mut q = [_mm256_setzero_si256(); 4];
        for (k, q) in q.iter_mut().enumerate() {
            // Round to nearest, halves to even: what ggml's `nearest_int` does for |v| <= 2^22.
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(scale, eight(x, 4 * g + k)),
            );
            *q = _mm256_min_epi32(_mm256_cvtps_epi32(r), top);
        }
        // Each group of 16 quants sums into its i16 `bsums` entry.
        for (h, pair) in q.as_chunks::<2>().0.iter().enumerate() {
            let sum = sum_i32(_mm256_add_epi32(pair[0], pair[1])) as i16;
            let at = 2 * (2 * g + h);
            b.bsums[at..at + 2].copy_from_slice(&sum.to_le_bytes());
        }
        to_bytes(q, qs);
    }
    b.d = (1.0 / iscale).to_le_bytes();
    true
}
