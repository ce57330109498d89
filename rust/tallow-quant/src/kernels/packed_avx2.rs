//! AVX2 kernels (with FMA and F16C) for weights packed in groups of [`PACK_ROWS`] rows, the
//! layout the AVX-512 kernels read (see `crate::packed`). Each 64-byte step of a block holds
//! the 16 rows of the group; AVX2 takes it as two halves of 8 rows, one i32 lane per row of
//! a 256-bit vector, so that a block of 8 rows against one token is 8 byte dot products with
//! the token's activation bytes broadcast four at a time and needs no horizontal sum. A group
//! is read half by half: its second half's bytes are still in the L1 cache by then (a group
//! of 576 columns is 5.6 KiB), and the weights stream from memory once, in order.
//!
//! Products use `vpmaddubsw` (unsigned weight bytes against signed activation bytes within
//! -127..=127). For the 4-bit formats a block's eight i16 pair sums add up to at most
//! 8 * 2 * 15 * 127 = 30480 in magnitude, so they are added as i16 and widened once with
//! `vpmaddwd`. Q8_0's stored quants (`q + 128`, up to 255) would saturate the pair sums, so its
//! kernel takes the signed `q` back and moves its sign onto the activations (`|q|` against
//! `sign(q) * y`: pairs within 2 * 128 * 127), widening each step's pairs on its own. Per row
//! the integer sums are exact and the f32 operations are those of the AVX-512 kernels in the
//! same order, so the outputs are equal bit for bit (for Q8_0, `sum(q * y)` is the exact
//! integer the AVX-512 kernel's `sum((q + 128) * y) - 128 * sum(y)` yields), and a token's
//! outputs do not depend on the other tokens of the tile.
//!
//! # Safety
//! Every function here needs AVX2, FMA and F16C; `super::Isa::packed` only hands them out
//! when the CPU has them.

use std::arch::x86_64::*;

use super::packed_operands::{act_quad, Operands};
use super::{RawPacked, TileScales, PACK_ROWS};
use crate::blocks::{BlockQ8_0, BlockQ8_1};
use crate::GgmlType;

/// Rows per 256-bit vector: half a group.
const HALF: usize = PACK_ROWS / 2;

/// Eight f16 values (one per row of a half group) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16x8(bytes: &[u8]) -> __m256 {
    assert!(bytes.len() >= 16);
    _mm256_cvtph_ps(_mm_loadu_si128(bytes.as_ptr().cast()))
}

/// Half `h` of a 64-byte step: the 32 bytes of rows `8h..8h + 8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_half(chunk: &[u8; 64], h: usize) -> __m256i {
    let half: &[u8; 32] = chunk[32 * h..32 * h + 32].try_into().unwrap();
    _mm256_loadu_si256(half.as_ptr().cast())
}

/// The 8 vectors of half `h` of a packed 4-bit block: chunk c's low nibbles are step c, its
/// high nibbles step c + 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_steps(quants: &[u8; 256], h: usize) -> [__m256i; 8] {
    let mask4 = _mm256_set1_epi8(0xf);
    let chunks = quants.as_chunks::<64>().0;
    let mut steps = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        let bits = load_half(&chunks[c], h);
        steps[c] = _mm256_and_si256(bits, mask4);
        steps[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), mask4);
    }
    steps
}

/// The 8 vectors of half `h` of a packed 8-bit block as signed bytes `q` (the layout stores
/// `q + 128`), and their magnitudes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_byte_steps(quants: &[u8; 512], h: usize) -> ([__m256i; 8], [__m256i; 8]) {
    let bias = _mm256_set1_epi8(-128);
    let chunks = quants.as_chunks::<64>().0;
    let mut signed = [_mm256_setzero_si256(); 8];
    let mut magnitude = [_mm256_setzero_si256(); 8];
    for j in 0..8 {
        signed[j] = _mm256_xor_si256(load_half(&chunks[j], h), bias);
        magnitude[j] = _mm256_abs_epi8(signed[j]);
    }
    (signed, magnitude)
}

/// Activation bytes `4j..4j + 4` of `y` in every i32 lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quad(y: &[i8; 32], j: usize) -> __m256i {
    _mm256_set1_epi32(act_quad(y, j))
}

/// Per row (i32 lane), the dot product of the row's 32 signed weight bytes with the token's 32
/// activation bytes `y`, from [`signed_byte_steps`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_block_sums(
    (signed, magnitude): &([__m256i; 8], [__m256i; 8]),
    y: &[i8; 32],
) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let mut sums = _mm256_setzero_si256();
    for j in 0..8 {
        let pairs = _mm256_maddubs_epi16(magnitude[j], _mm256_sign_epi8(quad(y, j), signed[j]));
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, ones));
    }
    sums
}

/// Per row (i32 lane), the dot product of the row's 32 weight nibbles (step j holds values
/// 4j..4j+4 of every row) with the token's 32 activation bytes `y`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_sums(steps: &[__m256i; 8], y: &[i8; 32]) -> __m256i {
    let mut pairs = _mm256_maddubs_epi16(steps[0], quad(y, 0));
    for (j, &step) in steps.iter().enumerate().skip(1) {
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(step, quad(y, j)));
    }
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// Stores the 8 row outputs of half `h` of group `g` for each token.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_half<const T: usize>(
    acc: &[__m256; T],
    out: &mut [&mut [f32]],
    g: usize,
    h: usize,
) {
    for (rows, acc) in out.iter_mut().zip(acc) {
        let rows = &mut rows[g * PACK_ROWS + h * HALF..][..HALF];
        _mm256_storeu_ps(rows.as_mut_ptr(), *acc);
    }
}

