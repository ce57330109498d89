//! The codebook formats (IQ1, IQ2, IQ3, TQ), and Q3_K, decoded once for many tokens.
//! Gathering a block's codebook entries costs more than multiplying it by one token, so a
//! product of many tokens decodes each weight row once into [`DecodedBlock`]s, bytes that
//! multiply as they are, and then runs every token against them ([`tile`]). The integer sum
//! of each block is exact whichever way it is taken, and these formats' dot products and
//! tiles turn it into a float once per block (`grid_block_sum`), so the decoded tiles give
//! their bits.

use std::arch::x86_64::*;

use super::ternary::{self, Ternary};
use super::{
    grid_d, load_i8, load_u8, q3_k_chunk, scale_vectors, signed_chunks, tile_entry_points,
};
use crate::blocks::{
    as_blocks, as_blocks_mut, q3k_scales, Block, BlockQ3K, BlockQ8K, SignedGridBlock,
};
use crate::kernels::x86::tile_operands;
use crate::kernels::{RawDecoding, TileScales};

/// What a decoded value is stored above: values lie within -62..=62, so `value + OFFSET` is an
/// unsigned byte under 127 (a `vpmaddubsw` pair against activations within -127..=127 stays
/// within i16).
const OFFSET: i16 = 64;

/// One grid block decoded: its 256 values plus [`OFFSET`], the `vpmaddwd` scale vector of each
/// 32 values (as `scale_vectors` builds them), each group scale times `-OFFSET` (what the
/// offset adds, taken back through the activations' group sums) and `d * UNIT` (an f32).
#[repr(C)]
pub(crate) struct DecodedBlock {
    pub(in crate::kernels::x86) values: [[u8; 32]; 8],
    pub(in crate::kernels::x86) scales: [[u8; 32]; 8],
    pub(in crate::kernels::x86) offsets: [u8; 32],
    d: [u8; 4],
}

// SAFETY: byte arrays only: alignment 1, any bit pattern.
unsafe impl Block for DecodedBlock {}

/// The decoding of the IQ1, IQ2 and IQ3 formats.
pub(super) const fn signed<B: SignedGridBlock>() -> RawDecoding {
    RawDecoding {
        decode: decode_signed::<B>,
        tile,
        block_bytes: size_of::<DecodedBlock>(),
    }
}

/// The decoding of Q3_K.
pub(super) const fn q3_k() -> RawDecoding {
    RawDecoding {
        decode: decode_q3_k,
        tile,
        block_bytes: size_of::<DecodedBlock>(),
    }
}

/// The decoding of the ternary formats.
pub(super) const fn ternary<B: Ternary>() -> RawDecoding {
    RawDecoding {
        decode: decode_ternary::<B>,
        tile,
        block_bytes: size_of::<DecodedBlock>(),
    }
}

/// Writes a decoded block: `values` are the block's 32-value chunks, signed.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn write(out: &mut DecodedBlock, values: [__m256i; 8], scales: &[i32; 16], d: f32) {
    let offset = _mm256_set1_epi8(OFFSET as i8);
    for (dst, v) in out.values.iter_mut().zip(values) {
        _mm256_storeu_si256(dst.as_mut_ptr().cast(), _mm256_add_epi8(v, offset));
    }
    for (dst, v) in out.scales.iter_mut().zip(scale_vectors(scales)) {
        _mm256_storeu_si256(dst.as_mut_ptr().cast(), v);
    }
    for (dst, &s) in out.offsets.as_chunks_mut::<2>().0.iter_mut().zip(scales) {
        // At most 64 * 31.
        *dst = (-OFFSET * s as i16).to_le_bytes();
    }
    out.d = d.to_le_bytes();
}

/// Decodes a row of IQ1/IQ2/IQ3 blocks `w` into `out`, one [`DecodedBlock`] each.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_signed<B: SignedGridBlock>(w: &[u8], out: &mut [u8]) {
    for (w, out) in as_blocks::<B>(w).iter().zip(as_blocks_mut(out)) {
        let mut values = [_mm256_setzero_si256(); 8];
        for (v, (magnitudes, signs)) in values.iter_mut().zip(signed_chunks(w)) {
            *v = _mm256_sign_epi8(magnitudes, signs);
        }
        write(out, values, &w.scales(), grid_d(w));
    }
}

