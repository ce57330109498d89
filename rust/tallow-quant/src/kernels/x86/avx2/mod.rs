//! AVX2 kernels (with FMA and F16C): x86-64 from Haswell and Zen 1 on.
//!
//! Integer products use `vpmaddubsw` (u8 x i8 -> pairs of i16), so one operand must be
//! unsigned: formats with a zero point keep their quants unsigned and add the offset through
//! block sums; signed pairs move the sign of one side onto the other (`vpsignb`). Q8
//! activations stay within -127..=127, as quantization produces them, so the i16 pair sums
//! cannot saturate.
//!
//! # Safety
//! Every function here needs AVX2, FMA and F16C; `crate::kernels::Isa` only hands them out when the
//! CPU has them. Memory is only reached through references to whole blocks.

use std::arch::x86_64::*;

pub(super) mod decoded;
mod dequantize;
mod iq1;
mod iq2_xs;
mod quantize;
mod ternary;

use self::ternary::{ternary_q8_k, tile_ternary_q8_k};
use super::cpu::fast_pdep;
use super::tile_operands;
use crate::blocks::{
    as_blocks, k4_scales_mins, BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockQ2K, BlockQ3K, BlockQ4K,
    BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
    GridBlock, LookupBlock, SignedGridBlock, IQ4_VALUES,
};
use crate::blocks::{
    BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockTq1_0,
    BlockTq2_0,
};
use crate::kernels::activations::{clamped_swiglu_loop, gated_loop, RawActivations};
use crate::kernels::attention::{loops, RawAttention};
use crate::kernels::table::{RawDequantize, RawQuantize};
use crate::kernels::{RawFloatRow, RawPacked, RawRow, RawTile, RawVecDot};
use crate::reference::quantize as weights;
use crate::reference::vec_dot as reference;
use crate::GgmlType;

/// The AVX2 kernels of `ty`: a dot product for every weight format, tiles for the legacy
/// formats, packed kernels for the formats `crate::packed` lays out, the activation
/// quantizers, and the scale-searching weight quantizers compiled at this width.
pub(crate) fn row(ty: GgmlType) -> RawRow {
    use super::packed::avx2 as packed;
    type Kernels = (
        Option<RawVecDot>,
        Option<RawTile>,
        Option<RawPacked>,
        Option<RawQuantize>,
    );
    let (vec_dot, tile, packed, quantize): Kernels = match ty {
        GgmlType::F32 => (Some(f32_f32), None, None, None),
        GgmlType::F16 => (Some(f16_f32), None, None, None),
        GgmlType::BF16 => (Some(bf16_f32), None, None, None),
        GgmlType::Q4_0 => (Some(q4_0_q8_0), Some(tile_q4_0), Some(packed::q4_0), None),
        GgmlType::Q4_1 => (Some(q4_1_q8_1), Some(tile_q4_1), Some(packed::q4_1), None),
        GgmlType::Q5_0 => (Some(q5_0_q8_0), Some(tile_q5_0), Some(packed::q5_0), None),
        GgmlType::Q5_1 => (Some(q5_1_q8_1), None, None, None),
        GgmlType::Q8_0 => (
            Some(q8_0_q8_0),
            Some(tile_q8_0),
            Some(packed::q8_0),
            Some(quantize::q8_0),
        ),
        GgmlType::Q8_1 => (None, None, None, Some(quantize::q8_1)),
        GgmlType::Q2_K => (
            Some(q2_k_q8_k),
            None,
            Some(packed::q2_k),
            Some(q2_k_weights),
        ),
        GgmlType::Q3_K => (
            Some(q3_k_q8_k),
            None,
            Some(packed::q3_k),
            Some(q3_k_weights),
        ),
        GgmlType::Q4_K => (
            Some(q4_k_q8_k),
            None,
            Some(packed::q4_k),
            Some(q4_k_weights),
        ),
        GgmlType::Q5_K => (
            Some(q5_k_q8_k),
            None,
            Some(packed::q5_k),
            Some(q5_k_weights),
        ),
        GgmlType::Q6_K => (
            Some(q6_k_q8_k),
            None,
            Some(packed::q6_k),
            Some(q6_k_weights),
        ),
        GgmlType::Q8_K => (None, None, None, Some(quantize::q8_k)),
        GgmlType::IQ4_NL => (
            Some(lookup_q8_0::<BlockIq4Nl>),
            Some(tile_iq4_nl),
            Some(packed::iq4_nl),
            Some(iq4_nl_weights),
        ),
        GgmlType::IQ4_XS => (
            Some(iq4_xs_q8_k),
            Some(tile_iq4_xs),
            Some(packed::iq4_xs),
            Some(iq4_xs_weights),
        ),
        GgmlType::MXFP4 => (Some(lookup_q8_0::<BlockMxfp4>), None, None, None),
        GgmlType::IQ2_XXS => (
            Some(signed_grid_q8_k::<BlockIq2Xxs>),
            Some(tile_iq2_xxs),
            None,
            None,
        ),
        GgmlType::IQ2_XS => (Some(iq2_xs::iq2_xs_q8_k), Some(tile_iq2_xs), None, None),
        GgmlType::IQ2_S => (pdep_vec_dot(ty, fast_pdep()), Some(tile_iq2_s), None, None),
        GgmlType::IQ3_XXS => (
            Some(signed_grid_q8_k::<BlockIq3Xxs>),
            Some(tile_iq3_xxs),
            None,
            None,
        ),
        GgmlType::IQ3_S => (pdep_vec_dot(ty, fast_pdep()), Some(tile_iq3_s), None, None),
        GgmlType::IQ1_S => (pdep_vec_dot(ty, fast_pdep()), Some(tile_iq1_s), None, None),
        GgmlType::IQ1_M => (pdep_vec_dot(ty, fast_pdep()), Some(tile_iq1_m), None, None),
        GgmlType::TQ1_0 => (
            Some(ternary_q8_k::<BlockTq1_0>),
            Some(tile_tq1_0),
            None,
            None,
        ),
        GgmlType::TQ2_0 => (
            Some(ternary_q8_k::<BlockTq2_0>),
            Some(tile_tq2_0),
            None,
            None,
        ),
    };
    let decoding = match ty {
        GgmlType::IQ2_XXS => Some(decoded::signed::<BlockIq2Xxs>()),
        GgmlType::IQ2_XS => Some(decoded::signed::<BlockIq2Xs>()),
        GgmlType::IQ2_S => Some(decoded::signed::<BlockIq2S>()),
        GgmlType::IQ3_XXS => Some(decoded::signed::<BlockIq3Xxs>()),
        GgmlType::IQ3_S => Some(decoded::signed::<BlockIq3S>()),
        GgmlType::IQ1_S => Some(decoded::signed::<BlockIq1S>()),
        GgmlType::IQ1_M => Some(decoded::signed::<BlockIq1M>()),
        GgmlType::TQ1_0 => Some(decoded::ternary::<BlockTq1_0>()),
        GgmlType::TQ2_0 => Some(decoded::ternary::<BlockTq2_0>()),
        GgmlType::Q3_K => Some(decoded::q3_k()),
        _ => None,
    };
    let dequantize: Option<RawDequantize> = match ty {
        GgmlType::Q8_0 => Some(dequantize::q8_0),
        GgmlType::Q4_0 => Some(dequantize::q4_0),
        _ => None,
    };
    RawRow {
        vec_dot,
        tile,
        rows: None,
        decoding,
        packed,
        quantize,
        dequantize,
    }
}

