//! The IQ1 formats against one token. A value is `8 * grid ± 1`: a grid byte -1, 0 or 1 of an
//! [`IQ1S_GRID`] entry, and a shift whose sign the 8 values of an entry (IQ1_M) or the 32 of a
//! chunk (IQ1_S) share. A chunk's sum is 8 times its grid bytes' against the activations (the
//! bytes moved onto them with `vpsignb`, summed in pairs by `vpmaddubsw` against ones) plus its
//! shifts'; the kernels keep the two apart and put them together once per block. These are the
//! integer sums of `signed_grid_q8_k`, which builds the `8 * grid ± 1` bytes and multiplies
//! them, so the products have the bits of the formats' other kernels.
//!
//! Where BMI2's `pdep` is fast, it lays a chunk's four grid indices out as u16s in two
//! instructions (`super::pdep_vec_dot`); IQ1_M's kernel here does not take the place of
//! `signed_grid_q8_k` without it (2.02 ns per 32 values against 1.90, Zen 5).

use std::arch::x86_64::*;

use super::{chunk_scale, grid_block_sum, grid_d, load_i8, load_u8, signed_grid_q8_k};
use crate::blocks::{as_blocks, BlockIq1M, BlockIq1S, BlockQ8K, SignedGridBlock, IQ1S_GRID};
use crate::kernels::RawVecDot;
use crate::GgmlType;

/// The one-token product of IQ1 format `ty` (`None` for the other formats), with `pdep` or
/// without.
pub(crate) fn vec_dot(ty: GgmlType, fast_pdep: bool) -> Option<RawVecDot> {
    match (ty, fast_pdep) {
        (GgmlType::IQ1_S, true) => Some(iq1_s_q8_k_pdep),
        (GgmlType::IQ1_S, false) => Some(iq1_s_q8_k),
        (GgmlType::IQ1_M, true) => Some(iq1_m_q8_k_pdep),
        (GgmlType::IQ1_M, false) => Some(signed_grid_q8_k::<BlockIq1M>),
        _ => None,
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1_s_q8_k(w: &[u8], a: &[u8]) -> f32 {
    iq1_s::<false>(w, a)
}

#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn iq1_s_q8_k_pdep(w: &[u8], a: &[u8]) -> f32 {
    iq1_s::<true>(w, a)
}

/// IQ1_S, whose shift's sign a chunk of 32 shares: a chunk's shifts sum to plus or minus the
/// sum of its activations, which the Q8_K block holds (`bsums`), taken for the whole block at
/// once.
#[inline(always)]
unsafe fn iq1_s<const PDEP: bool>(w: &[u8], a: &[u8]) -> f32 {
    let ones = _mm256_set1_epi8(1);
    let mut acc = 0.0;
    for (w, a) in as_blocks::<BlockIq1S>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        // Chunk c's u16 of `qh` holds the `s` of its scale `2s + 1` in bits 12..15 and its
        // shift's sign in bit 15: here i16 c of `scales` and of `negative` (0 or -1).
        let qh = _mm_loadu_si128(w.qh.as_ptr().cast());
        let s = _mm_and_si128(_mm_srli_epi16::<12>(qh), _mm_set1_epi16(7));
        let scales = _mm_or_si128(_mm_slli_epi16::<1>(s), _mm_set1_epi16(1));
        let negative = _mm_srai_epi16::<15>(qh);
        // As `scale_bytes` lays them out: group g's (chunk g / 2's) in byte g of both lanes.
        let bytes = _mm_packus_epi16(scales, scales);
        let group_bytes = _mm256_broadcastsi128_si256(_mm_unpacklo_epi8(bytes, bytes));
        let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for (c, y) in a.qs.as_chunks::<32>().0.iter().enumerate() {
            let grid = if PDEP {
                // The top three bits of entry l's index: bits 3l..3l + 3 of the chunk's u16.
                pdep_grid(&w.qs, &w.qh, c, 0x0700_0700_0700_0700)
            } else {
                let (entries, _) = w.shifted_entries(c).expect("IQ1_S's entries are shifted");
                let [e0, e1, e2, e3] = entries.map(|e| e as i64);
                _mm256_set_epi64x(e3, e2, e1, e0)
            };
            let pairs = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(load_i8(y), grid));
            let sum = _mm256_madd_epi16(pairs, chunk_scale(w, group_bytes, c));
            if c % 2 == 0 {
                even = _mm256_add_epi32(even, sum);
            } else {
                odd = _mm256_add_epi32(odd, sum);
            }
        }
        let grid_sums = _mm256_slli_epi32::<3>(_mm256_add_epi32(even, odd));
        // Each chunk's scale with its shift's sign, in both i16 of i32 lane c (groups 2c and
        // 2c + 1), against the sums of the groups' activations.
        let signed = _mm_sub_epi16(_mm_xor_si128(scales, negative), negative);
        let signed = _mm256_cvtepu16_epi32(signed);
        let signed = _mm256_or_si256(signed, _mm256_slli_epi32::<16>(signed));
        let shift_sums = _mm256_madd_epi16(signed, load_u8(&a.bsums));
        acc = grid_block_sum(
            acc,
            grid_d(w) * a.d(),
            _mm256_add_epi32(grid_sums, shift_sums),
        );
    }
    acc
}

