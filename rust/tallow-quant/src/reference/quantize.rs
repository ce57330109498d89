//! f32 to block formats, rounding exactly as ggml's `quantize_row_*_ref`.

pub(crate) use super::quantize_iq4::iq4_nl_row;
use super::quantize_iq4::iq4_xs;
use super::quantize_k::{q2_k, q3_k, q4_k, q5_k, q6_k};
use crate::blocks::{
    as_blocks_mut, Block, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8K, BlockQ8_0,
    BlockQ8_1, QK_K,
};
use crate::fp16::{f32_to_bf16, f32_to_f16};
use crate::GgmlType;

/// Quantizes whole blocks of f32 values into exactly their bytes (both checked by the
/// caller).
pub(crate) type QuantizeFn = fn(x: &[f32], dst: &mut [u8]);

/// The quantizer for `ty`, or `None` for the codebook formats (IQ1, IQ2, IQ3), MXFP4 and
/// the ternary ones, which need an importance matrix to be worth making.
pub(crate) fn quantizer(ty: GgmlType) -> Option<QuantizeFn> {
    Some(match ty {
        GgmlType::F32 => |x, dst| {
            for (bytes, v) in dst.as_chunks_mut::<4>().0.iter_mut().zip(x) {
                *bytes = v.to_le_bytes();
            }
        },
        GgmlType::F16 => |x, dst| {
            for (bytes, &v) in dst.as_chunks_mut::<2>().0.iter_mut().zip(x) {
                *bytes = f32_to_f16(v);
            }
        },
        GgmlType::BF16 => |x, dst| {
            for (bytes, &v) in dst.as_chunks_mut::<2>().0.iter_mut().zip(x) {
                *bytes = f32_to_bf16(v);
            }
        },
        GgmlType::Q4_0 => |x, dst| each_block(x, dst, q4_0),
        GgmlType::Q4_1 => |x, dst| each_block(x, dst, q4_1),
        GgmlType::Q5_0 => |x, dst| each_block(x, dst, q5_0),
        GgmlType::Q5_1 => |x, dst| each_block(x, dst, q5_1),
        GgmlType::Q8_0 => |x, dst| each_block(x, dst, q8_0),
        GgmlType::Q8_1 => |x, dst| each_block(x, dst, q8_1),
        GgmlType::Q8_K => |x, dst| each_block(x, dst, q8_k),
        GgmlType::Q2_K => q2_k_row,
        GgmlType::Q3_K => q3_k_row,
        GgmlType::Q4_K => q4_k_row,
        GgmlType::Q5_K => q5_k_row,
        GgmlType::Q6_K => q6_k_row,
        GgmlType::IQ4_NL => iq4_nl_row,
        GgmlType::IQ4_XS => iq4_xs_row,
        GgmlType::MXFP4
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::TQ1_0
        | GgmlType::TQ2_0 => return None,
    })
}

/// `pub(crate) fn $row(x, dst)`: whole super-blocks of a format whose quantizer searches for
/// scales, `$block` called directly so that the SIMD sets compile these same loops at their
/// own vector width (`kernels::x86::avx2`).
macro_rules! super_block_rows {
    ($($row:ident => $block:ident),* $(,)?) => {
        $(
            #[inline(always)]
            pub(crate) fn $row(x: &[f32], dst: &mut [u8]) {
                for (xs, b) in x.as_chunks::<QK_K>().0.iter().zip(as_blocks_mut(dst)) {
                    $block(xs, b);
                }
            }
        )*
    };
}

super_block_rows!(
    q2_k_row => q2_k,
    q3_k_row => q3_k,
    q4_k_row => q4_k,
    q5_k_row => q5_k,
    q6_k_row => q6_k,
    iq4_xs_row => iq4_xs,
);

#[inline(always)]
fn each_block<B: Block, const N: usize>(x: &[f32], dst: &mut [u8], f: impl Fn(&[f32; N], &mut B)) {
    for (xs, block) in x.as_chunks::<N>().0.iter().zip(as_blocks_mut::<B>(dst)) {
        f(xs, block);
    }
}