compiled_with!("avx2,fma":
    merge => loops::merge, (state: &mut [f32], other: &[f32]);
    q2_k_weights => weights::q2_k_row, (x: &[f32], dst: &mut [u8]);
    q3_k_weights => weights::q3_k_row, (x: &[f32], dst: &mut [u8]);
    q4_k_weights => weights::q4_k_row, (x: &[f32], dst: &mut [u8]);
    q5_k_weights => weights::q5_k_row, (x: &[f32], dst: &mut [u8]);
    q6_k_weights => weights::q6_k_row, (x: &[f32], dst: &mut [u8]);
    iq4_nl_weights => weights::iq4_nl_row, (x: &[f32], dst: &mut [u8]);
    iq4_xs_weights => weights::iq4_xs_row, (x: &[f32], dst: &mut [u8]);
    silu => gated_loop::<false>, (gate: &mut [f32], up: &[f32]);
    gelu_tanh => gated_loop::<true>, (gate: &mut [f32], up: &[f32]);
    clamped_swiglu => clamped_swiglu_loop, (gate: &mut [f32], up: &[f32]);
);

/// The AVX2 attention kernels (the FMA tile kernel at 8 lanes) and gated activations.
pub(crate) fn float_row() -> RawFloatRow {
    use super::attention::{avx2, rows_avx2, widen_f16c};
    RawFloatRow {
        attention: RawAttention {
            widen: Some(widen_f16c),
            page: Some(rows_avx2),
            in_place: None,
            merge: Some(merge),
            general: Some(avx2::rows_with),
        },
        activations: RawActivations {
            silu: Some(silu),
            gelu_tanh: Some(gelu_tanh),
            clamped_swiglu: Some(clamped_swiglu),
        },
    }
}

// ---- helpers ----

/// An f16 scale to f32 with F16C (exact, and no slow path for subnormals).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fp16(bits: [u8; 2]) -> f32 {
    let h = i32::from(u16::from_le_bytes(bits));
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load_u8(bytes: &[u8; 32]) -> __m256i {
    _mm256_loadu_si256(bytes.as_ptr().cast())
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load_i8(bytes: &[i8; 32]) -> __m256i {
    _mm256_loadu_si256(bytes.as_ptr().cast())
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load_u8x16(bytes: &[u8; 16]) -> __m128i {
    _mm_loadu_si128(bytes.as_ptr().cast())
}

/// The 32 nibbles of a Q4_0/Q4_1-style `qs` in element order: low nibbles in the low lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    let packed = load_u8x16(qs);
    let both = _mm256_setr_m128i(packed, _mm_srli_epi16::<4>(packed));
    _mm256_and_si256(both, _mm256_set1_epi8(0xf))
}

/// The 32 values that the nibbles of `qs` index in `values` (both lanes of `values` hold the
/// 16 table entries), in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn looked_up(qs: &[u8; 16], values: __m256i) -> __m256i {
    _mm256_shuffle_epi8(values, nibbles(qs))
}

/// A table of 16 signed bytes in both lanes, for [`looked_up`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn table(values: &[i8; 16]) -> __m256i {
    let lane = _mm_loadu_si128(values.as_ptr().cast());
    _mm256_setr_m128i(lane, lane)
}

/// Byte i is 0xff when bit i of the little-endian word `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_to_bytes(bits: [u8; 4]) -> __m256i {
    let word = _mm256_set1_epi32(i32::from_le_bytes(bits));
    // Byte i takes source byte i / 8, then every bit but bit i % 8 is forced on.
    let spread = _mm256_shuffle_epi8(
        word,
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1))
}

/// Sums of 4 adjacent products u8 x i8 as eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Sums of 4 adjacent products i8 x i8 as eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// An i16 vector with `lo` in the low 128-bit lane and `hi` in the high one: the scales of
/// two groups of 16 bytes after `vpmaddubsw`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i16_pair(lo: i16, hi: i16) -> __m256i {
    _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi))
}

/// Shuffles taking i16 `k` and `k + 1` (of groups `2c` and `2c + 1`, `k = 2c mod 8`) of a
/// lane to every i16 of the low and the high lane, for [`scale_pair`].
static SCALE_PAIR_SHUFFLES: [[u8; 32]; 4] = {
    let mut shuffles = [[0u8; 32]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 16 {
            shuffles[c][i] = 4 * c as u8 + (i % 2) as u8;
            shuffles[c][16 + i] = 4 * c as u8 + 2 + (i % 2) as u8;
            i += 1;
        }
        c += 1;
    }
    shuffles
};

