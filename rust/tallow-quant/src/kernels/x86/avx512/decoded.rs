//! The decoded rows of the codebook formats (see `avx2::decoded`) against up to 8 tokens with
//! VNNI: two chunks of 32 values a step, their `vpmaddubsw` pairs widened against the group
//! scales and added in one `vpdpwssd`. Each block's integer sums are those of the AVX2 tile,
//! and become floats the same way, so the products have the same bits.

use std::arch::x86_64::*;

use super::super::avx2::decoded::{add_block, store_lanes, DecodedBlock};
use super::super::avx2::{load_u8, tile_entry_points};
use super::super::tile_operands;
use crate::blocks::BlockQ8K;
use crate::kernels::{RawDecoding, TileScales};

/// `decoding` with this tile: the rows decode as they do on AVX2.
pub(super) fn with_vnni_tile(decoding: RawDecoding) -> RawDecoding {
    RawDecoding { tile, ..decoding }
}

// `tile`: a decoded row against up to 8 tokens.
tile_entry_points!(@features "avx512f,avx512bw,avx512vnni"; tile_of => tile);

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_of<const T: usize>(w: &[u8], a: &[&[u8]], scales: &TileScales, out: &mut [f32]) {
    let (w, a) = tile_operands::<DecodedBlock, BlockQ8K, T>(w, a, scales, out);
    let mut acc = _mm256_setzero_ps();
    for (b, w) in w.iter().enumerate() {
        // sum(scale * (value + OFFSET) * y) - OFFSET * sum(scale * group sum of y), as on
        // AVX2, 64 values at a time.
        let (values, group_scales) = (w.values.as_flattened(), w.scales.as_flattened());
        let mut wide = [_mm512_setzero_si512(); 8];
        for (k, (values, scale)) in values
            .chunks_exact(64)
            .zip(group_scales.chunks_exact(64))
            .enumerate()
        {
            let values = _mm512_loadu_si512(values.as_ptr().cast());
            let scale = _mm512_loadu_si512(scale.as_ptr().cast());
            for t in 0..T {
                let y = _mm512_loadu_si512(a[t][b].qs[64 * k..].as_ptr().cast());
                let pairs = _mm512_maddubs_epi16(values, y);
                wide[t] = _mm512_dpwssd_epi32(wide[t], pairs, scale);
            }
        }
        let offsets = load_u8(&w.offsets);
        let mut sumi = [_mm256_setzero_si256(); 8];
        for t in 0..T {
            let halves = _mm256_add_epi32(
                _mm512_castsi512_si256(wide[t]),
                _mm512_extracti64x4_epi64::<1>(wide[t]),
            );
            let offset = _mm256_madd_epi16(load_u8(&a[t][b].bsums), offsets);
            sumi[t] = _mm256_add_epi32(halves, offset);
        }
        acc = add_block(acc, w, &a, b, &sumi);
    }
    store_lanes(acc, out);
}
