//! AVX-512 kernels: 64 quants per instruction. Every kernel is written once over
//! [`DotBytes`] and compiled twice: with VNNI's `vpdpbusd` where the CPU has it (Ice Lake,
//! Zen 4 and later), and with `vpmaddubsw` + `vpmaddwd` on AVX-512 without VNNI (Skylake-X).
//!
//! Formats with 32-element blocks take two blocks per step (an odd last block goes through
//! the scalar reference). Q2_K and Q3_K have no AVX-512 row products yet and use the AVX2 ones
//! (both have packed kernels here).
//!
//! # Safety
//! Every function here needs AVX-512 F and BW (plus VNNI for the `vnni` entry points);
//! `crate::kernels::Isa` only hands them out when the CPU has them. Memory is only reached through
//! references to whole blocks.

use std::arch::x86_64::*;

mod attention;
mod quantize;

use super::avx2::{fp16, load_i8, load_u8, load_u8x16};
use super::{tile_operands, Bw, DotBytes, Vnni};
use crate::blocks::{
    as_blocks, k4_scales_mins, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::kernels::activations::{clamped_swiglu_loop, gated_loop, RawActivations};
use crate::kernels::attention::{loops, RawAttention, RawInPlace};
use crate::kernels::{RawDecoding, RawFloatRow, RawRow};
use crate::reference::vec_dot as reference;
use crate::GgmlType;

/// Declares each generic kernel's two entry points, in modules `bw` and `vnni`, with the
/// target features that let the compiler inline the matching [`DotBytes`].
macro_rules! entry_points {
    ($($kernel:ident),* $(,)?) => {
        mod bw {
            $(
                #[target_feature(enable = "avx512f,avx512bw")]
                pub(super) unsafe fn $kernel(w: &[u8], a: &[u8]) -> f32 {
                    super::$kernel::<super::Bw>(w, a)
                }
            )*
        }

        mod vnni {
            $(
                #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
                pub(super) unsafe fn $kernel(w: &[u8], a: &[u8]) -> f32 {
                    super::$kernel::<super::Vnni>(w, a)
                }
            )*
        }
    };
}

entry_points!(
    q4_0_q8_0, q4_1_q8_1, q5_0_q8_0, q5_1_q8_1, q8_0_q8_0, q4_k_q8_k, q5_k_q8_k, q6_k_q8_k,
);

// ---- helpers ----

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load64(bytes: &[u8; 64]) -> __m512i {
    _mm512_loadu_si512(bytes.as_ptr().cast())
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load64_i8(bytes: &[i8; 64]) -> __m512i {
    _mm512_loadu_si512(bytes.as_ptr().cast())
}

/// `lo` in the low eight lanes, `hi` in the high eight: the scales of two 32-element blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn halves(lo: f32, hi: f32) -> __m512 {
    _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(lo), _mm512_set1_ps(hi))
}

/// The nibbles of two Q4_0/Q4_1-style blocks in element order, one block per 256 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn nibbles_x2(first: &[u8; 16], second: &[u8; 16]) -> __m512i {
    let packed = _mm256_setr_m128i(load_u8x16(first), load_u8x16(second));
    let mask4 = _mm256_set1_epi8(0xf);
    let lo = _mm256_and_si256(packed, mask4);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask4);
    // 128-bit lanes [lo0, lo1, hi0, hi1] -> [lo0, hi0, lo1, hi1].
    let v = join(lo, hi);
    _mm512_shuffle_i64x2::<0b11_01_10_00>(v, v)
}

/// Adds 16 to the bytes of two Q5-style blocks (as laid out by [`nibbles_x2`]) whose fifth
/// bit is set.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn add_fifth_bits_x2(q: __m512i, first: [u8; 4], second: [u8; 4]) -> __m512i {
    let bits = u64::from(u32::from_le_bytes(first)) | u64::from(u32::from_le_bytes(second)) << 32;
    _mm512_mask_add_epi8(q, bits, q, _mm512_set1_epi8(16))
}

/// Index vector for `vpermd`: group `lo` in the low eight lanes, `hi` in the high eight.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn lane_groups(lo: i32, hi: i32) -> __m512i {
    _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32(lo), _mm512_set1_epi32(hi))
}

/// Sums `block_dot` over the blocks of the odd tail.
fn tail_sum<W, A>(w: &[W], a: &[A], block_dot: fn(&W, &A) -> f32) -> f32 {
    w.iter()
        .zip(a)
        .fold(0.0, |sum, (w, a)| sum + block_dot(w, a))
}