/// A block's 16 signed group scales (bytes) as i16, groups 0..8 in both lanes of the first
/// vector and groups 8..16 in both lanes of the second, for [`scale_pair`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_scales(scales: __m128i) -> [__m256i; 2] {
    let wide = _mm256_cvtepi8_epi16(scales);
    [
        _mm256_permute2x128_si256::<0x00>(wide, wide),
        _mm256_permute2x128_si256::<0x11>(wide, wide),
    ]
}

/// Chunk `c`'s two group scales (values 32c..32c+32) as [`i16_pair`] gives them, from
/// [`group_scales`]: one shuffle.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_pair(scales: &[__m256i; 2], c: usize) -> __m256i {
    let shuffle = _mm256_loadu_si256(SCALE_PAIR_SHUFFLES[c % 4].as_ptr().cast());
    _mm256_shuffle_epi8(scales[c / 4], shuffle)
}

/// The sum of `weights` (16 i16, one per group of 16 values) times the token's group sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_bsums(a: &BlockQ8K, weights: __m256i) -> i32 {
    hsum_i32(_mm256_madd_epi16(weights, load_u8(&a.bsums)))
}

/// The sum of the eight i32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

// ---- float weights ----

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_f32(w: &[u8], a: &[u8]) -> f32 {
    let (w8, w_tail) = w.as_chunks::<32>();
    let (a8, a_tail) = a.as_chunks::<32>();
    let mut acc = _mm256_setzero_ps();
    for (w, a) in w8.iter().zip(a8) {
        let w = _mm256_loadu_ps(w.as_ptr().cast());
        acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(a.as_ptr().cast()), acc);
    }
    hsum(acc) + reference::f32_f32(w_tail, a_tail)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_f32(w: &[u8], a: &[u8]) -> f32 {
    let (w8, w_tail) = w.as_chunks::<16>();
    let (a8, a_tail) = a.as_chunks::<32>();
    let mut acc = _mm256_setzero_ps();
    for (w, a) in w8.iter().zip(a8) {
        let w = _mm256_cvtph_ps(load_u8x16(w));
        acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(a.as_ptr().cast()), acc);
    }
    hsum(acc) + reference::f16_f32(w_tail, a_tail)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_f32(w: &[u8], a: &[u8]) -> f32 {
    let (w8, w_tail) = w.as_chunks::<16>();
    let (a8, a_tail) = a.as_chunks::<32>();
    let mut acc = _mm256_setzero_ps();
    for (w, a) in w8.iter().zip(a8) {
        let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(load_u8x16(w)));
        let w = _mm256_castsi256_ps(w);
        acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(a.as_ptr().cast()), acc);
    }
    hsum(acc) + reference::bf16_f32(w_tail, a_tail)
}

// ---- 32-element blocks ----

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (w, a) in as_blocks::<BlockQ4_0>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_0>(a))
    {
        let q = _mm256_sub_epi8(nibbles(&w.qs), _mm256_set1_epi8(8));
        let sums = _mm256_cvtepi32_ps(dot_i8_i8(q, load_i8(&a.qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w.d) * fp16(a.d)), sums, acc);
    }
    hsum(acc)
}

/// IQ4_NL and MXFP4: the values the nibbles index, looked up 32 at a time.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lookup_q8_0<B: LookupBlock>(w: &[u8], a: &[u8]) -> f32 {
    let values = table(&B::VALUES);
    let mut acc = _mm256_setzero_ps();
    for (w, a) in as_blocks::<B>(w).iter().zip(as_blocks::<BlockQ8_0>(a)) {
        let sums = _mm256_cvtepi32_ps(dot_i8_i8(looked_up(w.qs(), values), load_i8(&a.qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(w.scale() * fp16(a.d)), sums, acc);
    }
    hsum(acc)
}

/// IQ4_XS: each group's sums times its scale in i32 lanes, one float multiply per super-block
/// (as the reference, whose integer sum this equals).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let values = table(&IQ4_VALUES);
    let mut acc = _mm256_setzero_ps();
    for (w, a) in as_blocks::<BlockIq4Xs>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let mut sumi = _mm256_setzero_si256();
        let groups = w.qs.as_chunks::<16>().0.iter().zip(w.scales());
        for ((qs, scale), a) in groups.zip(a.qs.as_chunks::<32>().0) {
            let sums = dot_i8_i8(looked_up(qs, values), load_i8(a));
            sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(sums, _mm256_set1_epi32(scale)));
        }
        let d = _mm256_set1_ps(fp16(w.d) * a.d());
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// The IQ1, IQ2 and IQ3 formats: each 32 values' magnitudes and signs gathered straight
/// into vectors, the signs moved onto the activations (`vpsignb`), each chunk's two group
/// scales read as the chunk is reached, no decoding through memory; the same integer sums,
/// hence the same bits, as the scalar decoding (`reference::grid_q8_k`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_grid_q8_k<B: SignedGridBlock>(w: &[u8], a: &[u8]) -> f32 {
    signed_grid_sums::<B, false>(w, a)
}

/// [`signed_grid_q8_k`] with the indices that BMI2's `pdep` puts together
/// ([`SignedGridBlock::quads_pdep`], [`SignedGridBlock::entries_pdep`]).
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn signed_grid_q8_k_pdep<B: SignedGridBlock>(w: &[u8], a: &[u8]) -> f32 {
    signed_grid_sums::<B, true>(w, a)
}

