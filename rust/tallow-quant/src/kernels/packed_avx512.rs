//! AVX-512 kernels for weights packed in groups of [`PACK_ROWS`] rows (the layout is
//! described in `crate::packed`). Each i32 lane of a vector belongs to one weight row: a
//! block of 32 weights of all 16 rows against one token is 8 byte dot products, each with four
//! activation bytes broadcast to every lane, and needs no horizontal sum. The unpacked
//! weights of a block are reused by every token of the tile.
//!
//! Per token, the work is the same whatever the number of tokens in the tile (the same
//! integer sums, then the same f32 operations in the same order), so a token's outputs do
//! not depend on which other tokens share its tile.
//!
//! The kernels read their groups front to back and prefetch nothing themselves: the weights
//! are one stream, which the hardware prefetcher follows at the memory's pace, and software
//! prefetches in the loop measured slower (each holds a load slot while its line arrives).
//!
//! # Safety
//! As in `super::avx512`: AVX-512 F and BW (plus VNNI for the `vnni` entry points), only
//! handed out by `super::Isa::kernels` when the CPU has them.

use std::arch::x86_64::*;

use super::avx512::{Bw, DotBytes, Vnni};
use super::packed_operands::{act_quad, Operands};
use super::{TileScales, PACK_ROWS};
use crate::blocks::{BlockQ8_0, BlockQ8_1};

/// Sixteen f16 values (one per row) as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load_f16x16(bytes: &[u8]) -> __m512 {
    assert!(bytes.len() >= 32);
    _mm512_cvtph_ps(_mm256_loadu_si256(bytes.as_ptr().cast()))
}

/// The 8 vectors of a packed 4-bit block: chunk c's low nibbles are step c, its high nibbles
/// step c + 4.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn nibble_steps(quants: &[u8; 256]) -> [__m512i; 8] {
    let mask4 = _mm512_set1_epi8(0xf);
    let chunks = quants.as_chunks::<64>().0;
    let mut steps = [_mm512_setzero_si512(); 8];
    for c in 0..4 {
        let bits = _mm512_loadu_si512(chunks[c].as_ptr().cast());
        steps[c] = _mm512_and_si512(bits, mask4);
        steps[c + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(bits), mask4);
    }
    steps
}

/// The 8 vectors of a packed 8-bit block (already offset to unsigned bytes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn byte_steps(quants: &[u8; 512]) -> [__m512i; 8] {
    let chunks = quants.as_chunks::<64>().0;
    std::array::from_fn(|j| _mm512_loadu_si512(chunks[j].as_ptr().cast()))
}

/// Per row (i32 lane), the dot product of the row's 32 unsigned weight bytes (step j holds
/// bytes 4j..4j+4 of every row) with the token's 32 activation bytes `y`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn block_sums<D: DotBytes>(steps: &[__m512i; 8], y: &[i8; 32]) -> __m512i {
    let quad = |j: usize| _mm512_set1_epi32(act_quad(y, j));
    // Two chains of four, so that one token's block is not one long dependency chain.
    let zero = _mm512_setzero_si512();
    let mut lo = zero;
    let mut hi = zero;
    for j in 0..4 {
        lo = D::dot(lo, steps[j], quad(j));
        hi = D::dot(hi, steps[j + 4], quad(j + 4));
    }
    _mm512_add_epi32(lo, hi)
}

/// Stores the 16 row outputs of each token for group `g`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn store_rows<const T: usize>(acc: &[__m512; T], out: &mut [&mut [f32]], g: usize) {
    for (rows, acc) in out.iter_mut().zip(acc) {
        let rows = &mut rows[g * PACK_ROWS..(g + 1) * PACK_ROWS];
        _mm512_storeu_ps(rows.as_mut_ptr(), *acc);
    }
}

/// Q4_1 (scales: 16 `d` then 16 `m`, f16): `d * da * sum(q * y) + m * s`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn packed_q4_1<D: DotBytes, const T: usize>(
    groups: &[u8],
    a: &[&[u8]],
    scales: &TileScales,
    out: &mut [&mut [f32]],
) {
    let ops = Operands::<BlockQ8_1, [u8; 64], [u8; 256], T>::new(groups, a, scales, out);
    let (acts, da, sa) = (&ops.acts, ops.d, ops.s);
    for (g, blocks) in ops.each_group().enumerate() {
        let mut acc = [_mm512_setzero_ps(); T];
        for (b, (sc, q)) in blocks.enumerate() {
            let d = load_f16x16(&sc[..32]);
            let m = load_f16x16(&sc[32..]);
            let steps = nibble_steps(q);
            for t in 0..T {
                let sums = _mm512_cvtepi32_ps(block_sums::<D>(&steps, &acts[t][b].qs));
                let lane = ops.lane0 + t;
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(da[b][lane]));
                acc[t] = _mm512_fmadd_ps(scale, sums, acc[t]);
                acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(sa[b][lane]), acc[t]);
            }
        }
        store_rows(&acc, out, g);
    }
}