/// The value of largest magnitude (the first one on ties), as ggml's symmetric formats pick
/// it: its sign decides the sign of the scale.
pub(super) fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `roundf`: to the nearest integer, halves away from zero (for |v| < 2^31; beyond, it
/// saturates). Written out because `f32::round` is a libm call on baseline x86-64.
#[inline]
fn round_half_away(v: f32) -> i32 {
    let a = v.abs();
    let t = a as i32;
    // a - t is exact: t is a's integer part.
    let r = t.saturating_add(i32::from(a - t as f32 >= 0.5));
    if v < 0.0 {
        -r
    } else {
        r
    }
}

/// ggml's `nearest_int`: to the nearest integer, halves to even, by letting the float adder
/// round (for |v| <= 2^22): v + 1.5 * 2^23 has an ulp of 1 and holds round(v) in its low
/// mantissa bits.
#[inline]
pub(super) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

pub(super) fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Packs 32 quants (< 16) into 16 bytes, element j in the low nibble of byte j and element
/// j + 16 in its high nibble.
fn pack_nibbles(q: &[u8; 32]) -> [u8; 16] {
    std::array::from_fn(|j| (q[j] & 0xf) | ((q[j + 16] & 0xf) << 4))
}

/// Bit 4 of each of 32 quants, as the little-endian `qh` word of Q5_0/Q5_1.
fn pack_fifth_bits(q: &[u8; 32]) -> [u8; 4] {
    let bits = q
        .iter()
        .enumerate()
        .fold(0u32, |acc, (j, &v)| acc | (u32::from(v >> 4 & 1) << j));
    bits.to_le_bytes()
}

// The weight formats truncate `x * id + offset` toward zero (the C `(int8_t)` cast), and
// clamp the top: the element of largest magnitude lands just past the range.

fn q4_0(x: &[f32; 32], b: &mut BlockQ4_0) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    let q = x.map(|v| ((v * id + 8.5) as i8).min(15) as u8);
    b.d = f32_to_f16(d);
    b.qs = pack_nibbles(&q);
}

fn q4_1(x: &[f32; 32], b: &mut BlockQ4_1) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    let q = x.map(|v| (((v - min) * id + 0.5) as i8).min(15) as u8);
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(min);
    b.qs = pack_nibbles(&q);
}

fn q5_0(x: &[f32; 32], b: &mut BlockQ5_0) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    let q = x.map(|v| ((v * id + 16.5) as i8).min(31) as u8);
    b.d = f32_to_f16(d);
    b.qh = pack_fifth_bits(&q);
    b.qs = pack_nibbles(&q);
}

fn q5_1(x: &[f32; 32], b: &mut BlockQ5_1) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    let q = x.map(|v| (((v - min) * id + 0.5) as i8).min(31) as u8);
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(min);
    b.qh = pack_fifth_bits(&q);
    b.qs = pack_nibbles(&q);
}

/// Symmetric 8-bit quants: `d = max|x| / 127`, `q = round(x / d)` half away from zero.
fn q8_symmetric(x: &[f32; 32]) -> (f32, [i8; 32]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    // Within -127..=127 for finite values; the clamp only bounds what a scale too small to
    // invert (a subnormal d) makes of them.
    (d, x.map(|v| round_half_away(v * id).clamp(-128, 127) as i8))
}

pub(crate) fn q8_0(x: &[f32; 32], b: &mut BlockQ8_0) {
    let (d, qs) = q8_symmetric(x);
    b.d = f32_to_f16(d);
    b.qs = qs;
}

pub(crate) fn q8_1(x: &[f32; 32], b: &mut BlockQ8_1) {
    let (d, qs) = q8_symmetric(x);
    let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
    b.d = f32_to_f16(d);
    b.s = f32_to_f16(sum as f32 * d);
    b.qs = qs;
}

/// Q8_K scales by `-127 / max` (signed) and rounds half to even (ggml's `nearest_int`).
pub(crate) fn q8_k(x: &[f32; QK_K], b: &mut BlockQ8K) {
    let max = signed_absmax(x);
    if max == 0.0 {
        *b = BlockQ8K {
            d: [0; 4],
            qs: [0; QK_K],
            bsums: [0; 32],
        };
        return;
    }
    let iscale = -127.0 / max;
    b.qs = x.map(|v| nearest_int(iscale * v).min(127) as i8);
    for (group, qs) in b.qs.chunks_exact(16).enumerate() {
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        b.bsums[2 * group..2 * group + 2].copy_from_slice(&(sum as i16).to_le_bytes());
    }
    b.d = (1.0 / iscale).to_le_bytes();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_rounding_matches_std() {
        let mut values = vec![0.0f32, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -127.5];
        // Every multiple of 1/64 in [-130, 130], and values next to the halves.
        values.extend((-130 * 64..=130 * 64).map(|i| i as f32 / 64.0));
        for h in -260..=260 {
            let half = h as f32 / 2.0;
            values.extend([half.next_up(), half.next_down()]);
        }
        for v in values {
            assert_eq!(round_half_away(v), v.round() as i32, "roundf({v})");
            assert_eq!(
                nearest_int(v),
                v.round_ties_even() as i32,
                "nearest_int({v})"
            );
        }
    }
}