#[inline(always)]
unsafe fn signed_grid_sums<B: SignedGridBlock, const PDEP: bool>(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0.0;
    for (w, a) in as_blocks::<B>(w).iter().zip(as_blocks::<BlockQ8K>(a)) {
        // Each chunk taken as soon as it is gathered, in two sums side by side (the block's
        // chunks gathered first, as `signed_chunks` does, went through the stack).
        let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let y = a.qs.as_chunks::<32>().0;
        let scales = if B::CHUNK_SCALES_ALONE {
            _mm256_setzero_si256()
        } else {
            scale_bytes(&w.scales())
        };
        for c in (0..8).step_by(2) {
            let (m, s) = signed_chunk::<B, PDEP>(w, c);
            even = _mm256_add_epi32(even, chunk_sum(m, s, &y[c], chunk_scale(w, scales, c)));
            let (m, s) = signed_chunk::<B, PDEP>(w, c + 1);
            odd = _mm256_add_epi32(
                odd,
                chunk_sum(m, s, &y[c + 1], chunk_scale(w, scales, c + 1)),
            );
        }
        let sumi = _mm256_add_epi32(even, odd);
        acc = grid_block_sum(acc, grid_d(w) * a.d(), sumi);
    }
    acc
}

/// The one-token products of the formats that have one with BMI2's `pdep`, which lays out a
/// chunk's grid indices in a few instructions where shifts and masks take many: that one where
/// `pdep` is fast ([`super::cpu::fast_pdep`]), the other elsewhere; `None` for other formats.
/// With it, on Zen 5: IQ1_S 1.22 ns per 32 values against 1.60, IQ1_M 1.66 against 1.90,
/// IQ2_S 1.43 against 1.60, IQ3_S 1.95 against 3.06 (`examples/row_products.rs`, one
/// thread). Where the indices are whole bytes (IQ2_XXS's), `pdep` spreading the 7-bit sign
/// indices read slower (1.92 against 1.80).
pub(crate) fn pdep_vec_dot(ty: GgmlType, fast_pdep: bool) -> Option<RawVecDot> {
    match (ty, fast_pdep) {
        (GgmlType::IQ1_S | GgmlType::IQ1_M, _) => iq1::vec_dot(ty, fast_pdep),
        (GgmlType::IQ2_S, true) => Some(signed_grid_q8_k_pdep::<BlockIq2S>),
        (GgmlType::IQ2_S, false) => Some(signed_grid_q8_k::<BlockIq2S>),
        (GgmlType::IQ3_S, true) => Some(signed_grid_q8_k_pdep::<BlockIq3S>),
        (GgmlType::IQ3_S, false) => Some(signed_grid_q8_k::<BlockIq3S>),
        _ => None,
    }
}

/// A block's 16 group scales (each within 1..=31) as bytes, byte g of both 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_bytes(scales: &[i32; 16]) -> __m256i {
    let bytes: [u8; 16] = std::array::from_fn(|g| scales[g] as u8);
    _mm256_broadcastsi128_si256(_mm_loadu_si128(bytes.as_ptr().cast()))
}

/// Per chunk c, the `vpshufb` pattern that puts group 2c's scale byte in each i16 of the low
/// 128-bit lane and group 2c + 1's in the high one (an index with bit 7 set gives 0).
pub(super) static SCALE_PICKS: [[u8; 32]; 8] = {
    let mut picks = [[0x80u8; 32]; 8];
    let mut c = 0;
    while c < 8 {
        let mut i = 0;
        while i < 8 {
            picks[c][2 * i] = 2 * c as u8;
            picks[c][16 + 2 * i] = 2 * c as u8 + 1;
            i += 1;
        }
        c += 1;
    }
    picks
};

/// Chunk `c`'s two group scales as [`scale_vectors`] spreads them, each in every i16 of its
/// 128-bit lane: from the block's [`scale_bytes`] `scales`, or read alone where the format
/// says that is cheaper ([`SignedGridBlock::CHUNK_SCALES_ALONE`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk_scale<B: SignedGridBlock>(w: &B, scales: __m256i, c: usize) -> __m256i {
    if B::CHUNK_SCALES_ALONE {
        let (low, high) = w.chunk_scales(c);
        return i16_pair(low as i16, high as i16);
    }
    let pick = _mm256_loadu_si256(SCALE_PICKS[c].as_ptr().cast());
    _mm256_shuffle_epi8(scales, pick)
}

/// A grid block's float scale times its format's unit (the f16 through F16C).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn grid_d<B: GridBlock>(w: &B) -> f32 {
    fp16(w.d_bits()) * B::UNIT
}

/// `acc` plus a grid block's product: `d` times the sum of the block's integer sums `sumi`.
/// Taken once per block from the exact integer total, so that the products' bits do not
/// depend on how a kernel spreads a block's sums over lanes (see `decoded`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn grid_block_sum(acc: f32, d: f32, sumi: __m256i) -> f32 {
    acc + d * hsum_i32(sumi) as f32
}

/// Values 32c..32c+32 of a signed grid block as [`grid_sums`] takes them: their magnitudes,
/// and +-1 bytes with their signs (indices split between bytes put together with `pdep` where
/// `PDEP`: then only for a caller with BMI2).
// Always inlined, without target features of its own (which would forbid that): IQ3_S's
// chunk, left a call, returned its vectors through the stack.
#[inline(always)]
unsafe fn signed_chunk<B: SignedGridBlock, const PDEP: bool>(
    w: &B,
    c: usize,
) -> (__m256i, __m256i) {
    if let Some((entries, negative)) = w.shifted_entries(c) {
        let values = shifted_values(entries, negative);
        return (_mm256_abs_epi8(values), values);
    }
    // Written out: closures and `array::from_fn` here would not inherit the target features
    // and would stay calls.
    let (m0, s0) = w.piece_ones(4 * c);
    let (m1, s1) = w.piece_ones(4 * c + 1);
    let (m2, s2) = w.piece_ones(4 * c + 2);
    let (m3, s3) = w.piece_ones(4 * c + 3);
    let (quads, entries) = match PDEP {
        true => (w.quads_pdep(c), w.entries_pdep(c)),
        false => (w.quads(c), None),
    };
    let magnitudes = match (quads, entries) {
        // The pieces' magnitudes are then not used, and not computed.
        (Some(q), _) => _mm256_setr_epi32(
            q[0] as i32,
            q[1] as i32,
            q[2] as i32,
            q[3] as i32,
            q[4] as i32,
            q[5] as i32,
            q[6] as i32,
            q[7] as i32,
        ),
        (None, Some([e0, e1, e2, e3])) => {
            _mm256_set_epi64x(e3 as i64, e2 as i64, e1 as i64, e0 as i64)
        }
        (None, None) => _mm256_set_epi64x(m3 as i64, m2 as i64, m1 as i64, m0 as i64),
    };
    let signs = match w.sign_bits(c) {
        Some(bits) => sign_ones(bits),
        None => _mm256_set_epi64x(s3 as i64, s2 as i64, s1 as i64, s0 as i64),
    };
    (magnitudes, signs)
}

