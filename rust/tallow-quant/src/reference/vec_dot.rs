//! Dot products of one weight row with one activation row in its `vec_dot_type`, as ggml's
//! generic `ggml_vec_dot_*`: integer sums inside a block, one float multiply-add per block.
//!
//! Each function takes the two rows as bytes of whole blocks with the same block count
//! (checked by the caller). The per-block functions are also used by the SIMD kernels for
//! the odd block their wide loop cannot take.

use super::decode;
use crate::blocks::{
    as_blocks, k4_scales_mins, q3k_scales, Block, BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockQ2K,
    BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K,
    BlockQ8_0, BlockQ8_1, GridBlock, LookupBlock, IQ4_VALUES, QK_K,
};
use crate::fp16::{bf16_to_f32, f16_to_f32};

/// Sums `block_dot` over the blocks of two rows.
#[inline]
pub(crate) fn over_blocks<W: Block, A: Block>(
    w: &[u8],
    a: &[u8],
    block_dot: impl Fn(&W, &A) -> f32,
) -> f32 {
    let (w, a) = (as_blocks::<W>(w), as_blocks::<A>(a));
    // A fold from +0.0 rather than `sum()`, which starts at -0.0: an empty row is +0.0.
    w.iter()
        .zip(a)
        .fold(0.0, |sum, (w, a)| sum + block_dot(w, a))
}

fn dot_i8<X: Copy + Into<i32>>(x: &[X], y: &[i8]) -> i32 {
    x.iter()
        .zip(y)
        .map(|(&x, &y)| x.into() * i32::from(y))
        .sum()
}

// Float weights against f32 activations accumulate in f64, like ggml's `ggml_float` sums.

pub(crate) fn f32_f32(w: &[u8], a: &[u8]) -> f32 {
    float_dot(w.as_chunks::<4>().0, a, |b| f32::from_le_bytes(*b))
}

pub(crate) fn f16_f32(w: &[u8], a: &[u8]) -> f32 {
    float_dot(w.as_chunks::<2>().0, a, |b| f16_to_f32(*b))
}

pub(crate) fn bf16_f32(w: &[u8], a: &[u8]) -> f32 {
    float_dot(w.as_chunks::<2>().0, a, |b| bf16_to_f32(*b))
}

fn float_dot<T>(w: &[T], a: &[u8], to_f32: impl Fn(&T) -> f32) -> f32 {
    let a = a.as_chunks::<4>().0;
    let sum = w.iter().zip(a).fold(0.0f64, |sum, (w, a)| {
        sum + f64::from(to_f32(w) * f32::from_le_bytes(*a))
    });
    sum as f32
}

pub(crate) fn q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, block_q4_0_q8_0)
}

pub(crate) fn block_q4_0_q8_0(w: &BlockQ4_0, a: &BlockQ8_0) -> f32 {
    let q = decode::nibbles(&w.qs).map(|q| q as i8 - 8);
    dot_i8(&q, &a.qs) as f32 * (f16_to_f32(w.d) * f16_to_f32(a.d))
}

pub(crate) fn q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, block_q4_1_q8_1)
}

pub(crate) fn block_q4_1_q8_1(w: &BlockQ4_1, a: &BlockQ8_1) -> f32 {
    let sumi = dot_i8(&decode::nibbles(&w.qs), &a.qs);
    sumi as f32 * (f16_to_f32(w.d) * f16_to_f32(a.d)) + f16_to_f32(w.m) * f16_to_f32(a.s)
}

pub(crate) fn q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, block_q5_0_q8_0)
}

pub(crate) fn block_q5_0_q8_0(w: &BlockQ5_0, a: &BlockQ8_0) -> f32 {
    let q = decode::five_bits(&w.qs, w.qh).map(|q| q as i8 - 16);
    dot_i8(&q, &a.qs) as f32 * (f16_to_f32(w.d) * f16_to_f32(a.d))
}

pub(crate) fn q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, block_q5_1_q8_1)
}

pub(crate) fn block_q5_1_q8_1(w: &BlockQ5_1, a: &BlockQ8_1) -> f32 {
    let sumi = dot_i8(&decode::five_bits(&w.qs, w.qh), &a.qs);
    sumi as f32 * (f16_to_f32(w.d) * f16_to_f32(a.d)) + f16_to_f32(w.m) * f16_to_f32(a.s)
}

pub(crate) fn q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, block_q8_0_q8_0)
}

pub(crate) fn block_q8_0_q8_0(w: &BlockQ8_0, a: &BlockQ8_0) -> f32 {
    dot_i8(&w.qs, &a.qs) as f32 * (f16_to_f32(w.d) * f16_to_f32(a.d))
}

pub(crate) fn iq4_nl_q8_0(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, block_lookup_q8_0::<BlockIq4Nl>)
}

