//! IQ2_XS against one token, four chunks of 32 values a step: the 16 pieces' grid indices
//! masked in one vector and read back from the stack, their sign bytes made whole in vectors
//! (the eighth sign is the parity of the seven stored), and each group's scale picked from
//! the block's 16 with one shuffle, where the other codebook formats' product
//! (`signed_grid_q8_k`) takes each piece apart in scalar registers. The integer sum of each
//! block is the same, and becomes a float the same way (`grid_block_sum`), so the products
//! have the bits of the format's other kernels.

use std::arch::x86_64::*;

use super::{grid_block_sum, grid_d, load_i8, ones_by_bit, SCALE_PICKS};
use crate::blocks::{as_blocks, BlockIq2Xs, BlockQ8K, IQ2XS_GRID};

/// 0x80 for a nibble of odd parity, 0 otherwise: what a 7-bit sign index lacks of its byte.
const ODD_PARITY: [u8; 16] = {
    let mut table = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        if (i as u32).count_ones() % 2 == 1 {
            table[i] = 0x80;
        }
        i += 1;
    }
    table
};

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq2_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let parity = _mm256_broadcastsi128_si256(_mm_loadu_si128(ODD_PARITY.as_ptr().cast()));
    // Byte 2l (low 128-bit lane) and 2l + 4 (high) of a chunk's sign bytes, 8 times each; the
    // second chunk of a 128-bit lane's two is 8 bytes on.
    let spread = _mm256_setr_epi64x(
        0,
        0x0202_0202_0202_0202,
        0x0404_0404_0404_0404,
        0x0606_0606_0606_0606,
    );
    let mut acc = 0.0f32;
    for (w, a) in as_blocks::<BlockIq2Xs>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let scales = group_scales(&w.scales);
        let y = a.qs.as_chunks::<32>().0;
        let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for (half, q) in w.qs.as_chunks::<32>().0.iter().enumerate() {
            let q = _mm256_loadu_si256(q.as_ptr().cast());
            let mut index = [0u16; 16];
            let grid_bits = _mm256_and_si256(q, _mm256_set1_epi16(511));
            _mm256_storeu_si256(index.as_mut_ptr().cast(), grid_bits);
            // Piece k's sign byte in byte 2k of its 128-bit lane (pieces 0..8 in the low one).
            let low = _mm256_srli_epi16::<9>(q);
            let folded = _mm256_xor_si256(low, _mm256_srli_epi16::<13>(q));
            let signs = _mm256_or_si256(low, _mm256_shuffle_epi8(parity, folded));
            let lanes = [
                _mm256_permute2x128_si256::<0x00>(signs, signs),
                _mm256_permute2x128_si256::<0x11>(signs, signs),
            ];
            for c in 0..4 {
                let chunk = 4 * half + c;
                let i: [usize; 4] = std::array::from_fn(|l| usize::from(index[4 * c + l]));
                let magnitudes = _mm256_set_epi64x(
                    IQ2XS_GRID[i[3]] as i64,
                    IQ2XS_GRID[i[2]] as i64,
                    IQ2XS_GRID[i[1]] as i64,
                    IQ2XS_GRID[i[0]] as i64,
                );
                let at = _mm256_add_epi8(spread, _mm256_set1_epi8(8 * (c % 2) as i8));
                let sign_bytes = _mm256_shuffle_epi8(lanes[c / 2], at);
                let signed = _mm256_sign_epi8(load_i8(&y[chunk]), ones_by_bit(sign_bytes));
                let pairs = _mm256_maddubs_epi16(magnitudes, signed);
                let pick = _mm256_loadu_si256(SCALE_PICKS[chunk].as_ptr().cast());
                let sum = _mm256_madd_epi16(pairs, _mm256_shuffle_epi8(scales, pick));
                if c % 2 == 0 {
                    even = _mm256_add_epi32(even, sum);
                } else {
                    odd = _mm256_add_epi32(odd, sum);
                }
            }
        }
        acc = grid_block_sum(acc, grid_d(w) * a.d(), _mm256_add_epi32(even, odd));
    }
    acc
}

/// The 16 group scales `2s + 1` (nibble g of `scales`, low first), byte g of both 128-bit
/// lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_scales(scales: &[u8; 8]) -> __m256i {
    let x = _mm_loadl_epi64(scales.as_ptr().cast());
    let low4 = _mm_set1_epi8(0x0f);
    let nibbles = _mm_unpacklo_epi8(
        _mm_and_si128(x, low4),
        _mm_and_si128(_mm_srli_epi16::<4>(x), low4),
    );
    let scales = _mm_add_epi8(_mm_add_epi8(nibbles, nibbles), _mm_set1_epi8(1));
    _mm256_broadcastsi128_si256(scales)
}