/// The IQ1 values `8 * grid ± 1` of four grid entries (bytes -1, 0 or 1), the shift of entry
/// `l` negative where bit `4l + 3` of `negative` is set: each byte times 8 as the i16 lanes
/// shift (the bits a low byte pushes into its high neighbour masked off), plus its entry's
/// shift.
#[inline(always)]
unsafe fn shifted_values(entries: [u64; 4], negative: u16) -> __m256i {
    let [e0, e1, e2, e3] = entries.map(|e| e as i64);
    let grid = _mm256_set_epi64x(e3, e2, e1, e0);
    let eight = _mm256_and_si256(_mm256_slli_epi16::<3>(grid), _mm256_set1_epi8(0xf8u8 as i8));
    // Bytewise 1, or -1 (all bits) in the entries whose bit is set.
    let bits = _mm256_setr_epi64x(0x8, 0x80, 0x800, 0x8000);
    let set = _mm256_and_si256(_mm256_set1_epi64x(i64::from(negative)), bits);
    let shifts = _mm256_or_si256(_mm256_cmpeq_epi64(set, bits), _mm256_set1_epi8(1));
    _mm256_add_epi8(eight, shifts)
}

/// Bytewise -1 where bit `e` of `bits` is set and 1 elsewhere: each byte of `bits` spread
/// over eight bytes, each of those tested against its own bit.
#[inline(always)]
unsafe fn sign_ones(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    ones_by_bit(spread)
}

/// Bytewise -1 where byte `j` of `bytes` has bit `j % 8` set, and 1 elsewhere: sign bytes
/// spread over the values they sign, as `vpsignb` takes them.
#[inline(always)]
pub(super) unsafe fn ones_by_bit(bytes: __m256i) -> __m256i {
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let negative = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_or_si256(negative, _mm256_set1_epi8(1))
}

/// Group scales (one per 16 values) as eight vectors of i16 lanes, a 128-bit lane a group:
/// `vpmaddwd` against them adds the `vpmaddubsw` pairs and applies the scales in one step
/// (at most 2 x 62 x 127 x 2 x 31 per i32 lane).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_vectors(scales: &[i32; 16]) -> [__m256i; 8] {
    let mut vectors = [_mm256_setzero_si256(); 8];
    for (half, scales) in scales.as_chunks::<8>().0.iter().enumerate() {
        // Each scale (an i16: at most 31 in magnitude, Q3_K's negative) in both i16 of its
        // i32 lane, then each pair of groups' lanes spread over the two 128-bit lanes.
        let v = _mm256_loadu_si256(scales.as_ptr().cast());
        let low = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
        let v = _mm256_or_si256(low, _mm256_slli_epi32::<16>(v));
        for k in 0..4 {
            let (lo, hi) = (2 * k as i32, 2 * k as i32 + 1);
            let spread = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
            vectors[4 * half + k] = _mm256_permutevar8x32_epi32(v, spread);
        }
    }
    vectors
}

/// The eight signed-grid chunks of a block ([`signed_chunk`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_chunks<B: SignedGridBlock>(w: &B) -> [(__m256i, __m256i); 8] {
    let mut chunks = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 8];
    for (c, chunk) in chunks.iter_mut().enumerate() {
        *chunk = signed_chunk::<B, false>(w, c);
    }
    chunks
}

/// The integer sums of a grid block, as (magnitudes, signs) chunks, against one Q8_K block,
/// times the group scales: the same for every grid kernel, hence the same bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn grid_sums(
    chunks: &[(__m256i, __m256i); 8],
    scales: &[__m256i; 8],
    a: &BlockQ8K,
) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    for ((&(magnitudes, signs), &scale), y) in
        chunks.iter().zip(scales).zip(a.qs.as_chunks::<32>().0)
    {
        sumi = _mm256_add_epi32(sumi, chunk_sum(magnitudes, signs, y, scale));
    }
    sumi
}

/// One term of [`grid_sums`]: a chunk's magnitudes against the token's 32 values `y` carrying
/// the chunk's signs, times its group scales (`scale`, as [`scale_vectors`] gives them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk_sum(magnitudes: __m256i, signs: __m256i, y: &[i8; 32], scale: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(load_i8(y), signs));
    _mm256_madd_epi16(pairs, scale)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut offsets = 0.0f32;
    for (w, a) in as_blocks::<BlockQ4_1>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_1>(a))
    {
        let sums = _mm256_cvtepi32_ps(dot_u8_i8(nibbles(&w.qs), load_i8(&a.qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w.d) * fp16(a.d)), sums, acc);
        offsets += fp16(w.m) * fp16(a.s);
    }
    hsum(acc) + offsets
}

/// The 32 quants of a Q5_0 block minus 16, as i8: quants without their fifth bit get 0xf0
/// or'ed in, i.e. minus 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_quants(w: &BlockQ5_0) -> __m256i {
    let minus16 = _mm256_andnot_si256(bits_to_bytes(w.qh), _mm256_set1_epi8(0xf0u8 as i8));
    _mm256_or_si256(nibbles(&w.qs), minus16)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (w, a) in as_blocks::<BlockQ5_0>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_0>(a))
    {
        let sums = _mm256_cvtepi32_ps(dot_i8_i8(q5_0_quants(w), load_i8(&a.qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w.d) * fp16(a.d)), sums, acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut offsets = 0.0f32;
    for (w, a) in as_blocks::<BlockQ5_1>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_1>(a))
    {
        let fifth = _mm256_and_si256(bits_to_bytes(w.qh), _mm256_set1_epi8(0x10));
        let q = _mm256_or_si256(nibbles(&w.qs), fifth);
        let sums = _mm256_cvtepi32_ps(dot_u8_i8(q, load_i8(&a.qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w.d) * fp16(a.d)), sums, acc);
        offsets += fp16(w.m) * fp16(a.s);
    }
    hsum(acc) + offsets
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (w, a) in as_blocks::<BlockQ8_0>(w)
        .iter()
        .zip(as_blocks::<BlockQ8_0>(a))
    {
        let sums = _mm256_cvtepi32_ps(dot_i8_i8(load_i8(&w.qs), load_i8(&a.qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w.d) * fp16(a.d)), sums, acc);
    }
    hsum(acc)
}

