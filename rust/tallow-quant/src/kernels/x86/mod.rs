//! The x86-64 kernels: [`avx2`] (with FMA and F16C) and [`avx512`] (F and BW, with VNNI or
//! without), each listing its own kernels in its `row` and `float_row` functions; the code
//! both sets compile at their width: the packed kernels' one loop ([`packed`]) and the
//! attention tile kernel with fused multiply-adds ([`attention`]).

use std::arch::x86_64::*;

/// The row quantizers `q8_0` and `q8_1`, compiled with `$features`, over the calling module's
/// `q8_block(&[f32; 32]) -> Option<(d, quants, sum)>` (`None`: the block takes the scalar
/// quantizer), so that every instruction set's quantizers write blocks the same way.
macro_rules! q8_row_quantizers {
    ($features:literal) => {
        /// Q8_0 blocks of the row `x` into `dst`.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn q8_0(x: &[f32], dst: &mut [u8]) {
            let blocks = crate::blocks::as_blocks_mut::<crate::blocks::BlockQ8_0>(dst);
            for (xs, b) in x.as_chunks::<32>().0.iter().zip(blocks) {
                match q8_block(xs) {
                    Some((d, qs, _)) => {
                        b.d = crate::fp16::f32_to_f16(d);
                        b.qs = qs;
                    }
                    None => crate::reference::quantize::q8_0(xs, b),
                }
            }
        }

        /// Q8_1 blocks of the row `x` into `dst`.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn q8_1(x: &[f32], dst: &mut [u8]) {
            let blocks = crate::blocks::as_blocks_mut::<crate::blocks::BlockQ8_1>(dst);
            for (xs, b) in x.as_chunks::<32>().0.iter().zip(blocks) {
                match q8_block(xs) {
                    Some((d, qs, sum)) => {
                        b.d = crate::fp16::f32_to_f16(d);
                        b.s = crate::fp16::f32_to_f16(sum as f32 * d);
                        b.qs = qs;
                    }
                    None => crate::reference::quantize::q8_1(xs, b),
                }
            }
        }
    };
}

/// `unsafe fn $name(args)` calling `$generic(args)`, compiled with `$features`: a loop
/// written once in portable Rust, vectorized for one instruction set.
macro_rules! compiled_with {
    ($features:literal: $($name:ident => $generic:expr, ($($arg:ident: $ty:ty),*);)*) => {
        $(
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name($($arg: $ty),*) {
                $generic($($arg),*)
            }
        )*
    };
}

mod attention;
pub(crate) mod avx2;
pub(crate) mod avx512;
mod packed;

/// Products of unsigned and signed bytes, summed in fours into i32 lanes.
pub(super) trait DotBytes {
    /// Whether [`DotBytes::dot`] is one instruction: then a sum of byte products is cheapest
    /// taken four bytes at a time, straight into i32 lanes.
    const FUSED: bool;
    /// `acc` plus, in each i32 lane, the sum of the four products `u[i] * s[i]`.
    unsafe fn dot(acc: __m512i, u: __m512i, s: __m512i) -> __m512i;
    /// `acc` plus, in each i32 lane, the sum of the two products of its i16 `a[i] * b[i]`.
    unsafe fn dot_i16(acc: __m512i, a: __m512i, b: __m512i) -> __m512i;
}

/// `vpmaddubsw` then `vpmaddwd`. The i16 pair sums cannot saturate for tallow's operands
/// (quants below 128 against activations within -127..=127).
pub(super) struct Bw;

impl DotBytes for Bw {
    const FUSED: bool = false;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn dot(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        let pairs = _mm512_maddubs_epi16(u, s);
        _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn dot_i16(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
    }
}

/// One `vpdpbusd`.
pub(super) struct Vnni;

impl DotBytes for Vnni {
    const FUSED: bool = true;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dot(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(acc, u, s)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dot_i16(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        _mm512_dpwssd_epi32(acc, a, b)
    }
}

/// Checks the operands of a tile kernel of `T` tokens and views them as blocks: the weight
/// row and the activation rows, all of the same length (so that the loops index them without
/// checks).
#[inline]
fn tile_operands<'a, W: crate::blocks::Block, A: crate::blocks::Block, const T: usize>(
    w: &'a [u8],
    a: crate::kernels::TileActs<'a>,
    scales: &super::TileScales,
    out: &[f32],
) -> (&'a [W], [&'a [A]; T]) {
    let w = crate::blocks::as_blocks::<W>(w);
    let (acts, blocks) = a.blocks::<A>();
    assert!(blocks == w.len() && a.len() == T && out.len() == T);
    scales.check(w.len(), T);
    let a: [&[A]; T] = std::array::from_fn(|t| &acts[t * blocks..(t + 1) * blocks]);
    (w, a)
}
