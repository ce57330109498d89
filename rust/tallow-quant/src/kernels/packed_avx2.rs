//! AVX2 kernels (with FMA and F16C) for weights packed in groups of [`PACK_ROWS`] rows (see
//! `crate::packed` and its `layout`). A 64-byte word of a packed block holds one step (four
//! columns) of all 16 rows; AVX2 takes it as two halves of 8 rows, one i32 lane per row of a
//! 256-bit vector, so that 32 columns of 8 rows against one token are 8 byte dot products
//! with the token's activation bytes broadcast four at a time, and need no horizontal sum.
//! A sub-block goes in passes of four steps (two for Q8_0, whose steps are two vectors): the
//! pass's steps of both halves are unpacked into registers, and each activation broadcast
//! serves both halves. A block is one stream read once, in order.
//!
//! Every format runs through one loop, [`packed`]; a [`Format`] says how a block's steps and
//! scales unpack and how its integer sums become floats. Products use `vpmaddubsw` (unsigned
//! weight bytes against signed activation bytes within -127..=127), whose i16 pair sums are
//! added as i16 for the steps of a pass (4; 2 for the 6-bit quants, whose pairs reach
//! 2 * 63 * 127 and whose scale changes every 16 columns) and then widened by `vpmaddwd`
//! against the sub-block's integer scale (1 where the format has none), so that a block's
//! integer sum is exact. Q8_0's stored quants (`q + 128`, up to 255) would
//! saturate the pair sums, so its steps take the signed `q` back and move its sign onto the
//! activations (`|q|` against `sign(q) * y`: pairs within 2 * 128 * 127).
//!
//! Per row the integer sums are exact and the f32 operations are those of the scalar packed
//! kernels (`super::packed_scalar`) and the AVX-512 ones in the same order, so the outputs are
//! equal bit for bit, and a token's outputs do not depend on the other tokens of the tile.
//!
//! # Safety
//! Every function here needs AVX2, FMA and F16C; `super::Isa::kernels` only hands them out
//! when the CPU has them.

use std::arch::x86_64::*;

use super::packed_operands::{act_quad, Bytes, Operands};
use super::{TileScales, PACK_ROWS};
use crate::blocks::{Block, BlockQ8K, BlockQ8_0, BlockQ8_1};

/// Rows per 256-bit vector: half a group.
const HALF: usize = PACK_ROWS / 2;

/// `[f(0), .., f(n - 1)]` of 256-bit integer vectors, built by a loop in the function that
/// uses it: a closure is a function of its own, which the compiler may leave out of line.
macro_rules! vectors {
    ($n:expr, |$i:ident| $body:expr) => {{
        let mut out = [_mm256_setzero_si256(); $n];
        for $i in 0..$n {
            out[$i] = $body;
        }
        out
    }};
}

/// A packed format, as the loop [`packed`] runs it.
trait Format {
    /// The activations' block.
    type Act: Block;
    /// A packed block's f16 fields and its words.
    type Fields: Bytes;
    type Words: Bytes;
    /// Sub-blocks of 32 columns in a block.
    const SUBS: usize;
    /// What one half of a block gives every token (its scales).
    type Half;
    /// One unpacked step (four columns of each row of a half).
    type Step: Copy;

    /// Half `h` of the block's scales.
    unsafe fn half(fields: &Self::Fields, words: &Self::Words, h: usize) -> Self::Half;
    /// Step `c` of sub-block `s` of half `h`. (One step per call: a call the compiler can
    /// always inline, where a whole sub-block's did not get inlined.)
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> Self::Step;
    /// Steps of a pass: both halves' steps of a pass are held at once (in at most 8
    /// registers), so that each activation broadcast serves both halves.
    const PASS: usize;
    /// Per row (i32 lane), the dot product of steps `first..first + PASS` of sub-block `s`
    /// (`steps`) with the token's activation bytes `y`, times the steps' integer scale.
    unsafe fn pass_sum(
        steps: &[Self::Step],
        y: &[i8; 32],
        half: &Self::Half,
        s: usize,
        first: usize,
    ) -> __m256i;
    /// The activation bytes of sub-block `s`.
    fn y(act: &Self::Act, s: usize) -> &[i8; 32];
    /// `acc` plus the block's products for one token: `isum` is the sum of its
    /// [`Format::pass_sum`]s, `da` and `sa` the token's f32 block scale and sum.
    unsafe fn finish(
        acc: __m256,
        isum: __m256i,
        half: &Self::Half,
        act: &Self::Act,
        da: f32,
        sa: f32,
    ) -> __m256;
}

