//! Block formats to f32.
//!
//! The float operations and their order follow ggml's `dequantize_row_*` (and the `gguf`
//! Python package, which mirrors them), so results are bit-identical: each value is one or
//! two roundings from the integers, never fused.

use super::decode;
use crate::blocks::{
    as_blocks, k4_scales_mins, q3k_scales, Block, BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockQ2K,
    BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K,
    BlockQ8_0, BlockQ8_1, GridBlock, LookupBlock, IQ4_VALUES, QK_K,
};
use crate::blocks::{
    BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockTq1_0,
    BlockTq2_0,
};
use crate::fp16::{bf16_to_f32, f16_to_f32};
use crate::GgmlType;

/// Dequantizes whole blocks; `dst` holds exactly the elements of `src` (checked by the
/// caller).
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (x, bytes) in dst.iter_mut().zip(src.as_chunks::<4>().0) {
                *x = f32::from_le_bytes(*bytes);
            }
        }
        GgmlType::F16 => {
            for (x, bytes) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                *x = f16_to_f32(*bytes);
            }
        }
        GgmlType::BF16 => {
            for (x, bytes) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                *x = bf16_to_f32(*bytes);
            }
        }
        GgmlType::Q4_0 => each_block(src, dst, q4_0),
        GgmlType::Q4_1 => each_block(src, dst, q4_1),
        GgmlType::Q5_0 => each_block(src, dst, q5_0),
        GgmlType::Q5_1 => each_block(src, dst, q5_1),
        GgmlType::Q8_0 => each_block(src, dst, q8_0),
        GgmlType::Q8_1 => each_block(src, dst, q8_1),
        GgmlType::Q2_K => each_block(src, dst, q2_k),
        GgmlType::Q3_K => each_block(src, dst, q3_k),
        GgmlType::Q4_K => each_block(src, dst, q4_k),
        GgmlType::Q5_K => each_block(src, dst, q5_k),
        GgmlType::Q6_K => each_block(src, dst, q6_k),
        GgmlType::Q8_K => each_block(src, dst, q8_k),
        GgmlType::IQ4_NL => each_block(src, dst, looked_up::<BlockIq4Nl>),
        GgmlType::IQ4_XS => each_block(src, dst, iq4_xs),
        GgmlType::MXFP4 => each_block(src, dst, looked_up::<BlockMxfp4>),
        GgmlType::IQ2_XXS => each_block(src, dst, grid::<BlockIq2Xxs>),
        GgmlType::IQ2_XS => each_block(src, dst, grid::<BlockIq2Xs>),
        GgmlType::IQ2_S => each_block(src, dst, grid::<BlockIq2S>),
        GgmlType::IQ3_XXS => each_block(src, dst, grid::<BlockIq3Xxs>),
        GgmlType::IQ3_S => each_block(src, dst, grid::<BlockIq3S>),
        GgmlType::IQ1_S => each_block(src, dst, grid::<BlockIq1S>),
        GgmlType::IQ1_M => each_block(src, dst, grid::<BlockIq1M>),
        GgmlType::TQ1_0 => each_block(src, dst, grid::<BlockTq1_0>),
        GgmlType::TQ2_0 => each_block(src, dst, grid::<BlockTq2_0>),
    }
}

fn looked_up<B: LookupBlock>(b: &B, out: &mut [f32; 32]) {
    let d = b.scale();
    for (y, q) in out.iter_mut().zip(decode::looked_up(b.qs(), &B::VALUES)) {
        *y = d * f32::from(q);
    }
}

/// The IQ1/IQ2/IQ3 and ternary formats, group scale times value (exact, see
/// `crate::blocks::GridBlock`).
fn grid<B: GridBlock>(b: &B, out: &mut [f32; QK_K]) {
    let mut values = [0i8; QK_K];
    let scales = b.decode(&mut values);
    let unit = b.d() * B::UNIT;
    let groups = values.as_chunks::<16>().0.iter().zip(scales);
    for ((values, scale), out) in groups.zip(out.as_chunks_mut::<16>().0) {
        let dl = unit * scale as f32;
        for (y, &q) in out.iter_mut().zip(values) {
            *y = dl * f32::from(q);
        }
    }
}

fn iq4_xs(b: &BlockIq4Xs, out: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    let groups = b.qs.as_chunks::<16>().0.iter().zip(b.scales());
    for ((qs, scale), out) in groups.zip(out.as_chunks_mut::<32>().0) {
        let dl = d * scale as f32;
        for (y, q) in out.iter_mut().zip(decode::looked_up(qs, &IQ4_VALUES)) {
            *y = dl * f32::from(q);
        }
    }
}