// ---- 32-element blocks, two per step ----

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q4_0_q8_0<D: DotBytes>(w: &[u8], a: &[u8]) -> f32 {
    let (w2, w_tail) = as_blocks::<BlockQ4_0>(w).as_chunks::<2>();
    let (a2, a_tail) = as_blocks::<BlockQ8_0>(a).as_chunks::<2>();
    let zero = _mm512_setzero_si512();
    let mut acc = _mm512_setzero_ps();
    for ([w0, w1], [a0, a1]) in w2.iter().zip(a2) {
        let q = nibbles_x2(&w0.qs, &w1.qs);
        let y = join(load_i8(&a0.qs), load_i8(&a1.qs));
        // (q - 8) . y, with q kept unsigned for the byte products.
        let sums = _mm512_sub_epi32(D::dot(zero, q, y), D::dot(zero, _mm512_set1_epi8(8), y));
        let d = halves(fp16(w0.d) * fp16(a0.d), fp16(w1.d) * fp16(a1.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc);
    }
    _mm512_reduce_add_ps(acc) + tail_sum(w_tail, a_tail, reference::block_q4_0_q8_0)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q4_1_q8_1<D: DotBytes>(w: &[u8], a: &[u8]) -> f32 {
    let (w2, w_tail) = as_blocks::<BlockQ4_1>(w).as_chunks::<2>();
    let (a2, a_tail) = as_blocks::<BlockQ8_1>(a).as_chunks::<2>();
    let zero = _mm512_setzero_si512();
    let mut acc = _mm512_setzero_ps();
    let mut offsets = 0.0f32;
    for ([w0, w1], [a0, a1]) in w2.iter().zip(a2) {
        let q = nibbles_x2(&w0.qs, &w1.qs);
        let y = join(load_i8(&a0.qs), load_i8(&a1.qs));
        let d = halves(fp16(w0.d) * fp16(a0.d), fp16(w1.d) * fp16(a1.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(D::dot(zero, q, y)), acc);
        offsets += fp16(w0.m) * fp16(a0.s) + fp16(w1.m) * fp16(a1.s);
    }
    _mm512_reduce_add_ps(acc) + offsets + tail_sum(w_tail, a_tail, reference::block_q4_1_q8_1)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q5_0_q8_0<D: DotBytes>(w: &[u8], a: &[u8]) -> f32 {
    let (w2, w_tail) = as_blocks::<BlockQ5_0>(w).as_chunks::<2>();
    let (a2, a_tail) = as_blocks::<BlockQ8_0>(a).as_chunks::<2>();
    let zero = _mm512_setzero_si512();
    let mut acc = _mm512_setzero_ps();
    for ([w0, w1], [a0, a1]) in w2.iter().zip(a2) {
        let q = add_fifth_bits_x2(nibbles_x2(&w0.qs, &w1.qs), w0.qh, w1.qh);
        let y = join(load_i8(&a0.qs), load_i8(&a1.qs));
        let sums = _mm512_sub_epi32(D::dot(zero, q, y), D::dot(zero, _mm512_set1_epi8(16), y));
        let d = halves(fp16(w0.d) * fp16(a0.d), fp16(w1.d) * fp16(a1.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc);
    }
    _mm512_reduce_add_ps(acc) + tail_sum(w_tail, a_tail, reference::block_q5_0_q8_0)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q5_1_q8_1<D: DotBytes>(w: &[u8], a: &[u8]) -> f32 {
    let (w2, w_tail) = as_blocks::<BlockQ5_1>(w).as_chunks::<2>();
    let (a2, a_tail) = as_blocks::<BlockQ8_1>(a).as_chunks::<2>();
    let zero = _mm512_setzero_si512();
    let mut acc = _mm512_setzero_ps();
    let mut offsets = 0.0f32;
    for ([w0, w1], [a0, a1]) in w2.iter().zip(a2) {
        let q = add_fifth_bits_x2(nibbles_x2(&w0.qs, &w1.qs), w0.qh, w1.qh);
        let y = join(load_i8(&a0.qs), load_i8(&a1.qs));
        let d = halves(fp16(w0.d) * fp16(a0.d), fp16(w1.d) * fp16(a1.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(D::dot(zero, q, y)), acc);
        offsets += fp16(w0.m) * fp16(a0.s) + fp16(w1.m) * fp16(a1.s);
    }
    _mm512_reduce_add_ps(acc) + offsets + tail_sum(w_tail, a_tail, reference::block_q5_1_q8_1)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q8_0_q8_0<D: DotBytes>(w: &[u8], a: &[u8]) -> f32 {
    let (w2, w_tail) = as_blocks::<BlockQ8_0>(w).as_chunks::<2>();
    let (a2, a_tail) = as_blocks::<BlockQ8_0>(a).as_chunks::<2>();
    let zero = _mm512_setzero_si512();
    let mut acc = _mm512_setzero_ps();
    for ([w0, w1], [a0, a1]) in w2.iter().zip(a2) {
        let x = join(load_i8(&w0.qs), load_i8(&w1.qs));
        let y = join(load_i8(&a0.qs), load_i8(&a1.qs));
        // x . y = |x| . (y with the sign of x); |-128| reads as 128 unsigned.
        let negative = _mm512_movepi8_mask(x);
        let signed_y = _mm512_mask_sub_epi8(y, negative, zero, y);
        let sums = D::dot(zero, _mm512_abs_epi8(x), signed_y);
        let d = halves(fp16(w0.d) * fp16(a0.d), fp16(w1.d) * fp16(a1.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc);
    }
    _mm512_reduce_add_ps(acc) + tail_sum(w_tail, a_tail, reference::block_q8_0_q8_0)
}

// ---- K-quants ----

/// Q4_K and Q5_K: each 64-byte chunk c of `qs` holds groups 4c and 4c+2 in its low nibbles
/// and groups 4c+1 and 4c+3 in its high nibbles (one group per 256 bits). `fifth_bits` adds
/// Q5_K's high bits to the quants of a group pair.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn k_quant_32<D: DotBytes>(
    qs: &[u8; 128],
    packed_scales: &[u8; 12],
    a: &BlockQ8K,
    fifth_bits: impl Fn(__m512i, usize, usize) -> __m512i,
) -> (__m512i, i32) {
    let zero = _mm512_setzero_si512();
    let mask4 = _mm512_set1_epi8(0xf);
    let (scales, mins) = k4_scales_mins(packed_scales);
    let scales = _mm512_cvtepu8_epi32(_mm_loadl_epi64(scales.as_ptr().cast()));
    let y = a.qs.as_chunks::<32>().0;
    let mut sumi = zero;
    for (c, bits) in qs.as_chunks::<64>().0.iter().enumerate() {
        let bits = load64(bits);
        for (nibble, q) in [
            _mm512_and_si512(bits, mask4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(bits), mask4),
        ]
        .into_iter()
        .enumerate()
        {
            let (g0, g1) = (4 * c + nibble, 4 * c + nibble + 2);
            let q = fifth_bits(q, g0, g1);
            let dots = D::dot(zero, q, join(load_i8(&y[g0]), load_i8(&y[g1])));
            let group_scales = _mm512_permutexvar_epi32(lane_groups(g0 as i32, g1 as i32), scales);
            sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(group_scales, dots));
        }
    }
    let summ = a.weighted_bsums(|g| i32::from(mins[g / 2]));
    (sumi, summ)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q4_k_q8_k<D: DotBytes>(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    let mut mins = 0.0f32;
    for (w, a) in as_blocks::<BlockQ4K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let (sumi, summ) = k_quant_32::<D>(&w.qs, &w.scales, a, |q, _, _| q);
        let d = _mm512_set1_ps(a.d() * fp16(w.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
        mins += a.d() * fp16(w.dmin) * summ as f32;
    }
    _mm512_reduce_add_ps(acc) - mins
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q5_k_q8_k<D: DotBytes>(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    let mut mins = 0.0f32;
    for (w, a) in as_blocks::<BlockQ5K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let qh = load_u8(&w.qh);
        let qh = join(qh, qh);
        // Bit g of qh byte l is the fifth bit of element l of group g.
        let fifth_bits = |q: __m512i, g0: usize, g1: usize| {
            let bit = |g: usize| _mm256_set1_epi8((1u8 << g) as i8);
            let set = _mm512_test_epi8_mask(qh, join(bit(g0), bit(g1)));
            _mm512_mask_add_epi8(q, set, q, _mm512_set1_epi8(16))
        };
        let (sumi, summ) = k_quant_32::<D>(&w.qs, &w.scales, a, fifth_bits);
        let d = _mm512_set1_ps(a.d() * fp16(w.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
        mins += a.d() * fp16(w.dmin) * summ as f32;
    }
    _mm512_reduce_add_ps(acc) - mins
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q6_k_q8_k<D: DotBytes>(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    let mask4 = _mm512_set1_epi8(0xf);
    let top2 = _mm512_set1_epi8(0x30);
    // Per 256-bit half: where bits 0-1 / 2-3 (low nibbles) and 4-5 / 6-7 (high nibbles) of
    // qh go to land on bits 4-5.
    let shift_left_lo = join(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    let shift_right_hi = join(_mm256_set1_epi16(0), _mm256_set1_epi16(2));
    // Each i32 lane of a dot covers 4 quants, so a group of 16 spans 4 lanes.
    let quads = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let mut acc = _mm512_setzero_ps();
    for (w, a) in as_blocks::<BlockQ6K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let scales = _mm512_cvtepi8_epi32(_mm_loadu_si128(w.scales.as_ptr().cast()));
        let ql = w.ql.as_chunks::<64>().0;
        let qh = w.qh.as_chunks::<32>().0;
        let y = a.qs.as_chunks::<64>().0;
        let mut sumi = zero;
        for half in 0..2 {
            let bits = load64(&ql[half]);
            let high = load_u8(&qh[half]);
            let high = join(high, high);
            let lo = _mm512_or_si512(
                _mm512_and_si512(bits, mask4),
                _mm512_and_si512(_mm512_sllv_epi16(high, shift_left_lo), top2),
            );
            let hi = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(bits), mask4),
                _mm512_and_si512(_mm512_srlv_epi16(high, shift_right_hi), top2),
            );
            for (part, q) in [lo, hi].into_iter().enumerate() {
                let dots = D::dot(zero, q, load64_i8(&y[2 * half + part]));
                let first_group = _mm512_set1_epi32((8 * half + 4 * part) as i32);
                let groups = _mm512_add_epi32(first_group, quads);
                let group_scales = _mm512_permutexvar_epi32(groups, scales);
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(group_scales, dots));
            }
        }
        // The quants above were unsigned (0..64); take away 32 * scale * sum(y) per group.
        let offset = 32 * a.weighted_bsums(|g| i32::from(w.scales[g]));
        let sumi = _mm512_mask_sub_epi32(sumi, 1, sumi, _mm512_set1_epi32(offset));
        let d = _mm512_set1_ps(a.d() * fp16(w.d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc)
}

// ---- tiles: one weight row against up to eight tokens ----
//
// Each kernel unpacks a pair of weight blocks once and takes it through every token of the
// tile. Per token it does exactly what the matching `vec_dot` kernel above does, in the same
// order (the same i32 lanes, the same f32 scales, one accumulator per token, the same
// reduction), so its outputs equal that kernel's bit for bit. The activation scales come
// converted to f32 ([`super::TileScales`]): the products `wd * ad` are the same f32 products
// the scalar code forms, taken eight tokens at a time.

/// The scale of two blocks for the token in lane `lane` of `prod` (`wd * ad` of blocks 2p and
/// 2p+1 for the eight lanes of a token group): as [`halves`] of the two products.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn lane_halves(prod: __m512, index: __m512i) -> __m512 {
    _mm512_permutexvar_ps(index, prod)
}

/// Sixteen f32 scales.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load16(v: &[f32; 16]) -> __m512 {
    _mm512_loadu_ps(v.as_ptr())
}

/// The low and high eight lanes of `v` added: per token, the offsets of a block pair.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn add_halves(v: __m512) -> __m256 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(_mm512_castps512_ps256(v), hi)
}

/// The block pairs of a tile's weight row and activation rows, all of the same length (so
/// that indexing them needs no checks in the loop), and the odd last blocks.
#[allow(clippy::type_complexity)]
#[inline]
fn tile_pairs<'a, W, A, const T: usize>(
    w: &'a [W],
    a: [&'a [A]; T],
) -> (&'a [[W; 2]], [&'a [[A; 2]]; T], &'a [W], [&'a [A]; T]) {
    let (w2, w_tail) = w.as_chunks::<2>();
    let pairs = w2.len();
    let a2 = a.map(|a| &a.as_chunks::<2>().0[..pairs]);
    let a_tail = a.map(|a| &a[2 * pairs..]);
    (w2, a2, w_tail, a_tail)
}

/// The f32 scales of a token group per block pair: 16 lanes, blocks 2p and 2p+1.
#[inline]
fn pair_scales(scales: &[f32], pairs: usize) -> &[[f32; 16]] {
    &scales.as_chunks::<16>().0[..pairs]
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn tile_q4_0_q8_0<D: DotBytes, const T: usize>(
    w: &[u8],
    a: crate::kernels::TileActs,
    scales: &crate::kernels::TileScales,
    out: &mut [f32],
) {
    let (w, a) = tile_operands::<BlockQ4_0, BlockQ8_0, T>(w, a, scales, out);
    let index: [__m512i; T] = std::array::from_fn(|t| lane_groups(t as i32, (8 + t) as i32));
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); T];
    let (w2, a2, w_tail, a_tail) = tile_pairs(w, a);
    let d16 = pair_scales(scales.d, w2.len());
    for (p, [w0, w1]) in w2.iter().enumerate() {
        // The same i32 lanes as `(q . y) - (8 . y)` in `q4_0_q8_0`, with one byte product
        // per token: |q - 8| . (y with the sign of q - 8).
        let x = _mm512_sub_epi8(nibbles_x2(&w0.qs, &w1.qs), _mm512_set1_epi8(8));
        let negative = _mm512_movepi8_mask(x);
        let abs_x = _mm512_abs_epi8(x);
        let prod = _mm512_mul_ps(halves(fp16(w0.d), fp16(w1.d)), load16(&d16[p]));
        for t in 0..T {
            let [a0, a1] = &a2[t][p];
            let y = join(load_i8(&a0.qs), load_i8(&a1.qs));
            let sums = D::dot(zero, abs_x, _mm512_mask_sub_epi8(y, negative, zero, y));
            let d = lane_halves(prod, index[t]);
            acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc[t]);
        }
    }
    for t in 0..T {
        let tail = tail_sum(w_tail, a_tail[t], reference::block_q4_0_q8_0);
        out[t] = _mm512_reduce_add_ps(acc[t]) + tail;
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn tile_q4_1_q8_1<D: DotBytes, const T: usize>(
    w: &[u8],
    a: crate::kernels::TileActs,
    scales: &crate::kernels::TileScales,
    out: &mut [f32],
) {
    let (w, a) = tile_operands::<BlockQ4_1, BlockQ8_1, T>(w, a, scales, out);
    let index: [__m512i; T] = std::array::from_fn(|t| lane_groups(t as i32, (8 + t) as i32));
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); T];
    let mut offsets = _mm256_setzero_ps();
    let (w2, a2, w_tail, a_tail) = tile_pairs(w, a);
    let d16 = pair_scales(scales.d, w2.len());
    let s16 = pair_scales(scales.s, w2.len());
    for (p, [w0, w1]) in w2.iter().enumerate() {
        let q = nibbles_x2(&w0.qs, &w1.qs);
        let prod = _mm512_mul_ps(halves(fp16(w0.d), fp16(w1.d)), load16(&d16[p]));
        let mins = _mm512_mul_ps(halves(fp16(w0.m), fp16(w1.m)), load16(&s16[p]));
        offsets = _mm256_add_ps(offsets, add_halves(mins));
        for t in 0..T {
            let [a0, a1] = &a2[t][p];
            let y = join(load_i8(&a0.qs), load_i8(&a1.qs));
            let d = lane_halves(prod, index[t]);
            acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(D::dot(zero, q, y)), acc[t]);
        }
    }
    let mut offs = [0f32; 8];
    _mm256_storeu_ps(offs.as_mut_ptr(), offsets);
    for t in 0..T {
        let tail = tail_sum(w_tail, a_tail[t], reference::block_q4_1_q8_1);
        out[t] = _mm512_reduce_add_ps(acc[t]) + offs[t] + tail;
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn tile_q8_0_q8_0<D: DotBytes, const T: usize>(
    w: &[u8],
    a: crate::kernels::TileActs,
    scales: &crate::kernels::TileScales,
    out: &mut [f32],
) {
    let (w, a) = tile_operands::<BlockQ8_0, BlockQ8_0, T>(w, a, scales, out);
    let index: [__m512i; T] = std::array::from_fn(|t| lane_groups(t as i32, (8 + t) as i32));
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); T];
    let (w2, a2, w_tail, a_tail) = tile_pairs(w, a);
    let d16 = pair_scales(scales.d, w2.len());
    for (p, [w0, w1]) in w2.iter().enumerate() {
        let x = join(load_i8(&w0.qs), load_i8(&w1.qs));
        let negative = _mm512_movepi8_mask(x);
        let abs_x = _mm512_abs_epi8(x);
        let prod = _mm512_mul_ps(halves(fp16(w0.d), fp16(w1.d)), load16(&d16[p]));
        for t in 0..T {
            let [a0, a1] = &a2[t][p];
            let y = join(load_i8(&a0.qs), load_i8(&a1.qs));
            let signed_y = _mm512_mask_sub_epi8(y, negative, zero, y);
            let sums = D::dot(zero, abs_x, signed_y);
            let d = lane_halves(prod, index[t]);
            acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc[t]);
        }
    }
    for t in 0..T {
        let tail = tail_sum(w_tail, a_tail[t], reference::block_q8_0_q8_0);
        out[t] = _mm512_reduce_add_ps(acc[t]) + tail;
    }
}

/// Declares each generic tile's entry points in modules `tile_bw` and `tile_vnni`, one per
/// tile width (1 to 8 tokens, picked by `a.len()`).
macro_rules! tile_entry_points {
    ($($kernel:ident),* $(,)?) => {
        tile_entry_points!(@module tile_bw, Bw, "avx512f,avx512bw", $($kernel),*);
        tile_entry_points!(@module tile_vnni, Vnni, "avx512f,avx512bw,avx512vnni", $($kernel),*);
    };
    (@module $module:ident, $dot:ident, $features:literal, $($kernel:ident),*) => {
        mod $module {
            $(
                #[target_feature(enable = $features)]
                pub(super) unsafe fn $kernel(
                    w: &[u8],
                    a: crate::kernels::TileActs,
                    scales: &crate::kernels::TileScales,
                    out: &mut [f32],
                ) {
                    match a.len() {
                        8 => super::$kernel::<super::$dot, 8>(w, a, scales, out),
                        7 => super::$kernel::<super::$dot, 7>(w, a, scales, out),
                        6 => super::$kernel::<super::$dot, 6>(w, a, scales, out),
                        5 => super::$kernel::<super::$dot, 5>(w, a, scales, out),
                        4 => super::$kernel::<super::$dot, 4>(w, a, scales, out),
                        3 => super::$kernel::<super::$dot, 3>(w, a, scales, out),
                        2 => super::$kernel::<super::$dot, 2>(w, a, scales, out),
                        1 => super::$kernel::<super::$dot, 1>(w, a, scales, out),
                        n => panic!("no tile of {n} tokens"),
                    }
                }
            )*
        }
    };
}

tile_entry_points!(tile_q4_0_q8_0, tile_q4_1_q8_1, tile_q8_0_q8_0);

// ---- rows: several weight rows against one token ----
//
// Each kernel loads a pair of activation blocks (and converts their scales) once and takes
// it through `R` weight rows, with one accumulator per row, so that the rows' chains of
// dependent additions overlap, prefetching each row a few pairs ahead. Only Q4_1 has one:
// the same scheme for Q4_0 and Q8_0 (written and measured 2026-11-22) gained nothing at
// 576x1536 and lost up to 40% for Q8_0 at 4096x4096 (benches/README.md). Per row it does exactly what the matching `vec_dot`
// kernel above does, in the same order (the same i32 lanes, the same f32 products and
// additions, the same reduction), so its outputs equal that kernel's bit for bit.

/// Checks the operands of `R` rows and views them as blocks: the whole pairs of each row and
/// of the activations (all of the same length), and the odd last blocks.
#[allow(clippy::type_complexity)]
#[inline]
fn row_pairs<'a, W: crate::blocks::Block, A: crate::blocks::Block, const R: usize>(
    w: &'a [u8],
    a: &'a [u8],
    out: &[f32],
) -> ([&'a [[W; 2]]; R], &'a [[A; 2]], [&'a [W]; R], &'a [A]) {
    assert!(out.len() == R && w.len().is_multiple_of(R));
    let row_bytes = w.len() / R;
    let w: [&[W]; R] =
        std::array::from_fn(|r| as_blocks::<W>(&w[r * row_bytes..(r + 1) * row_bytes]));
    let a = as_blocks::<A>(a);
    assert!(w.iter().all(|w| w.len() == a.len()));
    let (a2, a_tail) = a.as_chunks::<2>();
    let pairs = a2.len();
    let w2 = w.map(|w| &w.as_chunks::<2>().0[..pairs]);
    let w_tail = w.map(|w| &w[2 * pairs..]);
    (w2, a2, w_tail, a_tail)
}

/// Block pairs a row kernel prefetches ahead of the one it reads, in each row.
const PREFETCH_PAIRS: usize = 8;

/// Prefetches pair `p + PREFETCH_PAIRS` of a weight row (a hint: past the row's end it reads
/// whatever follows, or nothing).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn prefetch_ahead<W>(row: &[W], p: usize) {
    let ahead = row.as_ptr().wrapping_add(p + PREFETCH_PAIRS);
    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn rows_q4_1_q8_1<D: DotBytes, const R: usize>(w: &[u8], a: &[u8], out: &mut [f32]) {
    let (w2, a2, w_tail, a_tail) = row_pairs::<BlockQ4_1, BlockQ8_1, R>(w, a, out);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); R];
    let mut offsets = [0f32; R];
    for (p, [a0, a1]) in a2.iter().enumerate() {
        let y = join(load_i8(&a0.qs), load_i8(&a1.qs));
        let (ad0, ad1) = (fp16(a0.d), fp16(a1.d));
        let (as0, as1) = (fp16(a0.s), fp16(a1.s));
        for r in 0..R {
            prefetch_ahead(w2[r], p);
            let [w0, w1] = &w2[r][p];
            let q = nibbles_x2(&w0.qs, &w1.qs);
            let d = halves(fp16(w0.d) * ad0, fp16(w1.d) * ad1);
            acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(D::dot(zero, q, y)), acc[r]);
            offsets[r] += fp16(w0.m) * as0 + fp16(w1.m) * as1;
        }
    }
    for r in 0..R {
        let tail = tail_sum(w_tail[r], a_tail, reference::block_q4_1_q8_1);
        out[r] = _mm512_reduce_add_ps(acc[r]) + offsets[r] + tail;
    }
}