/// The packed product of any [`Format`], for a tile of `T` tokens. Out of line: each tile
/// width is a function of its own, which gives the compiler room to inline a format's
/// unpacking into it.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed<F: Format, const T: usize>(
    groups: &[u8],
    a: &[&[u8]],
    scales: &TileScales,
    out: &mut [&mut [f32]],
) {
    let ops = Operands::<F::Act, F::Fields, F::Words, T>::new(groups, a, scales, out);
    let (acts, da, sa) = (&ops.acts, ops.d, ops.s);
    for (g, blocks) in ops.each_group().enumerate() {
        // Per half, the outputs of each token.
        let mut acc = [[_mm256_setzero_ps(); T]; 2];
        for (b, (fields, words)) in blocks.enumerate() {
            if T == 1 {
                prefetch_ahead::<F>(fields);
            }
            let halves = [F::half(fields, words, 0), F::half(fields, words, 1)];
            let mut isum = [[_mm256_setzero_si256(); T]; 2];
            for s in 0..F::SUBS {
                for first in (0..8).step_by(F::PASS) {
                    let mut steps = [[F::step(words, 0, s, first); 4]; 2];
                    for (h, steps) in steps.iter_mut().enumerate() {
                        for (i, step) in steps.iter_mut().enumerate().take(F::PASS) {
                            *step = F::step(words, h, s, first + i);
                        }
                    }
                    for t in 0..T {
                        let y = F::y(&acts[t][b], s);
                        for (h, isum) in isum.iter_mut().enumerate() {
                            let steps = &steps[h][..F::PASS];
                            let sum = F::pass_sum(steps, y, &halves[h], s, first);
                            isum[t] = _mm256_add_epi32(isum[t], sum);
                        }
                    }
                }
            }
            for ((acc, isum), half) in acc.iter_mut().zip(&isum).zip(&halves) {
                for t in 0..T {
                    let lane = ops.lane0 + t;
                    let (d, s) = (da[b][lane], sa[b][lane]);
                    acc[t] = F::finish(acc[t], isum[t], half, &acts[t][b], d, s);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (rows, acc) in out.iter_mut().zip(acc) {
                let rows = &mut rows[g * PACK_ROWS + h * HALF..][..HALF];
                _mm256_storeu_ps(rows.as_mut_ptr(), *acc);
            }
        }
    }
}

/// How far ahead of the block it reads a one-token product asks for the weights. A
/// matrix-vector product is one stream of weights read once; on Zen 3 the hardware prefetcher
/// alone left 10-20% of the memory bandwidth of two threads unused (Q8_0 262144 x 640: 28.8
/// against 33-35 GB/s with 512-2048 bytes ahead; 8 KiB ahead gained nothing). Tiles of several
/// tokens compute long enough on each block for the hardware prefetcher to keep up.
const PREFETCH_AHEAD: usize = 768;

/// Asks for the cache lines [`PREFETCH_AHEAD`] bytes after each line of the block at `fields`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prefetch_ahead<F: Format>(fields: &F::Fields) {
    let block = (fields as *const F::Fields).cast::<i8>();
    for line in (0..F::Fields::LEN + F::Words::LEN).step_by(64) {
        // A prefetch reads nothing and never faults, past the end of the weights included.
        _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_AHEAD + line));
    }
}

// ---- unpacking ----

/// Eight f16 values (one per row of half `h`) of f16 field `k` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn field(fields: &[u8], k: usize, h: usize) -> __m256 {
    let bytes: &[u8; 16] = fields[32 * k + 16 * h..][..16].try_into().unwrap();
    _mm256_cvtph_ps(_mm_loadu_si128(bytes.as_ptr().cast()))
}

/// Half `h` of word `w`: its 32 bytes for rows `8h..8h + 8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn word(words: &[u8], w: usize, h: usize) -> __m256i {
    let half: &[u8; 32] = words[64 * w + 32 * h..][..32].try_into().unwrap();
    _mm256_loadu_si256(half.as_ptr().cast())
}

/// The low (`n == 0`) or high (`n == 1`) nibbles of `v`'s bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(v: __m256i, n: usize) -> __m256i {
    let v = if n == 0 { v } else { _mm256_srli_epi16::<4>(v) };
    _mm256_and_si256(v, _mm256_set1_epi8(0xf))
}