fn each_block<B: Block, const N: usize>(src: &[u8], dst: &mut [f32], f: fn(&B, &mut [f32; N])) {
    for (block, out) in as_blocks::<B>(src).iter().zip(dst.as_chunks_mut::<N>().0) {
        f(block, out);
    }
}

fn q4_0(b: &BlockQ4_0, out: &mut [f32; 32]) {
    let d = f16_to_f32(b.d);
    for (y, q) in out.iter_mut().zip(decode::nibbles(&b.qs)) {
        *y = d * f32::from(q as i8 - 8);
    }
}

fn q4_1(b: &BlockQ4_1, out: &mut [f32; 32]) {
    let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
    for (y, q) in out.iter_mut().zip(decode::nibbles(&b.qs)) {
        *y = d * f32::from(q) + m;
    }
}

fn q5_0(b: &BlockQ5_0, out: &mut [f32; 32]) {
    let d = f16_to_f32(b.d);
    for (y, q) in out.iter_mut().zip(decode::five_bits(&b.qs, b.qh)) {
        *y = d * f32::from(q as i8 - 16);
    }
}

fn q5_1(b: &BlockQ5_1, out: &mut [f32; 32]) {
    let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
    for (y, q) in out.iter_mut().zip(decode::five_bits(&b.qs, b.qh)) {
        *y = d * f32::from(q) + m;
    }
}

fn q8_0(b: &BlockQ8_0, out: &mut [f32; 32]) {
    let d = f16_to_f32(b.d);
    for (y, &q) in out.iter_mut().zip(&b.qs) {
        *y = f32::from(q) * d;
    }
}

fn q8_1(b: &BlockQ8_1, out: &mut [f32; 32]) {
    let d = f16_to_f32(b.d);
    for (y, &q) in out.iter_mut().zip(&b.qs) {
        *y = f32::from(q) * d;
    }
}

fn q2_k(b: &BlockQ2K, out: &mut [f32; QK_K]) {
    let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
    let q = decode::q2k(b);
    for (group, (ys, qs)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
        let dl = d * f32::from(b.scales[group] & 0xf);
        let ml = dmin * f32::from(b.scales[group] >> 4);
        for (y, &q) in ys.iter_mut().zip(qs) {
            *y = dl * f32::from(q) - ml;
        }
    }
}

fn q3_k(b: &BlockQ3K, out: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    let scales = q3k_scales(&b.scales);
    let q = decode::q3k(b);
    for (group, (ys, qs)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
        let dl = d * f32::from(scales[group]);
        for (y, &q) in ys.iter_mut().zip(qs) {
            *y = dl * f32::from(q);
        }
    }
}

fn q4_k(b: &BlockQ4K, out: &mut [f32; QK_K]) {
    k_quant_32(
        f16_to_f32(b.d),
        f16_to_f32(b.dmin),
        &b.scales,
        &decode::q4k(b),
        out,
    );
}

fn q5_k(b: &BlockQ5K, out: &mut [f32; QK_K]) {
    k_quant_32(
        f16_to_f32(b.d),
        f16_to_f32(b.dmin),
        &b.scales,
        &decode::q5k(b),
        out,
    );
}

/// Q4_K and Q5_K: `(d * sc) * q - (dmin * m)` per group of 32.
fn k_quant_32(d: f32, dmin: f32, packed: &[u8; 12], q: &[u8; QK_K], out: &mut [f32; QK_K]) {
    let (scales, mins) = k4_scales_mins(packed);
    for (group, (ys, qs)) in out.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
        let dl = d * f32::from(scales[group]);
        let ml = dmin * f32::from(mins[group]);
        for (y, &q) in ys.iter_mut().zip(qs) {
            *y = dl * f32::from(q) - ml;
        }
    }
}

fn q6_k(b: &BlockQ6K, out: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    let q = decode::q6k(b);
    for (group, (ys, qs)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
        let dl = d * f32::from(b.scales[group]);
        for (y, &q) in ys.iter_mut().zip(qs) {
            *y = dl * f32::from(q);
        }
    }
}

fn q8_k(b: &BlockQ8K, out: &mut [f32; QK_K]) {
    let d = b.d();
    for (y, &q) in out.iter_mut().zip(&b.qs) {
        *y = d * f32::from(q);
    }
}