// ---- K-quants: 256-element super-blocks against Q8_K ----

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mask2 = _mm256_set1_epi8(3);
    let mask4 = _mm_set1_epi8(0xf);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (w, a) in as_blocks::<BlockQ2K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        // Each group's scale in the low nibble of its byte, its min in the high one.
        let packed = load_u8x16(&w.scales);
        let scales = group_scales(_mm_and_si128(packed, mask4));
        let y = a.qs.as_chunks::<32>().0;
        let mut sumi = _mm256_setzero_si256();
        for (half, bits) in w.qs.as_chunks::<32>().0.iter().enumerate() {
            let bits = load_u8(bits);
            for shift in 0..4 {
                let c = 4 * half + shift;
                let q = _mm256_and_si256(_mm256_srl_epi16(bits, shift_count(2 * shift)), mask2);
                let p = _mm256_maddubs_epi16(q, load_i8(&y[c]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale_pair(&scales, c), p));
            }
        }
        let d = a.d() * fp16(w.d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        let group_mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), mask4));
        mins += a.d() * fp16(w.dmin) * weighted_bsums(a, group_mins) as f32;
    }
    hsum(acc) - mins
}

/// Q3_K's values 32c..32c+32 (`c = 4 * half + shift`; `bits` the half's 32 bytes of low
/// bits) as two unsigned parts: their low 2 bits, and 4 where their high bit (bit `c` of
/// their `hmask` byte) is clear; each value is the first less the second, -4..=3.
#[inline(always)]
unsafe fn q3_k_chunk(
    bits: __m256i,
    hmask: __m256i,
    half: usize,
    shift: usize,
) -> (__m256i, __m256i) {
    let low = _mm256_and_si256(
        _mm256_srl_epi16(bits, shift_count(2 * shift)),
        _mm256_set1_epi8(3),
    );
    let high_bit = _mm256_set1_epi8((1u8 << (4 * half + shift)) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, high_bit), high_bit);
    (low, _mm256_andnot_si256(set, _mm256_set1_epi8(4)))
}

/// Q3_K's 16 signed 6-bit group scales (as `q3k_scales`), four at a time in u32 words: the
/// low 4 bits from the nibbles of the first 8 bytes, the top 2 from the last 4 bytes' pairs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3k_scale_bytes(packed: &[u8; 12]) -> __m128i {
    let word = |k: usize| u32::from_le_bytes(packed[4 * k..4 * k + 4].try_into().unwrap());
    let (low, high, tops) = (word(0), word(1), word(2));
    let (nibbles, pairs) = (0x0f0f_0f0fu32, 0x0303_0303u32);
    let scales = _mm_setr_epi32(
        ((low & nibbles) | ((tops & pairs) << 4)) as i32,
        ((high & nibbles) | (((tops >> 2) & pairs) << 4)) as i32,
        (((low >> 4) & nibbles) | (((tops >> 4) & pairs) << 4)) as i32,
        (((high >> 4) & nibbles) | (((tops >> 6) & pairs) << 4)) as i32,
    );
    _mm_sub_epi8(scales, _mm_set1_epi8(32))
}

/// A shift count for the `_mm256_srl_epi16` family, for shifts chosen at run time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn shift_count(bits: usize) -> __m128i {
    _mm_cvtsi32_si128(bits as i32)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0.0;
    for (w, a) in as_blocks::<BlockQ3K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let scales = group_scales(q3k_scale_bytes(&w.scales));
        let y = a.qs.as_chunks::<32>().0;
        let hmask = load_u8(&w.hmask);
        let mut sumi = _mm256_setzero_si256();
        for (half, bits) in w.qs.as_chunks::<32>().0.iter().enumerate() {
            let bits = load_u8(bits);
            for shift in 0..4 {
                let c = 4 * half + shift;
                // q = low - 4 where the high bit is clear: two unsigned products, subtracted.
                let (low, four_if_clear) = q3_k_chunk(bits, hmask, half, shift);
                let y = load_i8(&y[c]);
                let p = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(low, y),
                    _mm256_maddubs_epi16(four_if_clear, y),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale_pair(&scales, c), p));
            }
        }
        // As the grid formats, whose decoded rows Q3_K's products of many tokens take.
        acc = grid_block_sum(acc, a.d() * fp16(w.d), sumi);
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (w, a) in as_blocks::<BlockQ4K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let (scales, group_mins) = k4_scales_mins(&w.scales);
        let y = a.qs.as_chunks::<32>().0;
        let mut sumi = _mm256_setzero_si256();
        for (j, bits) in w.qs.as_chunks::<32>().0.iter().enumerate() {
            let bits = load_u8(bits);
            let lo = _mm256_and_si256(bits, _mm256_set1_epi8(0xf));
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), _mm256_set1_epi8(0xf));
            sumi = k_group32(sumi, lo, load_i8(&y[2 * j]), scales[2 * j]);
            sumi = k_group32(sumi, hi, load_i8(&y[2 * j + 1]), scales[2 * j + 1]);
        }
        let d = a.d() * fp16(w.d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        let summ = a.weighted_bsums(|g| i32::from(group_mins[g / 2]));
        mins += a.d() * fp16(w.dmin) * summ as f32;
    }
    hsum(acc) - mins
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (w, a) in as_blocks::<BlockQ5K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let (scales, group_mins) = k4_scales_mins(&w.scales);
        let y = a.qs.as_chunks::<32>().0;
        let qh = load_u8(&w.qh);
        let mut sumi = _mm256_setzero_si256();
        for (j, bits) in w.qs.as_chunks::<32>().0.iter().enumerate() {
            let bits = load_u8(bits);
            let lo = _mm256_and_si256(bits, _mm256_set1_epi8(0xf));
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), _mm256_set1_epi8(0xf));
            let lo = _mm256_or_si256(lo, sixteen_if_bit(qh, 2 * j));
            let hi = _mm256_or_si256(hi, sixteen_if_bit(qh, 2 * j + 1));
            sumi = k_group32(sumi, lo, load_i8(&y[2 * j]), scales[2 * j]);
            sumi = k_group32(sumi, hi, load_i8(&y[2 * j + 1]), scales[2 * j + 1]);
        }
        let d = a.d() * fp16(w.d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        let summ = a.weighted_bsums(|g| i32::from(group_mins[g / 2]));
        mins += a.d() * fp16(w.dmin) * summ as f32;
    }
    hsum(acc) - mins
}