/// Q4_1 (scales: 16 `d` then 16 `m`, f16): `d * da * sum(q * y) + m * s`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_q4_1<const T: usize>(
    groups: &[u8],
    a: &[&[u8]],
    scales: &TileScales,
    out: &mut [&mut [f32]],
) {
    let ops = Operands::<BlockQ8_1, 64, 256, T>::new(groups, a, scales, out);
    let (acts, da, sa) = (&ops.acts, ops.d, ops.s);
    for (g, blocks) in ops.each_group().enumerate() {
        for h in 0..2 {
            let mut acc = [_mm256_setzero_ps(); T];
            for (b, (sc, q)) in blocks.clone().enumerate() {
                let d = load_f16x8(&sc[16 * h..]);
                let m = load_f16x8(&sc[32 + 16 * h..]);
                let steps = nibble_steps(q, h);
                for t in 0..T {
                    let sums = _mm256_cvtepi32_ps(block_sums(&steps, &acts[t][b].qs));
                    let lane = ops.lane0 + t;
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(da[b][lane]));
                    acc[t] = _mm256_fmadd_ps(scale, sums, acc[t]);
                    acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(sa[b][lane]), acc[t]);
                }
            }
            store_half(&acc, out, g, h);
        }
    }
}

/// Q4_0 (scales: 16 `d`, f16; quants stored as `q + 8`, unsigned):
/// `d * da * (sum((q + 8) * y) - 8 * sum(y))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_q4_0<const T: usize>(
    groups: &[u8],
    a: &[&[u8]],
    scales: &TileScales,
    out: &mut [&mut [f32]],
) {
    let ops = Operands::<BlockQ8_0, 32, 256, T>::new(groups, a, scales, out);
    let (acts, da, sy) = (&ops.acts, ops.d, ops.s);
    let offset = _mm256_set1_ps(8.0);
    for (g, blocks) in ops.each_group().enumerate() {
        for h in 0..2 {
            let mut acc = [_mm256_setzero_ps(); T];
            for (b, (sc, q)) in blocks.clone().enumerate() {
                let d = load_f16x8(&sc[16 * h..]);
                let steps = nibble_steps(q, h);
                for t in 0..T {
                    let biased = _mm256_cvtepi32_ps(block_sums(&steps, &acts[t][b].qs));
                    let lane = ops.lane0 + t;
                    let sums = _mm256_fnmadd_ps(offset, _mm256_set1_ps(sy[b][lane]), biased);
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(da[b][lane]));
                    acc[t] = _mm256_fmadd_ps(scale, sums, acc[t]);
                }
            }
            store_half(&acc, out, g, h);
        }
    }
}

/// Q8_0 (scales: 16 `d`, f16; quants stored as `q + 128`): `d * da * sum(q * y)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_q8_0<const T: usize>(
    groups: &[u8],
    a: &[&[u8]],
    scales: &TileScales,
    out: &mut [&mut [f32]],
) {
    let ops = Operands::<BlockQ8_0, 32, 512, T>::new(groups, a, scales, out);
    let (acts, da) = (&ops.acts, ops.d);
    for (g, blocks) in ops.each_group().enumerate() {
        for h in 0..2 {
            let mut acc = [_mm256_setzero_ps(); T];
            for (b, (sc, q)) in blocks.clone().enumerate() {
                let d = load_f16x8(&sc[16 * h..]);
                let steps = signed_byte_steps(q, h);
                for t in 0..T {
                    let sums = _mm256_cvtepi32_ps(signed_block_sums(&steps, &acts[t][b].qs));
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(da[b][ops.lane0 + t]));
                    acc[t] = _mm256_fmadd_ps(scale, sums, acc[t]);
                }
            }
            store_half(&acc, out, g, h);
        }
    }
}

/// Declares each generic packed kernel's entry point, one per tile width (1 to 8 tokens,
/// picked by `a.len()`).
macro_rules! packed_entry_points {
    ($($kernel:ident => $entry:ident),* $(,)?) => {
        $(
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $entry(
                groups: &[u8],
                a: &[&[u8]],
                scales: &TileScales,
                out: &mut [&mut [f32]],
            ) {
                match a.len() {
                    8 => $kernel::<8>(groups, a, scales, out),
                    7 => $kernel::<7>(groups, a, scales, out),
                    6 => $kernel::<6>(groups, a, scales, out),
                    5 => $kernel::<5>(groups, a, scales, out),
                    4 => $kernel::<4>(groups, a, scales, out),
                    3 => $kernel::<3>(groups, a, scales, out),
                    2 => $kernel::<2>(groups, a, scales, out),
                    1 => $kernel::<1>(groups, a, scales, out),
                    n => panic!("no packed tile of {n} tokens"),
                }
            }
        )*
    };
}

packed_entry_points!(
    packed_q4_0 => q4_0_entry,
    packed_q4_1 => q4_1_entry,
    packed_q8_0 => q8_0_entry,
);

/// The packed kernel for weights of type `ty`.
pub(crate) fn packed_kernel(ty: GgmlType) -> Option<RawPacked> {
    match ty {
        GgmlType::Q4_0 => Some(q4_0_entry),
        GgmlType::Q4_1 => Some(q4_1_entry),
        GgmlType::Q8_0 => Some(q8_0_entry),
        _ => None,
    }
}