/// The bits of `v`'s bytes at `from..` moved to bit 4 and up, kept where `mask` is set. A
/// 16-bit shift of at most 4 places cannot carry another byte's bits into bits 4 and 5.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_to_4(v: __m256i, from: usize, mask: i8) -> __m256i {
    let shifted = if from <= 4 {
        _mm256_sll_epi16(v, _mm_cvtsi32_si128(4 - from as i32))
    } else {
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(from as i32 - 4))
    };
    _mm256_and_si256(shifted, _mm256_set1_epi8(mask))
}

/// Per i32 lane, bytes `lo` and `hi` of the lane as the two i16 of the lane: zero-extended,
/// or sign-extended with `signed`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn byte_pair(v: __m256i, lo: usize, hi: usize, signed: bool) -> __m256i {
    // Byte offsets of each lane in its 128-bit half, which `vpshufb` indexes; an index with
    // bit 7 set gives 0.
    let lanes = _mm256_setr_epi8(
        0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12,
        12, 12, 12,
    );
    let (lo, hi) = (lo as i32, hi as i32);
    let zero = 0x80;
    let pattern = if signed {
        zero | (lo << 8) | (zero << 16) | (hi << 24)
    } else {
        lo | (zero << 8) | (hi << 16) | (zero << 24)
    };
    let picked = _mm256_shuffle_epi8(v, _mm256_add_epi8(_mm256_set1_epi32(pattern), lanes));
    if signed {
        _mm256_srai_epi16::<8>(picked)
    } else {
        picked
    }
}

// ---- integer sums ----

/// Activation bytes `4j..4j + 4` of `y` in every i32 lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quad(y: &[i8; 32], j: usize) -> __m256i {
    _mm256_set1_epi32(act_quad(y, j))
}

/// Per row (i32 lane), the dot product of the steps `first..` (`steps`) of unsigned weight
/// bytes with `y`, summed as i16 in runs of `N` steps, run `r` of the sub-block widened against
/// the i16 pairs `scale(r)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_sum<const N: usize>(
    steps: &[__m256i],
    y: &[i8; 32],
    first: usize,
    scale: impl Fn(usize) -> __m256i,
) -> __m256i {
    let mut sums = _mm256_setzero_si256();
    for (r, run) in steps.chunks_exact(N).enumerate() {
        let at = first + r * N;
        let product = |i: usize| _mm256_maddubs_epi16(run[i], quad(y, at + i));
        let pairs = (1..N).fold(product(0), |pairs, i| _mm256_add_epi16(pairs, product(i)));
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, scale(at / N)));
    }
    sums
}

/// Per row (i32 lane), the sum of the products of the i16 pairs of `pairs(k)` with the
/// token's group sums `2k` and `2k + 1` (of 16 columns each), over the block's 8 pairs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_bsums(act: &BlockQ8K, pairs: &[__m256i; 8]) -> __m256i {
    let mut sums = _mm256_setzero_si256();
    for (k, &pair) in pairs.iter().enumerate() {
        let bsums: [u8; 4] = act.bsums[4 * k..4 * k + 4].try_into().unwrap();
        let bsums = _mm256_set1_epi32(i32::from_le_bytes(bsums));
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pair, bsums));
    }
    sums
}

/// Scale `d` times the token's scale `da`, times `sums`, plus `acc`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled(acc: __m256, d: __m256, da: f32, sums: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(da)), sums, acc)
}

// ---- the 32-column formats ----

/// `d * da * (sum(q * y) - offset * sum(y))` for quants stored as `q + offset`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset_block(
    acc: __m256,
    isum: __m256i,
    d: __m256,
    da: f32,
    sa: f32,
    offset: f32,
) -> __m256 {
    let sums = _mm256_fnmadd_ps(
        _mm256_set1_ps(offset),
        _mm256_set1_ps(sa),
        _mm256_cvtepi32_ps(isum),
    );
    scaled(acc, d, da, sums)
}

struct Q40;