/// Declares each generic row kernel's entry points in modules `rows_bw` and `rows_vnni`:
/// `out.len()` contiguous weight rows (`w`) against one activation row, in groups of
/// [`super::ROW_TILE`] rows, then 2 and 1.
macro_rules! rows_entry_points {
    ($($kernel:ident),* $(,)?) => {
        rows_entry_points!(@module rows_bw, Bw, "avx512f,avx512bw", $($kernel),*);
        rows_entry_points!(@module rows_vnni, Vnni, "avx512f,avx512bw,avx512vnni", $($kernel),*);
    };
    (@module $module:ident, $dot:ident, $features:literal, $($kernel:ident),*) => {
        mod $module {
            $(
                #[target_feature(enable = $features)]
                pub(super) unsafe fn $kernel(w: &[u8], a: &[u8], out: &mut [f32]) {
                    const TILE: usize = crate::kernels::ROW_TILE;
                    let n = out.len();
                    if n == 0 {
                        return;
                    }
                    assert!(w.len().is_multiple_of(n), "weight rows do not fit the outputs");
                    let row_bytes = w.len() / n;
                    let mut r = 0;
                    while n - r >= TILE {
                        let rows = r..r + TILE;
                        let w = &w[rows.start * row_bytes..rows.end * row_bytes];
                        super::$kernel::<super::$dot, TILE>(w, a, &mut out[rows]);
                        r += TILE;
                    }
                    while n - r >= 2 {
                        let rows = r..r + 2;
                        let w = &w[rows.start * row_bytes..rows.end * row_bytes];
                        super::$kernel::<super::$dot, 2>(w, a, &mut out[rows]);
                        r += 2;
                    }
                    if n - r == 1 {
                        super::$kernel::<super::$dot, 1>(&w[r * row_bytes..], a, &mut out[r..]);
                    }
                }
            )*
        }
    };
}

