//! AArch64 Advanced SIMD kernels. NEON multiplies signed bytes directly, so quants are
//! turned into signed values (offset applied) and multiplied by the activations with
//! `smull` into i16, then widened and summed into i32. The `sdot` instruction (FEAT_DotProd)
//! would halve that work; it is left for when its intrinsics can be relied on.
//!
//! Formats without a kernel here (Q2_K, Q3_K, F16, BF16) use the scalar reference.
//!
//! # Safety
//! Every function here needs NEON, which `super::Isa` checks before handing them out.
//! Memory is only reached through references to whole blocks.

use std::arch::aarch64::*;

use super::{RawRow, RawVecDot};
use crate::blocks::{
    as_blocks, k4_scales_mins, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::fp16::f16_to_f32;
use crate::reference::vec_dot as reference;
use crate::GgmlType;

/// The NEON kernels of `ty`: row-major dot products.
pub(super) fn row(ty: GgmlType) -> RawRow {
    let vec_dot: RawVecDot = match ty {
        GgmlType::F32 => f32_f32,
        GgmlType::Q4_0 => q4_0_q8_0,
        GgmlType::Q4_1 => q4_1_q8_1,
        GgmlType::Q5_0 => q5_0_q8_0,
        GgmlType::Q5_1 => q5_1_q8_1,
        GgmlType::Q8_0 => q8_0_q8_0,
        GgmlType::Q4_K => q4_k_q8_k,
        GgmlType::Q5_K => q5_k_q8_k,
        GgmlType::Q6_K => q6_k_q8_k,
        _ => return RawRow::default(),
    };
    RawRow {
        vec_dot: Some(vec_dot),
        ..RawRow::default()
    }
}

// ---- helpers ----

/// `acc` plus the products of 16 signed byte pairs, summed into four i32 lanes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vaddq_s32(acc, vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
}

/// The sum of the products of 16 signed byte pairs.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot_sum(a: int8x16_t, b: int8x16_t) -> i32 {
    vaddvq_s32(dot(vdupq_n_s32(0), a, b))
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_u8(bytes: &[u8; 16]) -> uint8x16_t {
    vld1q_u8(bytes.as_ptr())
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_i8(bytes: &[i8; 16]) -> int8x16_t {
    vld1q_s8(bytes.as_ptr())
}

/// The two 16-byte halves of a 32-byte array.
fn halves<T>(bytes: &[T; 32]) -> (&[T; 16], &[T; 16]) {
    let [lo, hi] = bytes.as_chunks::<16>().0 else {
        unreachable!("32 bytes are two chunks of 16")
    };
    (lo, hi)
}

/// The low and high nibbles of a Q4-style `qs`: elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let packed = load_u8(qs);
    (vandq_u8(packed, vdupq_n_u8(0xf)), vshrq_n_u8::<4>(packed))
}

/// 16 for each of the 16 bits of `bits` that is set (bit i -> byte i), else 0.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn sixteen_if_set(bits: u16) -> uint8x16_t {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let [lo, hi] = bits.to_le_bytes();
    let spread = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi));
    vandq_u8(vtstq_u8(spread, vld1q_u8(BIT.as_ptr())), vdupq_n_u8(16))
}

/// The quants of a Q5-style block: nibbles with their fifth bit, elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn five_bits(qs: &[u8; 16], qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    let (lo, hi) = nibbles(qs);
    let bits = u32::from_le_bytes(qh);
    (
        vorrq_u8(lo, sixteen_if_set(bits as u16)),
        vorrq_u8(hi, sixteen_if_set((bits >> 16) as u16)),
    )
}

/// Dot of 32 quants (as two 16-byte halves, minus `offset`) with a 32-byte activation block.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn block_dot(q: (uint8x16_t, uint8x16_t), offset: i8, y: &[i8; 32]) -> int32x4_t {
    let (y0, y1) = halves(y);
    let signed = |v| vsubq_s8(vreinterpretq_s8_u8(v), vdupq_n_s8(offset));
    dot(
        dot(vdupq_n_s32(0), signed(q.0), load_i8(y0)),
        signed(q.1),
        load_i8(y1),
    )
}

// ---- float weights ----

#[target_feature(enable = "neon")]
unsafe fn f32_f32(w: &[u8], a: &[u8]) -> f32 {
    let (w4, w_tail) = w.as_chunks::<16>();
    let (a4, a_tail) = a.as_chunks::<16>();
    let mut acc = vdupq_n_f32(0.0);
    for (w, a) in w4.iter().zip(a4) {
        let w = vreinterpretq_f32_u8(load_u8(w));
        acc = vfmaq_f32(acc, w, vreinterpretq_f32_u8(load_u8(a)));
    }
    vaddvq_f32(acc) + reference::f32_f32(w_tail, a_tail)
}

// ---- 32-element blocks ----

#[target_feature(enable = "neon")]
unsafe fn q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    for (w, a) in as_blocks::<BlockQ4_0>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_0>(a))
    {
        let sums = block_dot(nibbles(&w.qs), 8, &a.qs);
        let d = f16_to_f32(w.d) * f16_to_f32(a.d);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sums), d);
    }
    vaddvq_f32(acc)
}

#[target_feature(enable = "neon")]
unsafe fn q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    let mut offsets = 0.0f32;
    for (w, a) in as_blocks::<BlockQ4_1>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_1>(a))
    {
        let sums = block_dot(nibbles(&w.qs), 0, &a.qs);
        let d = f16_to_f32(w.d) * f16_to_f32(a.d);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sums), d);
        offsets += f16_to_f32(w.m) * f16_to_f32(a.s);
    }
    vaddvq_f32(acc) + offsets
}