impl Format for Q40 {
    type Act = BlockQ8_0;
    type Fields = [u8; 32];
    type Words = [u8; 256];
    const SUBS: usize = 1;
    const PASS: usize = 4;
    type Half = __m256;
    type Step = __m256i;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(fields: &[u8; 32], _: &[u8; 256], h: usize) -> __m256 {
        field(fields, 0, h)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &[u8; 256], h: usize, _: usize, c: usize) -> __m256i {
        nibbles(word(words, c % 4, h), c / 4)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        steps: &[__m256i],
        y: &[i8; 32],
        _: &__m256,
        _: usize,
        first: usize,
    ) -> __m256i {
        weighted_sum::<4>(steps, y, first, |_| _mm256_set1_epi16(1))
    }
    fn y(act: &BlockQ8_0, _: usize) -> &[i8; 32] {
        &act.qs
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(
        acc: __m256,
        isum: __m256i,
        d: &__m256,
        _: &BlockQ8_0,
        da: f32,
        sa: f32,
    ) -> __m256 {
        offset_block(acc, isum, *d, da, sa, 8.0)
    }
}

/// Q4_1: `d * da * sum(q * y) + m * sa`.
struct Q41;

impl Format for Q41 {
    type Act = BlockQ8_1;
    type Fields = [u8; 64];
    type Words = [u8; 256];
    const SUBS: usize = 1;
    const PASS: usize = 4;
    type Half = (__m256, __m256);
    type Step = __m256i;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(fields: &[u8; 64], _: &[u8; 256], h: usize) -> (__m256, __m256) {
        (field(fields, 0, h), field(fields, 1, h))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &[u8; 256], h: usize, _: usize, c: usize) -> __m256i {
        nibbles(word(words, c % 4, h), c / 4)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        steps: &[__m256i],
        y: &[i8; 32],
        _: &Self::Half,
        _: usize,
        first: usize,
    ) -> __m256i {
        weighted_sum::<4>(steps, y, first, |_| _mm256_set1_epi16(1))
    }
    fn y(act: &BlockQ8_1, _: usize) -> &[i8; 32] {
        &act.qs
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(
        acc: __m256,
        isum: __m256i,
        &(d, m): &Self::Half,
        _: &BlockQ8_1,
        da: f32,
        sa: f32,
    ) -> __m256 {
        let acc = scaled(acc, d, da, _mm256_cvtepi32_ps(isum));
        _mm256_fmadd_ps(m, _mm256_set1_ps(sa), acc)
    }
}

/// Q5_0: as Q4_0 with the fifth bits of word 4 (bit `j` of byte `i`: column `4j + i`) and
/// offset 16.
struct Q50;

impl Format for Q50 {
    type Act = BlockQ8_0;
    type Fields = [u8; 32];
    type Words = [u8; 320];
    const SUBS: usize = 1;
    const PASS: usize = 4;
    type Half = __m256;
    type Step = __m256i;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(fields: &[u8; 32], _: &[u8; 320], h: usize) -> __m256 {
        field(fields, 0, h)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &[u8; 320], h: usize, _: usize, c: usize) -> __m256i {
        let low = nibbles(word(words, c % 4, h), c / 4);
        _mm256_or_si256(low, bits_to_4(word(words, 4, h), c, 0x10))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        steps: &[__m256i],
        y: &[i8; 32],
        _: &__m256,
        _: usize,
        first: usize,
    ) -> __m256i {
        weighted_sum::<4>(steps, y, first, |_| _mm256_set1_epi16(1))
    }
    fn y(act: &BlockQ8_0, _: usize) -> &[i8; 32] {
        &act.qs
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(
        acc: __m256,
        isum: __m256i,
        d: &__m256,
        _: &BlockQ8_0,
        da: f32,
        sa: f32,
    ) -> __m256 {
        offset_block(acc, isum, *d, da, sa, 16.0)
    }
}

/// Q8_0: `d * da * sum(q * y)`, the steps as signed `q` and `|q|`.
struct Q80;

impl Format for Q80 {
    type Act = BlockQ8_0;
    type Fields = [u8; 32];
    type Words = [u8; 512];
    const SUBS: usize = 1;
    const PASS: usize = 2;
    type Half = __m256;
    type Step = (__m256i, __m256i);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(fields: &[u8; 32], _: &[u8; 512], h: usize) -> __m256 {
        field(fields, 0, h)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &[u8; 512], h: usize, _: usize, c: usize) -> (__m256i, __m256i) {
        let signed = _mm256_xor_si256(word(words, c, h), _mm256_set1_epi8(-128));
        (signed, _mm256_abs_epi8(signed))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        steps: &[(__m256i, __m256i)],
        y: &[i8; 32],
        _: &__m256,
        _: usize,
        first: usize,
    ) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        let mut sums = _mm256_setzero_si256();
        for (j, &(signed, magnitude)) in steps.iter().enumerate() {
            let y = _mm256_sign_epi8(quad(y, first + j), signed);
            let pairs = _mm256_maddubs_epi16(magnitude, y);
            sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, ones));
        }
        sums
    }
    fn y(act: &BlockQ8_0, _: usize) -> &[i8; 32] {
        &act.qs
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(
        acc: __m256,
        isum: __m256i,
        d: &__m256,
        _: &BlockQ8_0,
        da: f32,
        _: f32,
    ) -> __m256 {
        scaled(acc, *d, da, _mm256_cvtepi32_ps(isum))
    }
}

// ---- K-quants: 256 columns, 8 sub-blocks ----

/// The scales of half a Q4_K/Q5_K block: `d`, `dmin`, and per sub-block its 6-bit scale and
/// min, each in both i16 of every lane.
struct K4Half {
    d: __m256,
    dmin: __m256,
    scales: [__m256i; 8],
    mins: [__m256i; 8],
}

/// Unpacks the 12 scale bytes of each row (words 0..3, as `crate::blocks::k4_scales_mins`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_half(fields: &[u8; 64], words: &[u8], h: usize) -> K4Half {
    let [p0, p1, p2] = vectors!(3, |w| word(words, w, h));
    let low6 = _mm256_set1_epi8(0x3f);
    let low4 = _mm256_set1_epi8(0xf);
    let top2 = _mm256_set1_epi8(0x30);
    // Bytes 0..4 of a lane: scales (mins) 0..4, then 4..8.
    let scales = [
        _mm256_and_si256(p0, low6),
        _mm256_or_si256(
            _mm256_and_si256(p2, low4),
            _mm256_and_si256(_mm256_srli_epi16::<2>(p0), top2),
        ),
    ];
    let mins = [
        _mm256_and_si256(p1, low6),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(p2), low4),
            _mm256_and_si256(_mm256_srli_epi16::<2>(p1), top2),
        ),
    ];
    K4Half {
        d: field(fields, 0, h),
        dmin: field(fields, 1, h),
        scales: vectors!(8, |s| byte_pair(scales[s / 4], s % 4, s % 4, false)),
        mins: vectors!(8, |s| byte_pair(mins[s / 4], s % 4, s % 4, false)),
    }
}