rows_entry_points!(rows_q4_1_q8_1);

/// The AVX-512 kernels of `ty` (with VNNI's `vpdpbusd` or without it): dot products for the
/// block formats, tiles for the legacy ones, packed kernels for the formats `crate::packed`
/// lays out (`super::packed`), a row kernel for Q4_1, and the Q8_0/Q8_1 activation
/// quantizers. Packed Q8_0, IQ4_NL and IQ4_XS need VNNI: their weights as unsigned bytes
/// (plus 128) reach 241-255, and `vpmaddubsw`'s i16 pair sums would saturate (without VNNI
/// the AVX2 kernels, which take the sign off the weights first, fill the gap).
pub(crate) fn row(ty: GgmlType, vnni: bool) -> RawRow {
    use super::packed::{avx512 as formats_bw, avx512_vnni as formats_vnni};
    /// The VNNI or the BW build of a kernel.
    macro_rules! pick {
        ($bw:path, $vnni:path) => {
            Some(if vnni { $vnni as _ } else { $bw as _ })
        };
    }
    macro_rules! dot {
        ($k:ident) => {
            pick!(bw::$k, vnni::$k)
        };
    }
    macro_rules! tile {
        ($k:ident) => {
            pick!(tile_bw::$k, tile_vnni::$k)
        };
    }
    macro_rules! formats {
        ($k:ident) => {
            pick!(formats_bw::$k, formats_vnni::$k)
        };
    }
    /// A packed kernel VNNI has and BW has not (see above).
    macro_rules! vnni_formats {
        ($k:ident) => {
            vnni.then_some(formats_vnni::$k as _)
        };
    }
    let none = RawRow::default();
    match ty {
        GgmlType::Q4_0 => RawRow {
            vec_dot: dot!(q4_0_q8_0),
            tile: tile!(tile_q4_0_q8_0),
            packed: formats!(q4_0),
            ..none
        },
        GgmlType::Q4_1 => RawRow {
            vec_dot: dot!(q4_1_q8_1),
            tile: tile!(tile_q4_1_q8_1),
            rows: pick!(rows_bw::rows_q4_1_q8_1, rows_vnni::rows_q4_1_q8_1),
            packed: formats!(q4_1),
            ..none
        },
        GgmlType::Q5_0 => RawRow {
            vec_dot: dot!(q5_0_q8_0),
            packed: formats!(q5_0),
            ..none
        },
        GgmlType::Q5_1 => RawRow {
            vec_dot: dot!(q5_1_q8_1),
            ..none
        },
        GgmlType::Q8_0 => RawRow {
            vec_dot: dot!(q8_0_q8_0),
            tile: tile!(tile_q8_0_q8_0),
            packed: vnni_formats!(q8_0),
            quantize: Some(quantize::q8_0),
            ..none
        },
        GgmlType::Q8_1 => RawRow {
            quantize: Some(quantize::q8_1),
            ..none
        },
        GgmlType::Q8_K => RawRow {
            quantize: Some(quantize::q8_k),
            ..none
        },
        GgmlType::Q2_K => RawRow {
            packed: formats!(q2_k),
            ..none
        },
        GgmlType::Q3_K => RawRow {
            packed: formats!(q3_k),
            ..none
        },
        GgmlType::Q4_K => RawRow {
            vec_dot: dot!(q4_k_q8_k),
            packed: formats!(q4_k),
            ..none
        },
        GgmlType::Q5_K => RawRow {
            vec_dot: dot!(q5_k_q8_k),
            packed: formats!(q5_k),
            ..none
        },
        GgmlType::Q6_K => RawRow {
            vec_dot: dot!(q6_k_q8_k),
            packed: formats!(q6_k),
            ..none
        },
        GgmlType::IQ4_NL => RawRow {
            packed: vnni_formats!(iq4_nl),
            ..none
        },
        GgmlType::IQ4_XS => RawRow {
            packed: vnni_formats!(iq4_xs),
            ..none
        },
        // The codebook formats' kernels are AVX2's, but for the products of their decoded rows.
        GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::TQ1_0
        | GgmlType::TQ2_0 => RawRow {
            decoding: super::avx2::row(ty).decoding.map(|d| RawDecoding {
                kernel: formats!(decoded).unwrap(),
                ..d
            }),
            ..none
        },
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::MXFP4 => none,
    }
}

compiled_with!("avx512f,avx2,fma":
    merge => loops::merge, (state: &mut [f32], other: &[f32]);
    silu => gated_loop::<false>, (gate: &mut [f32], up: &[f32]);
    gelu_tanh => gated_loop::<true>, (gate: &mut [f32], up: &[f32]);
    clamped_swiglu => clamped_swiglu_loop, (gate: &mut [f32], up: &[f32]);
);

/// The AVX-512 attention kernels (this set's own tile kernel for heads of 64 and 128, which
/// also reads f16, bf16, Q8_0 and Q4_0 pages in place; the FMA tile kernel at 16 lanes for
/// the others) and gated activations. VNNI adds none.
pub(crate) fn float_row() -> RawFloatRow {
    RawFloatRow {
        attention: RawAttention {
            widen: Some(attention::widen),
            page: Some(attention::rows),
            in_place: Some(RawInPlace {
                rows: attention::rows_pages,
                reads: attention::reads_pages,
            }),
            merge: Some(merge),
            general: Some(super::attention::avx512::rows_with),
        },
        activations: RawActivations {
            silu: Some(silu),
            gelu_tanh: Some(gelu_tanh),
            clamped_swiglu: Some(clamped_swiglu),
        },
    }
}
