//! Random rows in every format: weights as random bytes with sane scales, activations
//! quantized from random floats.

use super::rng::Rng;
use crate::fp16::{f32_to_bf16, f32_to_f16};
use crate::{dequantize, quantize_row, GgmlType};

/// Byte offsets of the f16 scale fields inside one block.
pub fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q8_1 => &[0],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => &[0],
        GgmlType::IQ3_XXS | GgmlType::IQ3_S | GgmlType::IQ1_S => &[0],
        GgmlType::TQ1_0 => &[52],
        GgmlType::TQ2_0 => &[64],
        // Its f16 scale is split over four nibbles: see `set_iq1m_scale`.
        GgmlType::IQ1_M => &[],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_K | GgmlType::MXFP4 => &[],
    }
}

/// The bytes of an IQ1_M block whose top nibbles hold its f16 scale, lowest nibble first
/// (the high bytes of its four little-endian scale words).
const IQ1M_SCALE_BYTES: [usize; 4] = [49, 51, 53, 55];

/// Writes the f16 scale `half` into an IQ1_M block.
pub fn set_iq1m_scale(block: &mut [u8], half: [u8; 2]) {
    let bits = u16::from_le_bytes(half);
    for (k, &at) in IQ1M_SCALE_BYTES.iter().enumerate() {
        block[at] = (block[at] & 0x0f) | ((((bits >> (4 * k)) & 0xf) as u8) << 4);
    }
}

/// The f16 scale of an IQ1_M block.
pub fn iq1m_scale(block: &[u8]) -> [u8; 2] {
    let bits = IQ1M_SCALE_BYTES
        .iter()
        .enumerate()
        .fold(0u16, |bits, (k, &at)| {
            bits | (u16::from(block[at] >> 4) << (4 * k))
        });
    bits.to_le_bytes()
}

/// Byte offsets of the E8M0 shared exponents inside one block.
pub fn e8m0_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::MXFP4 => &[0],
        _ => &[],
    }
}

/// `blocks` blocks of `ty` whose bytes are all `fill` but for their scales, which are those
/// of random blocks (finite, of moderate size): with `0xff`, every quant at its largest. The
/// float formats (one element a block) are random blocks.
pub fn extreme_blocks(rng: &mut Rng, ty: GgmlType, blocks: usize, fill: u8) -> Vec<u8> {
    let scales = random_blocks(rng, ty, blocks);
    if ty.block_len() == 1 {
        return scales;
    }
    let mut out = vec![fill; scales.len()];
    for (to, from) in out
        .chunks_exact_mut(ty.block_bytes())
        .zip(scales.chunks_exact(ty.block_bytes()))
    {
        for &f in f16_fields(ty) {
            to[f..f + 2].copy_from_slice(&from[f..f + 2]);
        }
        for &f in e8m0_fields(ty) {
            to[f] = from[f];
        }
        if ty == GgmlType::IQ1_M {
            set_iq1m_scale(to, iq1m_scale(from));
        }
    }
    out
}

/// `blocks` random blocks of `ty`: random bytes, then every scale (and every element of the
/// float formats) replaced by a finite value of moderate size and random sign, so that
/// products neither overflow nor vanish.
pub fn random_blocks(rng: &mut Rng, ty: GgmlType, blocks: usize) -> Vec<u8> {
    let mut bytes = rng.bytes(blocks * ty.block_bytes());
    let scale = |rng: &mut Rng| {
        let magnitude = 2f32.powf(rng.range(-10.0, -2.0));
        if rng.next_u64().is_multiple_of(2) {
            magnitude
        } else {
            -magnitude
        }
    };
    match ty {
        GgmlType::F32 => {
            for chunk in bytes.chunks_exact_mut(4) {
                chunk.copy_from_slice(&rng.range(-2.0, 2.0).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for chunk in bytes.chunks_exact_mut(2) {
                chunk.copy_from_slice(&f32_to_f16(rng.range(-2.0, 2.0)));
            }
        }
        GgmlType::BF16 => {
            for chunk in bytes.chunks_exact_mut(2) {
                chunk.copy_from_slice(&f32_to_bf16(rng.range(-2.0, 2.0)));
            }
        }
        _ => {
            for block in bytes.chunks_exact_mut(ty.block_bytes()) {
                // Shared exponents of 2^-10 to 2^-3, as the f16 scales below.
                for &offset in e8m0_fields(ty) {
                    block[offset] = 118 + (rng.next_u64() % 8) as u8;
                }
                for &offset in f16_fields(ty) {
                    block[offset..offset + 2].copy_from_slice(&f32_to_f16(scale(rng)));
                }
                if ty == GgmlType::IQ1_M {
                    set_iq1m_scale(block, f32_to_f16(scale(rng)));
                }
            }
        }
    }
    bytes
}

/// Random activations for `n` elements, and their quantization to `ty`'s `vec_dot_type`.
pub fn random_acts(rng: &mut Rng, ty: GgmlType, n: usize) -> (Vec<f32>, Vec<u8>) {
    let x = rng.activations(n);
    let act_ty = ty.vec_dot_type();
    let mut q = vec![0u8; n / act_ty.block_len() * act_ty.block_bytes()];
    quantize_row(act_ty, &x, &mut q).unwrap();
    (x, q)
}

pub fn dequantized(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / ty.block_bytes() * ty.block_len()];
    dequantize(ty, bytes, &mut out).unwrap();
    out
}

/// `sum(|w| * |a|)` in f64: the scale of the rounding error of any order of summation.
pub fn magnitude(w: &[f32], a: &[f32]) -> f64 {
    w.iter()
        .zip(a)
        .map(|(&w, &a)| (f64::from(w) * f64::from(a)).abs())
        .sum()
}

pub fn exact_dot(w: &[f32], a: &[f32]) -> f64 {
    w.iter()
        .zip(a)
        .map(|(&w, &a)| f64::from(w) * f64::from(a))
        .sum()
}