pub(crate) fn mxfp4_q8_0(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, block_lookup_q8_0::<BlockMxfp4>)
}

/// IQ4_NL and MXFP4: the values the nibbles index, one float multiply per block.
pub(crate) fn block_lookup_q8_0<B: LookupBlock>(w: &B, a: &BlockQ8_0) -> f32 {
    let q = decode::looked_up(w.qs(), &B::VALUES);
    dot_i8(&q, &a.qs) as f32 * (w.scale() * f16_to_f32(a.d))
}

/// IQ4_XS: the groups' integer sums times their scales add up exactly in an i32 (at most
/// 8 x 32 x 32 x 127 x 127), then one float multiply per super-block.
pub(crate) fn iq4_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, |w: &BlockIq4Xs, a: &BlockQ8K| {
        let groups = w.qs.as_chunks::<16>().0.iter().zip(w.scales());
        let sumi: i32 = groups
            .zip(a.qs.as_chunks::<32>().0)
            .map(|((qs, scale), a)| scale * dot_i8(&decode::looked_up(qs, &IQ4_VALUES), a))
            .sum();
        sumi as f32 * (f16_to_f32(w.d) * a.d())
    })
}

/// The IQ1/IQ2/IQ3 and ternary formats: each group of 16's integer sum times its integer
/// scale, summed exactly in an i32 (at most 16 x 16 x 62 x 31 x 128), then one float multiply
/// per super-block.
pub(crate) fn grid_q8_k<B: GridBlock>(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, |w: &B, a: &BlockQ8K| {
        let mut values = [0i8; QK_K];
        let scales = w.decode(&mut values);
        let groups = values
            .as_chunks::<16>()
            .0
            .iter()
            .zip(a.qs.as_chunks::<16>().0);
        let sumi: i32 = groups.zip(scales).map(|((v, a), s)| s * dot_i8(v, a)).sum();
        sumi as f32 * (w.d() * B::UNIT * a.d())
    })
}

pub(crate) fn q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, |w: &BlockQ2K, a: &BlockQ8K| {
        let q = decode::q2k(w);
        let (mut sumi, mut mins) = (0i32, 0i32);
        for group in 0..QK_K / 16 {
            let range = 16 * group..16 * group + 16;
            sumi += i32::from(w.scales[group] & 0xf) * dot_i8(&q[range.clone()], &a.qs[range]);
            mins += i32::from(w.scales[group] >> 4) * a.bsum(group);
        }
        let d = a.d() * f16_to_f32(w.d);
        let dmin = a.d() * f16_to_f32(w.dmin);
        d * sumi as f32 - dmin * mins as f32
    })
}

pub(crate) fn q3_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, |w: &BlockQ3K, a: &BlockQ8K| {
        let q = decode::q3k(w);
        let scales = q3k_scales(&w.scales);
        let sumi: i32 = (0..QK_K / 16)
            .map(|g| i32::from(scales[g]) * dot_i8(&q[16 * g..16 * g + 16], &a.qs[16 * g..]))
            .sum();
        a.d() * f16_to_f32(w.d) * sumi as f32
    })
}

pub(crate) fn q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, |w: &BlockQ4K, a: &BlockQ8K| {
        k_quant_32(w.d, w.dmin, &w.scales, &decode::q4k(w), a)
    })
}

pub(crate) fn q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, |w: &BlockQ5K, a: &BlockQ8K| {
        k_quant_32(w.d, w.dmin, &w.scales, &decode::q5k(w), a)
    })
}

/// Q4_K and Q5_K: groups of 32 with a scale and a min each; the mins only need the
/// activations' group sums.
fn k_quant_32(d: [u8; 2], dmin: [u8; 2], packed: &[u8; 12], q: &[u8; QK_K], a: &BlockQ8K) -> f32 {
    let (scales, mins) = k4_scales_mins(packed);
    let (mut sumi, mut summ) = (0i32, 0i32);
    for g in 0..QK_K / 32 {
        sumi += i32::from(scales[g]) * dot_i8(&q[32 * g..32 * g + 32], &a.qs[32 * g..]);
        summ += i32::from(mins[g]) * (a.bsum(2 * g) + a.bsum(2 * g + 1));
    }
    a.d() * f16_to_f32(d) * sumi as f32 - a.d() * f16_to_f32(dmin) * summ as f32
}

pub(crate) fn q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    over_blocks(w, a, |w: &BlockQ6K, a: &BlockQ8K| {
        let q = decode::q6k(w);
        let sumi: i32 = (0..QK_K / 16)
            .map(|g| i32::from(w.scales[g]) * dot_i8(&q[16 * g..16 * g + 16], &a.qs[16 * g..]))
            .sum();
        a.d() * f16_to_f32(w.d) * sumi as f32
    })
}