/// Byte l is 16 where bit `bit` of byte l of `qh` is set, else 0: the fifth bit of Q5_K.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sixteen_if_bit(qh: __m256i, bit: usize) -> __m256i {
    let mask = _mm256_set1_epi8((1u8 << bit) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, mask), mask);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Adds `scale * (q . y)` for one group of 32 unsigned quants to the i32 lanes of `sumi`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_group32(sumi: __m256i, q: __m256i, y: __m256i, scale: u8) -> __m256i {
    let p = _mm256_maddubs_epi16(q, y);
    let scaled = _mm256_madd_epi16(_mm256_set1_epi16(scale.into()), p);
    _mm256_add_epi32(sumi, scaled)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mask4 = _mm256_set1_epi8(0xf);
    let top2 = _mm256_set1_epi8(0x30);
    let mut acc = _mm256_setzero_ps();
    for (w, a) in as_blocks::<BlockQ6K>(w)
        .iter()
        .zip(as_blocks::<BlockQ8K>(a))
    {
        let ql = w.ql.as_chunks::<32>().0;
        let qh = w.qh.as_chunks::<32>().0;
        let y = a.qs.as_chunks::<32>().0;
        let mut sumi = _mm256_setzero_si256();
        for half in 0..2 {
            let first = load_u8(&ql[2 * half]);
            let second = load_u8(&ql[2 * half + 1]);
            let high = load_u8(&qh[half]);
            // The four 32-element chunks of the half: low nibbles of the two ql rows, then
            // their high nibbles; their top two bits are bits 0-1, 2-3, 4-5, 6-7 of qh,
            // moved to bits 4-5.
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(first, mask4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(high), top2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(second, mask4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(high), top2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(first), mask4),
                    _mm256_and_si256(high, top2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(second), mask4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(high), top2),
                ),
            ];
            for (k, q) in q.into_iter().enumerate() {
                let group = 8 * half + 2 * k;
                let p = _mm256_maddubs_epi16(q, load_i8(&y[4 * half + k]));
                let scales = i16_pair(w.scales[group].into(), w.scales[group + 1].into());
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scales, p));
            }
        }
        // The quants above were unsigned (0..64); take away 32 * scale * sum(y) per group.
        let offset = 32 * a.weighted_bsums(|g| i32::from(w.scales[g]));
        let sumi = _mm256_sub_epi32(sumi, _mm256_setr_epi32(offset, 0, 0, 0, 0, 0, 0, 0));
        let d = a.d() * fp16(w.d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

// ---- tiles: one weight row against up to eight tokens ----
//
// As in `avx512`: each weight block is unpacked once for every token of the tile, and per
// token the arithmetic and its order are those of the `vec_dot` kernel above, so the outputs
// are equal bit for bit.

/// The f32 scales of a token group per block: eight lanes.
#[inline]
fn block_scales(scales: &[f32], blocks: usize) -> &[[f32; 8]] {
    &scales.as_chunks::<8>().0[..blocks]
}

/// Eight f32 scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(v: &[f32; 8]) -> __m256 {
    _mm256_loadu_ps(v.as_ptr())
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q4_1_q8_1<const T: usize>(
    w: &[u8],
    a: crate::kernels::TileActs,
    scales: &crate::kernels::TileScales,
    out: &mut [f32],
) {
    let (w, a) = tile_operands::<BlockQ4_1, BlockQ8_1, T>(w, a, scales, out);
    let ad = block_scales(scales.d, w.len());
    let mut acc = [_mm256_setzero_ps(); T];
    let s8 = block_scales(scales.s, w.len());
    let mut offsets = _mm256_setzero_ps();
    for (b, w) in w.iter().enumerate() {
        let q = nibbles(&w.qs);
        let wd = fp16(w.d);
        let mins = _mm256_mul_ps(_mm256_set1_ps(fp16(w.m)), load8(&s8[b]));
        offsets = _mm256_add_ps(offsets, mins);
        for t in 0..T {
            let sums = _mm256_cvtepi32_ps(dot_u8_i8(q, load_i8(&a[t][b].qs)));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(wd * ad[b][t]), sums, acc[t]);
        }
    }
    let mut offs = [0f32; 8];
    _mm256_storeu_ps(offs.as_mut_ptr(), offsets);
    for t in 0..T {
        out[t] = hsum(acc[t]) + offs[t];
    }
}

