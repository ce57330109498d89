//! The x86-64 kernels: [`avx2`] (with FMA and F16C) and [`avx512`] (F and BW, with VNNI or
//! without), each listing its own kernels in its `row` and `float_row` functions; the code
//! both sets compile at their width: the packed kernels' one loop ([`packed`]) and the
//! attention tile kernel with fused multiply-adds ([`attention`]).

use std::arch::x86_64::*;

/// Q8_0 and Q8_1 blocks quantized together by a row quantizer: their scales `d` and (Q8_1)
/// `s` as f16 bits, their quants, and which of them took the vector path (bit `i` for block
/// `i`); the others go through the scalar quantizer.
struct Q8Group<const G: usize> {
    d: [u16; G],
    s: [u16; G],
    qs: [[i8; 32]; G],
    fast: u32,
}

/// A Q8_0 or Q8_1 block, as the row quantizers write it.
trait Q8Block {
    /// Sets the block from its scale and quants and (Q8_1) the f16 bits of their sum times
    /// the scale.
    fn set(&mut self, d: u16, s: u16, qs: [i8; 32]);
    /// Quantizes `x` with the scalar quantizer.
    fn reference(&mut self, x: &[f32; 32]);
}

impl Q8Block for crate::blocks::BlockQ8_0 {
    fn set(&mut self, d: u16, _: u16, qs: [i8; 32]) {
        self.d = d.to_le_bytes();
        self.qs = qs;
    }

    fn reference(&mut self, x: &[f32; 32]) {
        crate::reference::quantize::q8_0(x, self)
    }
}

impl Q8Block for crate::blocks::BlockQ8_1 {
    fn set(&mut self, d: u16, s: u16, qs: [i8; 32]) {
        self.d = d.to_le_bytes();
        self.s = s.to_le_bytes();
        self.qs = qs;
    }

    fn reference(&mut self, x: &[f32; 32]) {
        crate::reference::quantize::q8_1(x, self)
    }
}

/// `d` and `s` as f16 bits, rounded to nearest even (as `crate::fp16::f32_to_f16`).
#[inline]
#[target_feature(enable = "f16c")]
unsafe fn f16_pair(d: f32, s: f32) -> (u16, u16) {
    let halves = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_setr_ps(d, s, 0.0, 0.0));
    let bits = _mm_cvtsi128_si32(halves) as u32;
    (bits as u16, (bits >> 16) as u16)
}

/// The row quantizers `q8_0`, `q8_1` and `q8_k`, compiled with `$features` (which include
/// F16C), over the calling module's `q8_group(&[f32; 32 * GROUP]) -> Q8Group<GROUP>` (blocks
/// `GROUP` at a time: their maxima and sums taken across blocks in vectors), `q8_block(&[f32;
/// 32]) -> Option<(d, quants, sum)>` (one block, for the last blocks of a row; `None`: the
/// block takes the scalar quantizer) and `q8_k_block(&[f32; 256], &mut BlockQ8K) -> bool` (one
/// Q8_K block; `false`: it takes the scalar quantizer), so that every instruction set's
/// quantizers write blocks the same way.
macro_rules! q8_row_quantizers {
    ($features:literal) => {
        /// The blocks of `x` into `blocks`.
        #[target_feature(enable = $features)]
        unsafe fn q8_rows<B: crate::kernels::x86::Q8Block>(x: &[f32], blocks: &mut [B]) {
            let groups = x.as_chunks::<{ 32 * GROUP }>().0;
            let (grouped, rest) = blocks.split_at_mut(groups.len() * GROUP);
            for (xs, bs) in groups.iter().zip(grouped.chunks_exact_mut(GROUP)) {
                let g = q8_group(xs);
                for (i, (b, xs)) in bs.iter_mut().zip(xs.as_chunks::<32>().0).enumerate() {
                    match g.fast >> i & 1 == 1 {
                        true => b.set(g.d[i], g.s[i], g.qs[i]),
                        false => b.reference(xs),
                    }
                }
            }
            let rest_x = &x[groups.len() * GROUP * 32..];
            for (xs, b) in rest_x.as_chunks::<32>().0.iter().zip(rest) {
                match q8_block(xs) {
                    Some((d, qs, sum)) => {
                        let (d_bits, s_bits) = crate::kernels::x86::f16_pair(d, sum as f32 * d);
                        b.set(d_bits, s_bits, qs);
                    }
                    None => b.reference(xs),
                }
            }
        }

        /// Q8_0 blocks of the row `x` into `dst`.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn q8_0(x: &[f32], dst: &mut [u8]) {
            q8_rows(
                x,
                crate::blocks::as_blocks_mut::<crate::blocks::BlockQ8_0>(dst),
            );
        }

        /// Q8_1 blocks of the row `x` into `dst`.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn q8_1(x: &[f32], dst: &mut [u8]) {
            q8_rows(
                x,
                crate::blocks::as_blocks_mut::<crate::blocks::BlockQ8_1>(dst),
            );
        }

        /// Q8_K blocks of the row `x` into `dst`.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn q8_k(x: &[f32], dst: &mut [u8]) {
            let blocks = crate::blocks::as_blocks_mut::<crate::blocks::BlockQ8K>(dst);
            for (xs, b) in x.as_chunks::<256>().0.iter().zip(blocks) {
                if !q8_k_block(xs, b) {
                    crate::reference::quantize::q8_k(xs, b);
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
mod cpu;
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