/// IQ1_M, whose shift's sign each entry of 8 values has: a chunk's shifts are 1 or -1 bytes
/// against the activations, as its grid bytes are.
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn iq1_m_q8_k_pdep(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0.0;
    for (w, a) in as_blocks::<BlockIq1M>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let scales = iq1_m_scale_bytes(w);
        let (mut grid_sums, mut shift_sums) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let y = a.qs.as_chunks::<32>().0;
        // Two chunks a step: one a step ran 1.08 times as long, four 1.06 times.
        for c in (0..8).step_by(2) {
            let (g, s) = iq1_m_chunk(w, &y[c], scales, c);
            let (g2, s2) = iq1_m_chunk(w, &y[c + 1], scales, c + 1);
            grid_sums = _mm256_add_epi32(grid_sums, _mm256_add_epi32(g, g2));
            shift_sums = _mm256_add_epi32(shift_sums, _mm256_add_epi32(s, s2));
        }
        let sumi = _mm256_add_epi32(_mm256_slli_epi32::<3>(grid_sums), shift_sums);
        acc = grid_block_sum(acc, grid_d(w) * a.d(), sumi);
    }
    acc
}

/// An IQ1_M block's 16 group scales `2s + 1` as `super::scale_bytes` lays them out (byte g of
/// both 128-bit lanes): group `4k + q`'s `s` is bits `3q..3q + 3` of u16 k of `scales`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1_m_scale_bytes(w: &BlockIq1M) -> __m256i {
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

/// IQ1_M chunk `c`'s grid and shift sums, times its group scales, in i32 lanes.
#[inline(always)]
unsafe fn iq1_m_chunk(
    w: &BlockIq1M,
    y: &[i8; 32],
    scales: __m256i,
    c: usize,
) -> (__m256i, __m256i) {
    let ones = _mm256_set1_epi8(1);
    // Nibble l of the chunk's u16 of `qh`: the top three bits of entry l's index, and the
    // sign of its shift (bit 3, which the index drops).
    let grid = pdep_grid(&w.qs, &w.qh, c, 0x0f00_0f00_0f00_0f00);
    // Bit 3 of nibble l to the top of byte l, each byte then widened to its entry's 8 and
    // made 1 or negative.
    let high = u32::from(u16::from_le_bytes([w.qh[2 * c], w.qh[2 * c + 1]]));
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

/// Chunk `c`'s four grid entries: entry l's index is byte l of the chunk's u32 of `qs` below
/// the bits that `pdep` moves from its u16 of `qh` into bits 8..11 of u16 l through `tops`
/// (bit 11 dropped). Only for a caller with BMI2.
#[inline(always)]
unsafe fn pdep_grid(qs: &[u8; 32], qh: &[u8; 16], c: usize, tops: u64) -> __m256i {
    let low = u32::from_le_bytes([qs[4 * c], qs[4 * c + 1], qs[4 * c + 2], qs[4 * c + 3]]);
    let high = u16::from_le_bytes([qh[2 * c], qh[2 * c + 1]]);
    let indices =
        _pdep_u64(u64::from(low), 0x00ff_00ff_00ff_00ff) | _pdep_u64(u64::from(high), tops);
    let entry = |l: u32| IQ1S_GRID[((indices >> (16 * l)) & 0x7ff) as usize] as i64;
    _mm256_set_epi64x(entry(3), entry(2), entry(1), entry(0))
}
