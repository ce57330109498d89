//! The ternary formats (TQ1_0, TQ2_0): each 32 values' base-3 digits `t` (the value plus one,
//! 0..=2) taken from the block's bytes in registers, multiplied as unsigned bytes
//! (`vpmaddubsw`) and summed as i16 over the whole block (at most 8 x 2 x 2 x 128), the
//! activations' sum taken back once, as i16, from the Q8_K group sums: `sum((t - 1) y) = sum(t y) -
//! sum(y)`. The block's integer sum is the scalar decoding's, so the products have its bits.

use std::arch::x86_64::*;

use super::{grid_block_sum, grid_d, load_i8, load_u8, tile_operands};
use crate::blocks::{as_blocks, BlockQ8K, BlockTq1_0, BlockTq2_0, GridBlock};
use crate::kernels::TileScales;

/// A ternary block as the AVX2 kernels read it.
pub(super) trait Ternary: GridBlock {
    /// The block's values plus one (0..=2), 32 to a vector, in element order.
    unsafe fn digits(&self) -> [__m256i; 8];
}

impl Ternary for BlockTq2_0 {
    /// Byte `32h + m` holds values `128h + 32l + m` at bits `2l..2l + 2`.
    #[inline(always)]
    unsafe fn digits(&self) -> [__m256i; 8] {
        let three = _mm256_set1_epi8(3);
        let mut out = [_mm256_setzero_si256(); 8];
        for (h, bytes) in self.qs.as_chunks::<32>().0.iter().enumerate() {
            let bytes = load_u8(bytes);
            out[4 * h] = _mm256_and_si256(bytes, three);
            out[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16::<2>(bytes), three);
            out[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), three);
            out[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16::<6>(bytes), three);
        }
        out
    }
}

impl Ternary for BlockTq1_0 {
    /// Digit `n` of a byte is `(byte * 3^n mod 256) * 3 >> 8`. Values 0..160 are digits 0..5
    /// of `qs[..32]` (32 values a digit), 160..240 digits 0..5 of `qs[32..]` (16 a digit),
    /// 240..256 digits 0..4 of `qh` (4 a digit).
    #[inline(always)]
    unsafe fn digits(&self) -> [__m256i; 8] {
        let (head, tail) = self.qs.split_at(32);
        let p0 = _mm256_loadu_si256(head.as_ptr().cast());
        let p1 = times3(p0);
        let p2 = times9(p0);
        let p3 = times9(p1);
        let p4 = times9(p2);
        // The 16 tail bytes times 1 in the low lane and 3 in the high one, then 9 and 27, then
        // 81 (the low lane of the next product).
        let tail = _mm256_broadcastsi128_si256(_mm_loadu_si128(tail.as_ptr().cast()));
        let q01 = _mm256_blend_epi32::<0xf0>(tail, times3(tail));
        let q23 = times9(q01);
        let q4 = times9(q23);
        // The four `qh` bytes times 1, 3, 9 and 27, four bytes each (as the tail's, in the
        // four 32-bit lanes of one vector).
        let h = _mm256_set1_epi32(i32::from_le_bytes(self.qh));
        let (h3, h9) = (times3(h), times9(h));
        let h27 = times9(h3);
        let h = _mm256_blend_epi32::<0b1000>(
            _mm256_blend_epi32::<0b0100>(_mm256_blend_epi32::<0b0010>(h, h3), h9),
            h27,
        );
        let q4h = _mm256_inserti128_si256::<1>(q4, _mm256_castsi256_si128(h));
        let mut out = [p0, p1, p2, p3, p4, q01, q23, q4h];
        // A loop, not `map`: a closure would not take the caller's target features.
        for p in &mut out {
            *p = top_digit(*p);
        }
        out
    }
}

/// `3p mod 256` in every byte.
#[inline(always)]
unsafe fn times3(p: __m256i) -> __m256i {
    _mm256_add_epi8(p, _mm256_add_epi8(p, p))
}

/// `9p mod 256` in every byte: `8p` (a 16-bit shift with the bits that crossed into the next
/// byte masked off) plus `p`.
#[inline(always)]
unsafe fn times9(p: __m256i) -> __m256i {
    let eight = _mm256_and_si256(_mm256_slli_epi16::<3>(p), _mm256_set1_epi8(-8));
    _mm256_add_epi8(eight, p)
}

/// `p * 3 >> 8` in every byte: 1 from 86 on, 2 from 171 on.
#[inline(always)]
unsafe fn top_digit(p: __m256i) -> __m256i {
    // Each comparison is -1 where the byte is at least its bound.
    let one = _mm256_cmpeq_epi8(_mm256_max_epu8(p, _mm256_set1_epi8(86)), p);
    let two = _mm256_cmpeq_epi8(_mm256_max_epu8(p, _mm256_set1_epi8(171u8 as i8)), p);
    _mm256_abs_epi8(_mm256_add_epi8(one, two))
}

/// The integer sum of a ternary block (as `digits` gives it) against one Q8_K block, spread
/// over i32 lanes.
#[inline(always)]
unsafe fn block_sum(digits: &[__m256i; 8], a: &BlockQ8K) -> __m256i {
    let mut pairs = _mm256_setzero_si256();
    for (&t, y) in digits.iter().zip(a.qs.as_chunks::<32>().0) {
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(t, load_i8(y)));
    }
    // The group sums (at most 16 x 128) taken from the pair sums as i16: the lanes' total is
    // what counts.
    let pairs = _mm256_sub_epi16(pairs, load_u8(&a.bsums));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// A row of ternary blocks against one token.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn ternary_q8_k<B: Ternary>(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0.0;
    for (w, a) in as_blocks::<B>(w).iter().zip(as_blocks::<BlockQ8K>(a)) {
        acc = grid_block_sum(acc, grid_d(w) * a.d(), block_sum(&w.digits(), a));
    }
    acc
}

/// A row of ternary blocks against up to 8 tokens, each block's digits taken once.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile_ternary_q8_k<B: Ternary, const T: usize>(
    w: &[u8],
    a: crate::kernels::TileActs,
    scales: &TileScales,
    out: &mut [f32],
) {
    let (w, a) = tile_operands::<B, BlockQ8K, T>(w, a, scales, out);
    let mut acc = [0f32; T];
    for (b, w) in w.iter().enumerate() {
        let digits = w.digits();
        let wd = grid_d(w);
        for t in 0..T {
            acc[t] = grid_block_sum(acc[t], wd * a[t][b].d(), block_sum(&digits, &a[t][b]));
        }
    }
    out.copy_from_slice(&acc);
}

/// The block's values (`digits - 1`), for the decoded rows of many-token products.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn values<B: Ternary>(w: &B) -> [__m256i; 8] {
    let mut values = w.digits();
    for v in &mut values {
        *v = _mm256_sub_epi8(*v, _mm256_set1_epi8(1));
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `top_digit` against the scalar digit of every byte value.
    #[test]
    fn top_digit_is_the_scaled_byte_s_top_base3_digit() {
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        for start in (0..256).step_by(32) {
            let bytes: [u8; 32] = std::array::from_fn(|i| (start + i) as u8);
            let mut got = [0u8; 32];
            // SAFETY: AVX2 is present (checked above).
            unsafe {
                let d = top_digit(_mm256_loadu_si256(bytes.as_ptr().cast()));
                _mm256_storeu_si256(got.as_mut_ptr().cast(), d);
            }
            let want = bytes.map(|p| ((u16::from(p) * 3) >> 8) as u8);
            assert_eq!(got, want, "bytes {start}..{}", start + 32);
        }
    }
}