/// Q4_K and Q5_K: `d * da * sum(scale * q * y) - dmin * da * sum(min * y)`, the mins
/// against the token's group sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_finish(acc: __m256, isum: __m256i, half: &K4Half, act: &BlockQ8K, da: f32) -> __m256 {
    let mins = _mm256_cvtepi32_ps(weighted_bsums(act, &half.mins));
    let acc = scaled(acc, half.d, da, _mm256_cvtepi32_ps(isum));
    _mm256_fnmadd_ps(_mm256_mul_ps(half.dmin, _mm256_set1_ps(da)), mins, acc)
}

fn k_y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
    act.qs[32 * s..32 * s + 32].try_into().unwrap()
}

struct Q4K;

impl Format for Q4K {
    type Act = BlockQ8K;
    type Fields = [u8; 64];
    type Words = [u8; 35 * 64];
    const SUBS: usize = 8;
    const PASS: usize = 4;
    type Half = K4Half;
    type Step = __m256i;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(fields: &[u8; 64], words: &Self::Words, h: usize) -> K4Half {
        k4_half(fields, words, h)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> __m256i {
        nibbles(word(words, 3 + 8 * (s / 2) + c, h), s % 2)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        steps: &[__m256i],
        y: &[i8; 32],
        half: &K4Half,
        s: usize,
        first: usize,
    ) -> __m256i {
        weighted_sum::<4>(steps, y, first, |_| half.scales[s])
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(
        acc: __m256,
        isum: __m256i,
        half: &K4Half,
        act: &BlockQ8K,
        da: f32,
        _: f32,
    ) -> __m256 {
        k4_finish(acc, isum, half, act, da)
    }
}

/// Q5_K: Q4_K's nibbles (from word 11) with a fifth bit, bit `s` of word `3 + c` for step `c`
/// of sub-block `s`.
struct Q5K;

impl Format for Q5K {
    type Act = BlockQ8K;
    type Fields = [u8; 64];
    type Words = [u8; 43 * 64];
    const SUBS: usize = 8;
    const PASS: usize = 4;
    type Half = K4Half;
    type Step = __m256i;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(fields: &[u8; 64], words: &Self::Words, h: usize) -> K4Half {
        k4_half(fields, words, h)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> __m256i {
        let low = nibbles(word(words, 11 + 8 * (s / 2) + c, h), s % 2);
        _mm256_or_si256(low, bits_to_4(word(words, 3 + c, h), s, 0x10))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        steps: &[__m256i],
        y: &[i8; 32],
        half: &K4Half,
        s: usize,
        first: usize,
    ) -> __m256i {
        weighted_sum::<4>(steps, y, first, |_| half.scales[s])
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(
        acc: __m256,
        isum: __m256i,
        half: &K4Half,
        act: &BlockQ8K,
        da: f32,
        _: f32,
    ) -> __m256 {
        k4_finish(acc, isum, half, act, da)
    }
}

/// The scales of half a Q6_K block: `d`; per group of 16 columns its signed scale in both
/// i16 of every lane; per pair of groups `2k, 2k + 1` their two scales.
struct Q6Half {
    d: __m256,
    scales: [__m256i; 16],
    pairs: [__m256i; 8],
}

/// Q6_K: `d * da * sum(scale * (q - 32) * y)`, with `q` (0..64) taken as unsigned bytes and
/// the 32 subtracted through the token's group sums. Sub-block `s` is columns `32s..`, run
/// `k = s % 4` of GGUF half `s / 4`: its step `c` has its low 4 bits in word
/// `4 + 16(s / 4) + 8(k % 2) + c` (low nibbles for `k < 2`) and its top 2 bits at bits `2k`
/// of word `36 + 8(s / 4) + c`.
struct Q6K;

impl Format for Q6K {
    type Act = BlockQ8K;
    type Fields = [u8; 32];
    type Words = [u8; 52 * 64];
    const SUBS: usize = 8;
    const PASS: usize = 4;
    type Half = Q6Half;
    type Step = __m256i;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(fields: &[u8; 32], words: &Self::Words, h: usize) -> Q6Half {
        let planes = vectors!(4, |w| word(words, w, h));
        Q6Half {
            d: field(fields, 0, h),
            scales: vectors!(16, |g| byte_pair(planes[g / 4], g % 4, g % 4, true)),
            pairs: vectors!(8, |k| byte_pair(
                planes[k / 2],
                2 * (k % 2),
                2 * (k % 2) + 1,
                true
            )),
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> __m256i {
        let (half, k) = (s / 4, s % 4);
        let low = nibbles(word(words, 4 + 16 * half + 8 * (k % 2) + c, h), k / 2);
        let top = bits_to_4(word(words, 36 + 8 * half + c, h), 2 * k, 0x30);
        _mm256_or_si256(low, top)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        steps: &[__m256i],
        y: &[i8; 32],
        half: &Q6Half,
        s: usize,
        first: usize,
    ) -> __m256i {
        // Runs of 2 steps: runs 0 and 1 are group 2s, runs 2 and 3 group 2s + 1.
        weighted_sum::<2>(steps, y, first, |r| half.scales[2 * s + r / 2])
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(
        acc: __m256,
        isum: __m256i,
        half: &Q6Half,
        act: &BlockQ8K,
        da: f32,
        _: f32,
    ) -> __m256 {
        let offsets = _mm256_slli_epi32::<5>(weighted_bsums(act, &half.pairs));
        scaled(
            acc,
            half.d,
            da,
            _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, offsets)),
        )
    }
}

/// Declares each format's entry point, one tile width per token count (1 to 8, picked by
/// `a.len()`).
macro_rules! packed_entry_points {
    ($($format:ident => $entry:ident),* $(,)?) => {
        $(
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn $entry(
                groups: &[u8],
                a: &[&[u8]],
                scales: &TileScales,
                out: &mut [&mut [f32]],
            ) {
                match a.len() {
                    8 => packed::<$format, 8>(groups, a, scales, out),
                    7 => packed::<$format, 7>(groups, a, scales, out),
                    6 => packed::<$format, 6>(groups, a, scales, out),
                    5 => packed::<$format, 5>(groups, a, scales, out),
                    4 => packed::<$format, 4>(groups, a, scales, out),
                    3 => packed::<$format, 3>(groups, a, scales, out),
                    2 => packed::<$format, 2>(groups, a, scales, out),
                    1 => packed::<$format, 1>(groups, a, scales, out),
                    n => panic!("no packed tile of {n} tokens"),
                }
            }
        )*
    };
}

packed_entry_points!(
    Q40 => q4_0_entry,
    Q41 => q4_1_entry,
    Q50 => q5_0_entry,
    Q80 => q8_0_entry,
    Q4K => q4_k_entry,
    Q5K => q5_k_entry,
    Q6K => q6_k_entry,
);
