//! IQ1_M against one token, where BMI2's `pdep` is fast. A value is `8 * grid ± 1`, the grid
//! byte -1, 0 or 1 and the sign of the 1 shared by the 8 values of an entry: a chunk's sum is
//! 8 times its grid bytes' against the activations plus its entries' shifts', each moved onto
//! the activations with `vpsignb` and summed in pairs by `vpmaddubsw` against ones, the two
//! sums put together once per block. `pdep` lays a chunk's four grid indices out as u16s
//! (two instructions where shifts and masks take a dozen) and spreads its four shift signs
//! over bytes. The integer sums of `signed_grid_q8_k`, which builds the `8 * grid ± 1` bytes
//! and multiplies them, so the products have the bits of the format's other kernels.

use std::arch::x86_64::*;

use super::{chunk_scale, grid_block_sum, grid_d, load_i8};
use crate::blocks::{as_blocks, BlockIq1M, BlockQ8K, IQ1S_GRID};

#[target_feature(enable = "avx2,fma,f16c,bmi2")]
pub(super) unsafe fn iq1_m_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0.0;
    for (w, a) in as_blocks::<BlockIq1M>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let scales = scale_bytes(w);
        let (mut grid_sums, mut shift_sums) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let y = a.qs.as_chunks::<32>().0;
        // Two chunks a step: one a step ran 1.08 times as long, four 1.06 times.
        for c in (0..8).step_by(2) {
            let (g, s) = chunk_sums(w, &y[c], scales, c);
            let (g2, s2) = chunk_sums(w, &y[c + 1], scales, c + 1);
            grid_sums = _mm256_add_epi32(grid_sums, _mm256_add_epi32(g, g2));
            shift_sums = _mm256_add_epi32(shift_sums, _mm256_add_epi32(s, s2));
        }
        let sumi = _mm256_add_epi32(_mm256_slli_epi32::<3>(grid_sums), shift_sums);
        acc = grid_block_sum(acc, grid_d(w) * a.d(), sumi);
    }
    acc
}

/// The block's 16 group scales `2s + 1` as `super::scale_bytes` lays them out (byte g of
/// both 128-bit lanes): group `4k + q`'s `s` is bits `3q..3q + 3` of u16 k of `scales`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_bytes(w: &BlockIq1M) -> __m256i {
    let all = _mm_set1_epi64x(i64::from_le_bytes(w.scales));
    let seven = _mm_set1_epi16(7);
    // i16 k of u64 q: group 4k + q (u64s 0 and 1), 4k + 2 + q (u64s 2 and 3).
    let first = _mm_and_si128(_mm_srlv_epi64(all, _mm_set_epi64x(3, 0)), seven);
    let second = _mm_and_si128(_mm_srlv_epi64(all, _mm_set_epi64x(9, 6)), seven);
    // Byte 4q + k holds group 4k + q: transposed, byte g holds group g.
    let s = _mm_packus_epi16(first, second);
    let s = _mm_shuffle_epi8(
        s,
        _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
    );
    _mm256_broadcastsi128_si256(_mm_or_si128(_mm_add_epi8(s, s), _mm_set1_epi8(1)))
}

/// Chunk `c`'s grid and shift sums, times its group scales, in i32 lanes.
#[inline(always)]
unsafe fn chunk_sums(w: &BlockIq1M, y: &[i8; 32], scales: __m256i, c: usize) -> (__m256i, __m256i) {
    let ones = _mm256_set1_epi8(1);
    let low = u32::from_le_bytes(w.qs[4 * c..4 * c + 4].try_into().unwrap());
    let high = u32::from(u16::from_le_bytes([w.qh[2 * c], w.qh[2 * c + 1]]));
    // Entry l's index in u16 l: byte l of `low` below the low three bits of nibble l
    // of `high`.
    let indices = _pdep_u64(u64::from(low), 0x00ff_00ff_00ff_00ff)
        | _pdep_u64(u64::from(high & 0x7777), 0x0f00_0f00_0f00_0f00);
    let entry = |l: u32| IQ1S_GRID[((indices >> (16 * l)) & 0x7ff) as usize] as i64;
    let grid = _mm256_set_epi64x(entry(3), entry(2), entry(1), entry(0));
    // Bit 3 of nibble l (the sign of entry l's shift) to the top of byte l, each byte
    // then widened to its entry's 8 and made 1 or negative.
    let signs = _pdep_u32(high & 0x8888, 0xf0f0_f0f0);
    let shifts = _mm256_cvtepi8_epi64(_mm_cvtsi32_si128(signs as i32));
    let shifts = _mm256_or_si256(shifts, ones);
    let y = load_i8(y);
    let scale = chunk_scale(w, scales, c);
    let pairs = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(y, grid));
    let grid_sum = _mm256_madd_epi16(pairs, scale);
    let pairs = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(y, shifts));
    (grid_sum, _mm256_madd_epi16(pairs, scale))
}