/// Decodes a row of Q3_K blocks `w` into `out`, one [`DecodedBlock`] each: the values
/// split as the one-token product splits them ([`q3_k_chunk`]), put back together.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_q3_k(w: &[u8], out: &mut [u8]) {
    for (w, out) in as_blocks::<BlockQ3K>(w).iter().zip(as_blocks_mut(out)) {
        let hmask = load_u8(&w.hmask);
        let mut values = [_mm256_setzero_si256(); 8];
        for (half, bits) in w.qs.as_chunks::<32>().0.iter().enumerate() {
            let bits = load_u8(bits);
            for shift in 0..4 {
                let (low, four_if_clear) = q3_k_chunk(bits, hmask, half, shift);
                values[4 * half + shift] = _mm256_sub_epi8(low, four_if_clear);
            }
        }
        write(
            out,
            values,
            &q3k_scales(&w.scales).map(i32::from),
            grid_d(w),
        );
    }
}

/// Decodes a row of TQ blocks `w` into `out`, one [`DecodedBlock`] each.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_ternary<B: Ternary>(w: &[u8], out: &mut [u8]) {
    for (w, out) in as_blocks::<B>(w).iter().zip(as_blocks_mut(out)) {
        write(out, ternary::values(w), &[1; 16], grid_d(w));
    }
}

// `tile`: a decoded row against up to 8 tokens.
tile_entry_points!(tile_of => tile);

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_of<const T: usize>(w: &[u8], a: &[&[u8]], scales: &TileScales, out: &mut [f32]) {
    let (w, a) = tile_operands::<DecodedBlock, BlockQ8K, T>(w, a, scales, out);
    // Lane `t`: token `t`'s output (lanes from `T` on stay 0).
    let mut acc = _mm256_setzero_ps();
    for (b, w) in w.iter().enumerate() {
        // sum(scale * (value + OFFSET) * y) - OFFSET * sum(scale * group sum of y), each
        // 32 values and their scales loaded once for all the tokens.
        let offsets = load_u8(&w.offsets);
        let mut sumi = [_mm256_setzero_si256(); 8];
        for t in 0..T {
            sumi[t] = _mm256_madd_epi16(load_u8(&a[t][b].bsums), offsets);
        }
        for c in 0..8 {
            let (values, scale) = (load_u8(&w.values[c]), load_u8(&w.scales[c]));
            for t in 0..T {
                let y = load_i8(a[t][b].qs[32 * c..][..32].try_into().unwrap());
                let pairs = _mm256_maddubs_epi16(values, y);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(pairs, scale));
            }
        }
        acc = add_block(acc, w, &a, b, &sumi);
    }
    store_lanes(acc, out);
}

/// `acc` plus block `b`'s products, every token in its lane: as `grid_block_sum`, `(d * da)`
/// times the total of the token's integer sums `sumi[t]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::kernels::x86) unsafe fn add_block<const T: usize>(
    acc: __m256,
    w: &DecodedBlock,
    a: &[&[BlockQ8K]; T],
    b: usize,
    sumi: &[__m256i; 8],
) -> __m256 {
    let mut da = [0f32; 8];
    for t in 0..T {
        da[t] = a[t][b].d();
    }
    let d = _mm256_mul_ps(
        _mm256_set1_ps(f32::from_le_bytes(w.d)),
        _mm256_loadu_ps(da.as_ptr()),
    );
    _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(totals(sumi))))
}

/// The first `out.len()` lanes of `acc` to `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::kernels::x86) unsafe fn store_lanes(acc: __m256, out: &mut [f32]) {
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    out.copy_from_slice(&lanes[..out.len()]);
}

/// Lane `t`: the total of the lanes of `v[t]` (exact, as integers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn totals(v: &[__m256i; 8]) -> __m256i {
    // Within each 128-bit half: pairs, then the quarters of four vectors.
    let pairs = [
        _mm256_hadd_epi32(v[0], v[1]),
        _mm256_hadd_epi32(v[2], v[3]),
        _mm256_hadd_epi32(v[4], v[5]),
        _mm256_hadd_epi32(v[6], v[7]),
    ];
    let low = _mm256_hadd_epi32(pairs[0], pairs[1]);
    let high = _mm256_hadd_epi32(pairs[2], pairs[3]);
    // `low` holds v[0..4]'s half totals, its low half then its high half; `high` v[4..8]'s.
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(low, high),
        _mm256_permute2x128_si256::<0x31>(low, high),
    )
}
