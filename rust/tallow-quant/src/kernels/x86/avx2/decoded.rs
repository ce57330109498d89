//! The codebook formats (IQ1, IQ2, IQ3, TQ), and Q3_K, decoded once for many tokens.
//! Gathering a block's codebook entries costs more than multiplying it by one token, so a
//! product of many tokens decodes each group of [`PACK_ROWS`] weight rows once into a packed
//! group of the decoded layout (`packed::Decoded`: bytes that multiply as they are, a row per
//! i32 lane), and the packed kernels then run every token against it, each activation byte
//! broadcast to all 16 rows. The integer sum of each block is exact whichever way it is
//! taken, and these formats' dot products turn it into a float once per block
//! (`grid_block_sum`), as the decoded kernels do, so the products have their bits.

use std::arch::x86_64::*;

use super::ternary::{self, Ternary};
use super::{grid_d, load_u8, q3_k_chunk, signed_chunks};
use crate::blocks::{as_blocks, q3k_scales, Block, BlockQ3K, SignedGridBlock};
use crate::kernels::x86::packed::{self, DECODED_OFFSET};
use crate::kernels::{RawDecoding, DECODED_BLOCK_BYTES, PACK_ROWS};

/// The decoding of the IQ1, IQ2 and IQ3 formats, with AVX2's packed kernel.
pub(super) const fn signed<B: SignedGridBlock>() -> RawDecoding {
    RawDecoding {
        decode: decode_signed::<B>,
        kernel: packed::avx2::decoded,
    }
}

/// The decoding of Q3_K, with AVX2's packed kernel.
pub(super) const fn q3_k() -> RawDecoding {
    RawDecoding {
        decode: decode_q3_k,
        kernel: packed::avx2::decoded,
    }
}

/// The decoding of the ternary formats, with AVX2's packed kernel.
pub(super) const fn ternary<B: Ternary>() -> RawDecoding {
    RawDecoding {
        decode: decode_ternary::<B>,
        kernel: packed::avx2::decoded,
    }
}

/// The rows of the weights `w` (`rows` of them, at most [`PACK_ROWS`]) as blocks of format
/// `B`, checked against a decoded group of `out_len` bytes: a decoded block per block.
fn group_rows<'a, B: Block + 'a>(
    w: &'a [u8],
    rows: usize,
    out_len: usize,
) -> impl Iterator<Item = &'a [B]> {
    assert!((1..=PACK_ROWS).contains(&rows) && w.len().is_multiple_of(rows));
    let row_bytes = w.len() / rows;
    assert_eq!(
        out_len / DECODED_BLOCK_BYTES * size_of::<B>(),
        row_bytes,
        "a decoded block per block"
    );
    w.chunks_exact(row_bytes).map(as_blocks::<B>)
}

/// The blocks of a decoded group.
fn group_blocks(out: &mut [u8]) -> &mut [[u8; DECODED_BLOCK_BYTES]] {
    out.as_chunks_mut().0
}

/// Writes row `lane` of a decoded group's block: its values (signed, 32 a chunk) plus the
/// offset, its 16 group scales and its f32 scale `d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn write(
    block: &mut [u8; DECODED_BLOCK_BYTES],
    lane: usize,
    values: [__m256i; 8],
    scales: &[i32; 16],
    d: f32,
) {
    let mut bytes = [[0u8; 32]; 8];
    let offset = _mm256_set1_epi8(DECODED_OFFSET);
    for (dst, v) in bytes.iter_mut().zip(values) {
        _mm256_storeu_si256(dst.as_mut_ptr().cast(), _mm256_add_epi8(v, offset));
    }
    let (field, words) = block.split_at_mut(64);
    field[4 * lane..][..4].copy_from_slice(&d.to_le_bytes());
    let words = words.as_chunks_mut::<64>().0;
    for (word, scales) in words.iter_mut().zip(scales.as_chunks::<4>().0) {
        // Within -32..=31.
        word[4 * lane..][..4].copy_from_slice(&scales.map(|s| s as i8 as u8));
    }
    for (word, step) in words[4..]
        .iter_mut()
        .zip(bytes.as_flattened().as_chunks::<4>().0)
    {
        word[4 * lane..][..4].copy_from_slice(step);
    }
}

/// Decodes `rows` rows of IQ1/IQ2/IQ3 blocks `w` into the decoded group `out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_signed<B: SignedGridBlock>(w: &[u8], rows: usize, out: &mut [u8]) {
    for (lane, w) in group_rows::<B>(w, rows, out.len()).enumerate() {
        for (w, out) in w.iter().zip(group_blocks(out)) {
            let mut values = [_mm256_setzero_si256(); 8];
            for (v, (magnitudes, signs)) in values.iter_mut().zip(signed_chunks(w)) {
                *v = _mm256_sign_epi8(magnitudes, signs);
            }
            write(out, lane, values, &w.scales(), grid_d(w));
        }
    }
}

/// Decodes `rows` rows of Q3_K blocks `w` into the decoded group `out`: the values split as
/// the one-token product splits them ([`q3_k_chunk`]), put back together.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_q3_k(w: &[u8], rows: usize, out: &mut [u8]) {
    for (lane, w) in group_rows::<BlockQ3K>(w, rows, out.len()).enumerate() {
        for (w, out) in w.iter().zip(group_blocks(out)) {
            let hmask = load_u8(&w.hmask);
            let mut values = [_mm256_setzero_si256(); 8];
            for (half, bits) in w.qs.as_chunks::<32>().0.iter().enumerate() {
                let bits = load_u8(bits);
                for shift in 0..4 {
                    let (low, four_if_clear) = q3_k_chunk(bits, hmask, half, shift);
                    values[4 * half + shift] = _mm256_sub_epi8(low, four_if_clear);
                }
            }
            let scales = q3k_scales(&w.scales).map(i32::from);
            write(out, lane, values, &scales, grid_d(w));
        }
    }
}

/// Decodes `rows` rows of TQ blocks `w` into the decoded group `out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_ternary<B: Ternary>(w: &[u8], rows: usize, out: &mut [u8]) {
    for (lane, w) in group_rows::<B>(w, rows, out.len()).enumerate() {
        for (w, out) in w.iter().zip(group_blocks(out)) {
            write(out, lane, ternary::values(w), &[1; 16], grid_d(w));
        }
    }
}