#[target_feature(enable = "neon")]
unsafe fn q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    for (w, a) in as_blocks::<BlockQ5_0>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_0>(a))
    {
        let sums = block_dot(five_bits(&w.qs, w.qh), 16, &a.qs);
        let d = f16_to_f32(w.d) * f16_to_f32(a.d);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sums), d);
    }
    vaddvq_f32(acc)
}

#[target_feature(enable = "neon")]
unsafe fn q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    let mut offsets = 0.0f32;
    for (w, a) in as_blocks::<BlockQ5_1>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_1>(a))
    {
        let sums = block_dot(five_bits(&w.qs, w.qh), 0, &a.qs);
        let d = f16_to_f32(w.d) * f16_to_f32(a.d);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sums), d);
        offsets += f16_to_f32(w.m) * f16_to_f32(a.s);
    }
    vaddvq_f32(acc) + offsets
}

#[target_feature(enable = "neon")]
unsafe fn q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    for (w, a) in as_blocks::<BlockQ8_0>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_0>(a))
    {
        let ((w0, w1), (a0, a1)) = (halves(&w.qs), halves(&a.qs));
        let sums = dot(
            dot(vdupq_n_s32(0), load_i8(w0), load_i8(a0)),
            load_i8(w1),
            load_i8(a1),
        );
        let d = f16_to_f32(w.d) * f16_to_f32(a.d);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sums), d);
    }
    vaddvq_f32(acc)
}

// ---- K-quants ----

/// Q4_K and Q5_K: `sum(scale_g * (q . y))` over the eight groups of 32, where group 2j is
/// the low nibbles of `qs` bytes 32j..32j+32 and group 2j+1 their high nibbles; `fifth_bit`
/// gives the bytes to or in for group g (zero for Q4_K).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn k_quant_32(
    qs: &[u8; 128],
    scales: &[u8; 8],
    a: &BlockQ8K,
    fifth_bit: impl Fn(usize, usize) -> uint8x16_t,
) -> i32 {
    let y = a.qs.as_chunks::<16>().0;
    let mut sumi = 0i32;
    for (j, bits) in qs.as_chunks::<16>().0.iter().enumerate() {
        // 16-byte piece `j` covers elements 16 * (j % 2) .. of groups 2 * (j / 2) and + 1.
        let (half, pair) = (j % 2, j / 2);
        let (lo, hi) = nibbles(bits);
        for (k, q) in [lo, hi].into_iter().enumerate() {
            let group = 2 * pair + k;
            let q = vorrq_u8(q, fifth_bit(group, half));
            let sum = dot_sum(vreinterpretq_s8_u8(q), load_i8(&y[2 * group + half]));
            sumi += i32::from(scales[group]) * sum;
        }
    }
    sumi
}

#[target_feature(enable = "neon")]
unsafe fn q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in as_blocks::<BlockQ4K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let (scales, mins) = k4_scales_mins(&w.scales);
        let sumi = k_quant_32(&w.qs, &scales, a, |_, _| vdupq_n_u8(0));
        let summ = a.weighted_bsums(|g| i32::from(mins[g / 2]));
        sum += a.d() * f16_to_f32(w.d) * sumi as f32 - a.d() * f16_to_f32(w.dmin) * summ as f32;
    }
    sum
}

#[target_feature(enable = "neon")]
unsafe fn q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in as_blocks::<BlockQ5K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let (scales, mins) = k4_scales_mins(&w.scales);
        let (h0, h1) = halves(&w.qh);
        let qh = [load_u8(h0), load_u8(h1)];
        // Bit g of qh byte l is the fifth bit of element l of group g.
        let fifth_bit = |group: usize, half: usize| {
            let set = vtstq_u8(qh[half], vdupq_n_u8(1 << group));
            vandq_u8(set, vdupq_n_u8(16))
        };
        let sumi = k_quant_32(&w.qs, &scales, a, fifth_bit);
        let summ = a.weighted_bsums(|g| i32::from(mins[g / 2]));
        sum += a.d() * f16_to_f32(w.d) * sumi as f32 - a.d() * f16_to_f32(w.dmin) * summ as f32;
    }
    sum
}

#[target_feature(enable = "neon")]
unsafe fn q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in as_blocks::<BlockQ6K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let ql = w.ql.as_chunks::<16>().0;
        let qh = w.qh.as_chunks::<16>().0;
        let y = a.qs.as_chunks::<16>().0;
        let mut sumi = 0i32;
        // Group g (16 elements) of half h, chunk k (32 elements), part p: low 4 bits from
        // ql piece 4h + 2(k % 2) + p (low nibble for k < 2), top 2 bits at bits 2k..2k+2 of
        // qh piece 2h + p.
        for (group, (y, &scale)) in y.iter().zip(&w.scales).enumerate() {
            let (h, k, p) = (group / 8, (group / 2) % 4, group % 2);
            let low = load_u8(&ql[4 * h + 2 * (k % 2) + p]);
            let low = if k < 2 {
                vandq_u8(low, vdupq_n_u8(0xf))
            } else {
                vshrq_n_u8::<4>(low)
            };
            let high = vshlq_u8(load_u8(&qh[2 * h + p]), vdupq_n_s8(-2 * k as i8));
            let high = vshlq_n_u8::<4>(vandq_u8(high, vdupq_n_u8(3)));
            let q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, high)), vdupq_n_s8(32));
            sumi += i32::from(scale) * dot_sum(q, load_i8(y));
        }
        sum += a.d() * f16_to_f32(w.d) * sumi as f32;
    }
    sum
}