/// Q4_0 and Q8_0 (scales: 16 `d`, f16; quants stored as `q + offset`, unsigned):
/// `d * da * (sum((q + offset) * y) - offset * sum(y))`. Both integer sums are exact in
/// f32 (below 2^21 in magnitude), and so is their difference.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn packed_offset<D: DotBytes, const Q: usize, const T: usize>(
    groups: &[u8],
    a: &[&[u8]],
    scales: &TileScales,
    out: &mut [&mut [f32]],
    offset: f32,
    steps: unsafe fn(&[u8; Q]) -> [__m512i; 8],
) {
    let ops = Operands::<BlockQ8_0, [u8; 32], [u8; Q], T>::new(groups, a, scales, out);
    let (acts, da, sy) = (&ops.acts, ops.d, ops.s);
    let offset = _mm512_set1_ps(offset);
    for (g, blocks) in ops.each_group().enumerate() {
        let mut acc = [_mm512_setzero_ps(); T];
        for (b, (sc, q)) in blocks.enumerate() {
            let d = load_f16x16(sc);
            let steps = steps(q);
            for t in 0..T {
                let biased = _mm512_cvtepi32_ps(block_sums::<D>(&steps, &acts[t][b].qs));
                let lane = ops.lane0 + t;
                let sums = _mm512_fnmadd_ps(offset, _mm512_set1_ps(sy[b][lane]), biased);
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(da[b][lane]));
                acc[t] = _mm512_fmadd_ps(scale, sums, acc[t]);
            }
        }
        store_rows(&acc, out, g);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn packed_q4_0<D: DotBytes, const T: usize>(
    groups: &[u8],
    a: &[&[u8]],
    scales: &TileScales,
    out: &mut [&mut [f32]],
) {
    packed_offset::<D, 256, T>(groups, a, scales, out, 8.0, nibble_steps);
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn packed_q8_0<D: DotBytes, const T: usize>(
    groups: &[u8],
    a: &[&[u8]],
    scales: &TileScales,
    out: &mut [&mut [f32]],
) {
    packed_offset::<D, 512, T>(groups, a, scales, out, 128.0, byte_steps);
}

/// Declares each generic packed kernel's entry points in modules `packed_bw` and
/// `packed_vnni`, one per tile width (1 to 8 tokens, picked by `a.len()`).
macro_rules! packed_entry_points {
    ($($kernel:ident),* $(,)?) => {
        packed_entry_points!(@module packed_bw, Bw, "avx512f,avx512bw", $($kernel),*);
        packed_entry_points!(@module packed_vnni, Vnni, "avx512f,avx512bw,avx512vnni", $($kernel),*);
    };
    (@module $module:ident, $dot:ident, $features:literal, $($kernel:ident),*) => {
        pub(super) mod $module {
            use super::{$dot, TileScales};
            $(
                #[target_feature(enable = $features)]
                pub(in crate::kernels) unsafe fn $kernel(
                    groups: &[u8],
                    a: &[&[u8]],
                    scales: &TileScales,
                    out: &mut [&mut [f32]],
                ) {
                    match a.len() {
                        8 => super::$kernel::<$dot, 8>(groups, a, scales, out),
                        7 => super::$kernel::<$dot, 7>(groups, a, scales, out),
                        6 => super::$kernel::<$dot, 6>(groups, a, scales, out),
                        5 => super::$kernel::<$dot, 5>(groups, a, scales, out),
                        4 => super::$kernel::<$dot, 4>(groups, a, scales, out),
                        3 => super::$kernel::<$dot, 3>(groups, a, scales, out),
                        2 => super::$kernel::<$dot, 2>(groups, a, scales, out),
                        1 => super::$kernel::<$dot, 1>(groups, a, scales, out),
                        n => panic!("no packed tile of {n} tokens"),
                    }
                }
            )*
        }
    };
}

packed_entry_points!(packed_q4_0, packed_q4_1, packed_q8_0);