/// The tile of a format whose block unpacks to 32 signed quants against Q8_0 activations:
/// `$q` is the quants of block `$w` as i8, the rest of the loop is shared (the sign trick of
/// `dot_i8_i8`, with `|q|` made once per block for every token).
macro_rules! signed_tile {
    ($($kernel:ident: $block:ty, |$w:ident| $q:expr;)*) => {
        $(
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $kernel<const T: usize>(
                w: &[u8],
                a: crate::kernels::TileActs,
                scales: &crate::kernels::TileScales,
                out: &mut [f32],
            ) {
                let (w, a) = tile_operands::<$block, BlockQ8_0, T>(w, a, scales, out);
                let ad = block_scales(scales.d, w.len());
                let mut acc = [_mm256_setzero_ps(); T];
                for (b, $w) in w.iter().enumerate() {
                    let q = $q;
                    let abs_q = _mm256_sign_epi8(q, q);
                    let wd = fp16($w.d);
                    for t in 0..T {
                        let y = _mm256_sign_epi8(load_i8(&a[t][b].qs), q);
                        let sums = _mm256_cvtepi32_ps(dot_u8_i8(abs_q, y));
                        acc[t] =
                            _mm256_fmadd_ps(_mm256_set1_ps(wd * ad[b][t]), sums, acc[t]);
                    }
                }
                for t in 0..T {
                    out[t] = hsum(acc[t]);
                }
            }
        )*
    };
}

signed_tile! {
    tile_q4_0_q8_0: BlockQ4_0, |w| _mm256_sub_epi8(nibbles(&w.qs), _mm256_set1_epi8(8));
    tile_q5_0_q8_0: BlockQ5_0, |w| q5_0_quants(w);
    tile_q8_0_q8_0: BlockQ8_0, |w| load_i8(&w.qs);
    tile_iq4_nl_q8_0: BlockIq4Nl, |w| looked_up(&w.qs, table(&IQ4_VALUES));
}

/// IQ4_XS against up to 8 tokens: [`iq4_xs_q8_k`] token by token, each block's values looked
/// up once for every token.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_iq4_xs_q8_k<const T: usize>(
    w: &[u8],
    a: crate::kernels::TileActs,
    scales: &crate::kernels::TileScales,
    out: &mut [f32],
) {
    let (w, a) = tile_operands::<BlockIq4Xs, BlockQ8K, T>(w, a, scales, out);
    let values = table(&IQ4_VALUES);
    let mut acc = [_mm256_setzero_ps(); T];
    for (b, w) in w.iter().enumerate() {
        let groups = w.qs.as_chunks::<16>().0;
        let mut q = [_mm256_setzero_si256(); 8];
        let mut group_scales = [_mm256_setzero_si256(); 8];
        for (g, scale) in w.scales().into_iter().enumerate() {
            q[g] = looked_up(&groups[g], values);
            group_scales[g] = _mm256_set1_epi32(scale);
        }
        let wd = fp16(w.d);
        for t in 0..T {
            let mut sumi = _mm256_setzero_si256();
            for ((q, scale), a) in q
                .iter()
                .zip(&group_scales)
                .zip(a[t][b].qs.as_chunks::<32>().0)
            {
                let sums = dot_i8_i8(*q, load_i8(a));
                sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(sums, *scale));
            }
            let d = _mm256_set1_ps(wd * a[t][b].d());
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    for t in 0..T {
        out[t] = hsum(acc[t]);
    }
}

/// The IQ1, IQ2 and IQ3 formats against up to 8 tokens: [`signed_grid_q8_k`] token by token, each
/// block's vectors gathered once.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_signed_grid_q8_k<B: SignedGridBlock, const T: usize>(
    w: &[u8],
    a: crate::kernels::TileActs,
    scales: &crate::kernels::TileScales,
    out: &mut [f32],
) {
    let (w, a) = tile_operands::<B, BlockQ8K, T>(w, a, scales, out);
    let mut acc = [0f32; T];
    for (b, w) in w.iter().enumerate() {
        let chunks = signed_chunks(w);
        let group_scales = scale_vectors(&w.scales());
        let wd = grid_d(w);
        for t in 0..T {
            let sumi = grid_sums(&chunks, &group_scales, &a[t][b]);
            acc[t] = grid_block_sum(acc[t], wd * a[t][b].d(), sumi);
        }
    }
    out.copy_from_slice(&acc);
}

macro_rules! tile_entry_points {
    ($($kernel:ident $(<$block:ty>)? => $entry:ident),* $(,)?) => {
        $(
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $entry(w: &[u8], a: crate::kernels::TileActs, scales: &crate::kernels::TileScales, out: &mut [f32]) {
                match a.len() {
                    8 => $kernel::<$($block,)? 8>(w, a, scales, out),
                    7 => $kernel::<$($block,)? 7>(w, a, scales, out),
                    6 => $kernel::<$($block,)? 6>(w, a, scales, out),
                    5 => $kernel::<$($block,)? 5>(w, a, scales, out),
                    4 => $kernel::<$($block,)? 4>(w, a, scales, out),
                    3 => $kernel::<$($block,)? 3>(w, a, scales, out),
                    2 => $kernel::<$($block,)? 2>(w, a, scales, out),
                    1 => $kernel::<$($block,)? 1>(w, a, scales, out),
                    n => panic!("no tile of {n} tokens"),
                }
            }
        )*
    };
}

tile_entry_points!(
    tile_q4_0_q8_0 => tile_q4_0,
    tile_q4_1_q8_1 => tile_q4_1,
    tile_q5_0_q8_0 => tile_q5_0,
    tile_q8_0_q8_0 => tile_q8_0,
    tile_iq4_nl_q8_0 => tile_iq4_nl,
    tile_iq4_xs_q8_k => tile_iq4_xs,
    tile_signed_grid_q8_k<BlockIq2Xxs> => tile_iq2_xxs,
    tile_signed_grid_q8_k<BlockIq2Xs> => tile_iq2_xs,
    tile_signed_grid_q8_k<BlockIq2S> => tile_iq2_s,
    tile_signed_grid_q8_k<BlockIq3Xxs> => tile_iq3_xxs,
    tile_signed_grid_q8_k<BlockIq3S> => tile_iq3_s,
    tile_signed_grid_q8_k<BlockIq1S> => tile_iq1_s,
    tile_signed_grid_q8_k<BlockIq1M> => tile_iq1_m,
    tile_ternary_q8_k<BlockTq1_0> => tile_tq1_0,
    tile_ternary_q8_k<BlockTq2_0> => tile_tq2_0,
);
