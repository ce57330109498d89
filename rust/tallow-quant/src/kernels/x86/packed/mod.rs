//! The packed kernels' one loop, for weights packed in groups of [`PACK_ROWS`] rows (see
//! `crate::packed` and its `layout`), written once over the vector operations of [`Simd`] and
//! compiled for AVX2 ([`V256`], module [`avx2`]) and AVX-512 ([`V512`], modules [`avx512`]
//! and [`avx512_vnni`]). A 64-byte word of a packed block holds one step (four columns) of
//! all 16 rows, one i32 lane per row: AVX2 takes it as two halves of 8 rows, AVX-512 whole,
//! so that 32 columns of the rows against one token are 8 byte dot products with the token's
//! activation bytes broadcast four at a time, and need no horizontal sum. AVX2 runs a block's
//! two halves one after the other. A sub-block goes in passes of up to eight steps (a format's
//! [`Format::PASS`]): the pass's steps of a half are unpacked into registers, and serve every
//! token of the tile. A few tokens read the groups as one stream, once, in order; a tile of
//! more than 8 (AVX2's whole tiles) takes a chunk of groups column by column, against a copy
//! of its activations of the column side by side ([`Panels`]).
//!
//! Every format runs through one loop (`packed_loop!`); a [`Format`] says how a block's steps
//! and scales unpack and how its integer sums become floats. Products use `vpmaddubsw`
//! (unsigned weight bytes against signed activation bytes within -127..=127), whose i16 pair
//! sums are added as i16 in runs of steps as long as their range allows (8 for Q4_K's 4-bit
//! quants, 4 for most, 2 for the 6-bit quants, whose pairs reach 2 * 63 * 127) and then widened by
//! `vpmaddwd` against the sub-block's integer scale (1 where the format has none), so that a
//! block's integer sum is exact; with VNNI, each step is one `vpdpbusd` straight into i32
//! lanes, and a sub-block's sum is taken times its integer scale in i32 lanes (`vpmulld`,
//! which Zen 4 runs beside the byte products, where `vpdpwssd` takes their unit). Q8_0's
//! stored quants (`q + 128`, up to 255) would saturate the pair sums, so its AVX2 steps take
//! the signed `q` back and move its sign onto the activations (`|q|` against `sign(q) * y`:
//! pairs within 2 * 128 * 127); with VNNI the stored quants serve as they are.
//!
//! Per row the integer sums are exact and the f32 operations are those of the scalar packed
//! kernels (`crate::kernels::scalar`) in the same order, so the outputs are equal bit for bit
//! at either width, and a token's outputs do not depend on the other tokens of the tile.
//!
//! # Safety
//! As in [`simd`]: the [`avx2`] entry points need AVX2, FMA and F16C, the
//! [`avx512`] ones AVX-512 F and BW, the [`avx512_vnni`] ones VNNI too; `crate::kernels::Isa::kernels`
//! only hands them out when the CPU has them.

use std::arch::x86_64::*;

mod operands;
mod simd;

use self::operands::{act_quad, Bytes, Operands, PairsAt, Panels};
use self::simd::{cores, requests, Cores, Prefetch, Simd, ANY_CORES, V256, V512};
use super::{Bw, Vnni};
use crate::blocks::{Block, BlockQ8K, BlockQ8_0, BlockQ8_1, IQ4_VALUES};
use crate::kernels::{
    each_scale_group, SubBlockPairs, TileActs, TileScales, WeightsAt, DECODED_BLOCK_BYTES,
    PACK_ROWS, TILE_LANES,
};

/// `[f(0), .., f(n - 1)]` of integer vectors, built by a loop in the function that uses it: a
/// closure is a function of its own, which the compiler may leave out of line.
macro_rules! vectors {
    ($n:expr, |$i:ident| $body:expr) => {{
        let mut out = [S::zero(); $n];
        for $i in 0..$n {
            out[$i] = $body;
        }
        out
    }};
}

/// A packed format, as the loop (`packed_loop!`) runs it at the vector width of `S`.
trait Format<S: Simd> {
    /// The activations' block.
    type Act: Block;
    /// A packed block's f16 fields and its words.
    type Fields: Bytes;
    type Words: Bytes;
    /// Sub-blocks of 32 columns in a block.
    const SUBS: usize;
    /// Whether its kernels do little enough work per weight byte (the K-quants but Q2_K, Q8_0
    /// and IQ4_XS; not the 32-column blocks of 4 or 5 bits of Q4_0, Q4_1 and Q5_0) that a
    /// one-token product of it reads memory fastest where the hardware prefetcher follows its
    /// stream, asked only for the first line of each page (`Prefetch::pages_ahead`).
    const LIGHT: bool = false;
    /// What one half of a block gives every token (its scales).
    type Half;
    /// One unpacked step (four columns of each row of a half).
    type Step: Copy;

    /// Half `h` of the block's scales.
    unsafe fn half(fields: &Self::Fields, words: &Self::Words, h: usize) -> Self::Half;
    /// Step `c` of sub-block `s` of half `h`. (One step per call: a call the compiler can
    /// always inline, where a whole sub-block's did not get inlined.)
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> Self::Step;
    /// Steps of a pass: a half's steps of a pass are held at once (in at most
    /// [`MAX_PASS_STEPS`] registers), so that each token's activations serve them all.
    const PASS: usize;
    /// `acc` plus, per row (i32 lane), the dot product of steps `first..first + PASS` of
    /// sub-block `s` (`steps`) with the token's activation bytes `y`, times the steps'
    /// integer scale.
    unsafe fn pass_sum(
        acc: S::I,
        steps: &[Self::Step],
        y: &[i8; 32],
        half: &Self::Half,
        s: usize,
        first: usize,
    ) -> S::I;
    /// The activation bytes of sub-block `s`.
    fn y(act: &Self::Act, s: usize) -> &[i8; 32];
    /// `acc` plus the block's products for one token: `isum` is the sum of its
    /// [`Format::pass_sum`]s, `da` and `sa` the token's f32 block scale and sum, `pairs` where
    /// its sub-blocks' sums are (for Q8_K).
    unsafe fn finish(
        acc: S::F,
        isum: S::I,
        half: &Self::Half,
        act: &Self::Act,
        da: f32,
        sa: f32,
        pairs: PairsAt<'_>,
    ) -> S::F;
}

/// Declares `$name`, the packed product of any [`Format`] at the width of `S`, for a tile of
/// `T` tokens, holding the sums of `SLOTS` groups at a time (`chunk_slots(T)`), asking for its
/// weights as `requests::<S, CORES>` says, compiled with
/// `$features`: the loop is written once, and compiled per
/// instruction set so that the vector operations of `S` inline into it before the compiler
/// unrolls it (a generic loop without the features, inlined into an entry point that has
/// them, was left rolled over the tokens). Out of line: each tile width is a function of its
/// own, which gives the compiler room to inline a format's unpacking into it.
macro_rules! packed_loop {
    ($name:ident, $features:literal) => {
        #[inline(never)]
        #[target_feature(enable = $features)]
        unsafe fn $name<
            S: Simd,
            F: Format<S>,
            const T: usize,
            const SLOTS: usize,
            const CORES: usize,
        >(
            groups: &[u8],
            source: WeightsAt,
            a: TileActs,
            scales: &TileScales,
            out: &mut [&mut [f32]],
        ) {
            let ops = Operands::<F::Act, F::Fields, F::Words, T>::new(groups, a, scales, out);
            // Arrays of two halves, of which the first `S::HALVES` are used.
            debug_assert!(S::HALVES <= 2);
            const { assert!(F::PASS <= MAX_PASS_STEPS) };
            // A light format's one-token stream asks for the first line of each page alone
            // (`Prefetch::pages_ahead`).
            let prefetch = requests::<S, CORES>();
            let pages_ahead = match T == 1 && F::LIGHT {
                true => prefetch.pages_ahead,
                false => None,
            };
            // A tile of more tokens than one group of tile scales (AVX2's whole tiles) runs
            // its groups in chunks, block by block: a block of every group of the chunk against
            // the tile's activations of that block, copied side by side into a panel once per
            // chunk. Read where they lie, a row of activations apart (one or more pages), the
            // tokens' blocks cost AVX2's Q4_K and Q6_K products a tenth of their speed, even
            // from the L1 cache. Fewer tokens run group after group, each block once, in order.
            const { assert!(SLOTS == chunk_slots(T)) };
            let tiled = T > TILE_LANES;
            let mut panels = Panels::<F::Act, T>::new();
            // Per group of the chunk and half, the outputs of each token. (One slot where a
            // group runs alone: zeroing a whole chunk's slots for each call cost AVX-512's
            // 8-token calls over a 576x1536 matrix 2-4%.)
            let mut acc = [[sums::<S::F, T>(S::zero_f()); 2]; SLOTS];
            for start in (0..ops.groups()).step_by(SLOTS) {
                // One group where a tile runs alone: a range the compiler can see is one
                // group long, which it compiles to no loop at all. (The loop it made of a
                // range it could not see was, cost VNNI's Q4_0 prefill products 15% of their
                // rate and a 1B Q8_0 model's decode steps 4%, on a Zen 5.)
                let end = match tiled {
                    true => ops.groups().min(start + SLOTS),
                    false => start + 1,
                };
                // Where group `g`'s outputs are: one group at a time keeps them in registers.
                let slot = |g: usize| if tiled { g - start } else { 0 };
                for g in start..end {
                    acc[slot(g)] = [sums::<S::F, T>(S::zero_f()); 2];
                }
                if tiled {
                    panels.fill(0, ops.column(0));
                }
                for b in 0..ops.blocks() {
                    let act = match tiled {
                        true => {
                            // The next block's panel fills while this one serves.
                            if b + 1 < ops.blocks() {
                                panels.fill(b + 1, ops.column(b + 1));
                            }
                            panels.column(b)
                        }
                        false => ops.column(b),
                    };
                    for g in start..end {
                        let (fields, words) = ops.block(g, b);
                        // The block a tile reads next, where that is not the next in memory.
                        let next = match tiled {
                            true if g + 1 < end => Some(ops.block(g + 1, b).0),
                            true if b + 1 < ops.blocks() => Some(ops.block(start, b + 1).0),
                            _ => None,
                        };
                        let acc = &mut acc[slot(g)];
                        // One half of the block's rows after the other (the second from the L1
                        // cache): a half's sums of every token and a pass's steps fit in AVX2's
                        // 16 registers, both halves' did not.
                        for h in 0..S::HALVES {
                            let half = F::half(fields, words, h);
                            let mut isum = sums::<S::I, T>(S::zero());
                            // The passes of every sub-block as one loop: nested loops over the
                            // sub-blocks and their passes compiled to code 5-10% slower.
                            let passes = 8 / F::PASS;
                            for p in 0..F::SUBS * passes {
                                let (s, first) = (p / passes, p % passes * F::PASS);
                                if source == WeightsAt::Memory && h == 0 {
                                    match (next, pages_ahead) {
                                        (Some(next), _) => {
                                            prefetch_part::<S, F>(next, p, prefetch.at_next())
                                        }
                                        (None, Some(ahead)) => {
                                            prefetch_page::<S, F>(fields, p, ahead)
                                        }
                                        (None, None) => prefetch_part::<S, F>(fields, p, prefetch),
                                    }
                                }
                                let mut steps = [F::step(words, h, s, first); MAX_PASS_STEPS];
                                for (i, step) in steps[1..F::PASS].iter_mut().enumerate() {
                                    *step = F::step(words, h, s, first + 1 + i);
                                }
                                for t in 0..T {
                                    let y = F::y(act.token(t), s);
                                    let steps = &steps[..F::PASS];
                                    isum[t] = F::pass_sum(isum[t], steps, y, &half, s, first);
                                }
                            }
                            for t in 0..T {
                                let (d, s) = ops.scales(b, t);
                                let (act, pairs) = (act.token(t), ops.pairs(b, t));
                                acc[h][t] = F::finish(acc[h][t], isum[t], &half, act, d, s, pairs);
                            }
                        }
                    }
                }
                for g in start..end {
                    for h in 0..S::HALVES {
                        for (rows, acc) in out.iter_mut().zip(&acc[slot(g)][h]) {
                            S::store(*acc, &mut rows[g * PACK_ROWS + h * S::ROWS..]);
                        }
                    }
                }
            }
        }
    };
}

/// Groups a tile runs block by block (see `packed_loop!`).
const CHUNK_GROUPS: usize = 16;

/// The groups whose sums a tile of `tokens` holds at once: a chunk's where it runs them block
/// by block, else one.
const fn chunk_slots(tokens: usize) -> usize {
    if tokens > TILE_LANES {
        CHUNK_GROUPS
    } else {
        1
    }
}

/// `T` sums starting at `zero`. Past one group of tokens, from a zero the compiler cannot see
/// as such: its arrays of 16 vectors set to a constant 0 were a call to `memset` per group
/// and per half (1-2% of AVX2's Q4_K products), these are a store per vector. Within a group
/// the sums stay in registers, where an opaque zero would cost a load.
#[inline(always)]
fn sums<V: Copy, const T: usize>(zero: V) -> [V; T] {
    match T > crate::kernels::TILE_LANES {
        true => [std::hint::black_box(zero); T],
        false => [zero; T],
    }
}

packed_loop!(packed_avx2, "avx2,fma,f16c");
packed_loop!(packed_avx512, "avx512f,avx512bw");
packed_loop!(packed_avx512_vnni, "avx512f,avx512bw,avx512vnni");

/// The bytes of part `i` of a block, from the block's start: a block's fields and words
/// split evenly over its passes, one part per pass.
#[inline(always)]
fn part_bytes<S: Simd, F: Format<S>>(i: usize) -> (usize, usize) {
    let len = F::Fields::LEN + F::Words::LEN;
    let parts = F::SUBS * (8 / F::PASS);
    (i * len / parts, (i + 1) * len / parts)
}

/// Asks for the cache lines `how` says ahead of part `i` of the block at `fields`
/// (one part per pass). A product of a few tokens is one stream of weights read once, and the
/// hardware prefetcher alone does not keep a core's loads in flight while it computes: without
/// these requests a tile of 8 tokens waited on memory as long as it computed (a 1B model's
/// forward of 8 tokens took 60 ms, with them 37). The requests are spread over the block's
/// passes, a line or three at a time: a whole block's lines asked for at once (36 for Q4_K)
/// filled the core's miss buffers, so that the loads waited behind them. Only the first tile
/// to take the groups asks ([`WeightsAt::Memory`]): the later tiles of a prefill find them in
/// the cache (a run of groups stays in the L2 from one tile to the next), where the requests
/// only took load slots (with runs sized for the L1, smollm2-135m's pp512 lost a fifth).
#[inline(always)]
unsafe fn prefetch_part<S: Simd, F: Format<S>>(fields: &F::Fields, i: usize, how: Prefetch) {
    let block = (fields as *const F::Fields).cast::<i8>();
    // Each line of the block once: in the part where it starts.
    let (start, end) = part_bytes::<S, F>(i);
    let mut line = start.next_multiple_of(64);
    while line < end {
        // A prefetch reads nothing and never faults, past the end of the weights included.
        let at = block.wrapping_add(how.ahead + line);
        if how.into_l1 {
            _mm_prefetch::<_MM_HINT_T0>(at);
        } else {
            _mm_prefetch::<_MM_HINT_T1>(at);
        }
        if let Some(further) = how.l2_ahead {
            _mm_prefetch::<_MM_HINT_T1>(block.wrapping_add(further + line));
        }
        line += 64;
    }
}

/// Asks for the first cache line of the 4 KiB page that begins within part `i` of the block at
/// `fields` `ahead` bytes on, if one does (a part is a few lines, a page begins in at most one):
/// the hardware prefetcher follows a stream within a page but starts over at the next, where
/// a light format's one-token stream otherwise waits on memory.
#[inline(always)]
unsafe fn prefetch_page<S: Simd, F: Format<S>>(fields: &F::Fields, i: usize, ahead: usize) {
    let block = (fields as *const F::Fields).cast::<i8>();
    let (start, end) = part_bytes::<S, F>(i);
    let from = block as usize + ahead + start;
    let page = from.next_multiple_of(4096);
    if page < from + (end - start) {
        // A prefetch reads nothing and never faults, past the end of the weights included.
        _mm_prefetch::<_MM_HINT_T1>(block.wrapping_add(page - block as usize));
    }
}

// ---- integer sums ----

/// Activation bytes `4j..4j + 4` of `y` in every i32 lane.
#[inline(always)]
unsafe fn quad<S: Simd>(y: &[i8; 32], j: usize) -> S::I {
    S::splat_i32(act_quad(y, j))
}

/// Registers a pass's steps may take.
const MAX_PASS_STEPS: usize = 8;

/// `acc` plus, per row (i32 lane), the dot product of the steps `first..` (`steps`) of
/// unsigned weight bytes with `y`, summed as i16 in runs of `N` steps (of the whole pass where
/// it has fewer), each run widened against the i16 pairs `scale` (a pass's steps share one
/// scale). No closures here: a closure does not take the target features of the loop it is
/// inlined into, and may be left out of line.
#[inline(always)]
unsafe fn weighted_sum<S: Simd, const N: usize>(
    acc: S::I,
    steps: &[S::I],
    y: &[i8; 32],
    first: usize,
    scale: S::I,
) -> S::I {
    // A constant once inlined, as the pass's length is.
    let n = N.min(steps.len());
    debug_assert!(n > 0 && steps.len().is_multiple_of(n));
    let mut sums = acc;
    for (r, run) in steps.chunks_exact(n).enumerate() {
        let at = first + r * n;
        let mut pairs = S::maddubs(run[0], quad::<S>(y, at));
        // An index loop: the compiler unrolls it early, and then the loop over the tokens.
        #[allow(clippy::needless_range_loop)]
        for i in 1..n {
            pairs = S::add16(pairs, S::maddubs(run[i], quad::<S>(y, at + i)));
        }
        sums = S::madd_add(sums, pairs, scale);
    }
    sums
}

/// `acc` plus, per row (i32 lane), the dot product of the steps `first..` (`steps`) with
/// `y`, one [`Simd::dot4`] after the other: for a [`Simd::FUSED_DOT`] instruction set.
#[inline(always)]
unsafe fn dot_chain<S: Simd>(acc: S::I, steps: &[S::I], y: &[i8; 32], first: usize) -> S::I {
    let mut sums = acc;
    #[allow(clippy::needless_range_loop)]
    for i in 0..steps.len() {
        sums = S::dot4(sums, steps[i], quad::<S>(y, first + i));
    }
    sums
}

/// [`weighted_sum`] for a format without an integer scale, its i16 pair sums added in runs of
/// `RUN` steps: straight into i32 lanes where that is one instruction per step (a chain of its
/// own, added to `acc` at the end, so that the passes of a token overlap).
#[inline(always)]
unsafe fn unscaled_sum<S: Simd, const RUN: usize>(
    acc: S::I,
    steps: &[S::I],
    y: &[i8; 32],
    first: usize,
) -> S::I {
    if S::FUSED_DOT {
        S::add32(acc, dot_chain::<S>(S::zero(), steps, y, first))
    } else {
        weighted_sum::<S, RUN>(acc, steps, y, first, S::splat_i16(1))
    }
}

/// The dot products of a whole sub-block's 8 steps (`steps`, from step `first`) with `y`,
/// as the sums of its two 16-column halves: two [`dot_chain`]s from zero that the CPU runs
/// side by side.
#[inline(always)]
unsafe fn sub_block_halves<S: Simd>(steps: &[S::I], y: &[i8; 32], first: usize) -> (S::I, S::I) {
    let (low, high) = steps.split_at(4);
    (
        dot_chain::<S>(S::zero(), low, y, first),
        dot_chain::<S>(S::zero(), high, y, first + 4),
    )
}

/// `acc` plus `sum` times the integer scale of the i16 pairs `scale` (both i16 of a lane
/// equal), the product taken in i32 lanes: for sums that do not fit in i16.
#[inline(always)]
unsafe fn scaled_i32<S: Simd>(acc: S::I, sum: S::I, scale: S::I) -> S::I {
    S::add32(acc, S::mullo32(sum, S::high_i16(scale)))
}

/// `acc` plus a pass of a format with a scale per group of 16 columns (four steps): each
/// group's i16 pair sums in runs of `RUN` steps, widened against its scale (`scales[2s + g]`
/// for group `g` of sub-block `s`). A pass holds one group or both of a sub-block.
#[inline(always)]
unsafe fn group_weighted_sum<S: Simd, const RUN: usize>(
    acc: S::I,
    steps: &[S::I],
    y: &[i8; 32],
    first: usize,
    s: usize,
    scales: &[S::I; 16],
) -> S::I {
    let mut acc = acc;
    for (k, group) in steps.chunks_exact(4).enumerate() {
        let at = first + 4 * k;
        acc = weighted_sum::<S, RUN>(acc, group, y, at, scales[2 * s + at / 4]);
    }
    acc
}

/// Per row (i32 lane), the sum of the products of the i16 pairs of `pairs(k)` with the
/// token's group sums `2k` and `2k + 1` (of 16 columns each), over the block's 8 pairs.
#[inline(always)]
unsafe fn weighted_bsums<S: Simd>(act: &BlockQ8K, pairs: &[S::I; 8]) -> S::I {
    let mut sums = S::zero();
    for (k, &pair) in pairs.iter().enumerate() {
        let bsums: [u8; 4] = act.bsums[4 * k..4 * k + 4].try_into().unwrap();
        sums = S::madd_add(sums, pair, S::splat_i32(i32::from_le_bytes(bsums)));
    }
    sums
}

/// Scale `d` times the token's scale `da`, times `sums`, plus `acc`.
#[inline(always)]
unsafe fn scaled<S: Simd>(acc: S::F, d: S::F, da: f32, sums: S::F) -> S::F {
    S::fmadd(S::mul(d, S::splat(da)), sums, acc)
}

// ---- the 32-column formats ----

/// `d * da * (sum(q * y) - offset * sum(y))` for quants stored as `q + offset`.
#[inline(always)]
unsafe fn offset_block<S: Simd>(
    acc: S::F,
    isum: S::I,
    d: S::F,
    da: f32,
    sa: f32,
    offset: f32,
) -> S::F {
    let sums = S::fnmadd(S::splat(offset), S::splat(sa), S::to_f32(isum));
    scaled::<S>(acc, d, da, sums)
}

/// The methods of a format whose sums need no scale and whose offset (`$offset`) comes back
/// through the token's block sum, at the width of `$s`: Q4_0 and Q5_0 (offsets 8 and 16), and
/// with VNNI Q8_0 and IQ4_NL (their values plus 128). The i16 pair sums add up over `$run`
/// steps where they are not summed straight into i32 lanes (8 for Q4_0's 4-bit quants,
/// within 8 * 2 * 15 * 127; 4 for Q5_0's 5-bit ones).
macro_rules! offset_q8_0_sums {
    ($s:ty, $offset:expr, $run:expr) => {
        #[inline(always)]
        unsafe fn pass_sum(
            acc: <$s as Simd>::I,
            steps: &[<$s as Simd>::I],
            y: &[i8; 32],
            _: &<$s as Simd>::F,
            _: usize,
            first: usize,
        ) -> <$s as Simd>::I {
            unscaled_sum::<$s, $run>(acc, steps, y, first)
        }
        fn y(act: &BlockQ8_0, _: usize) -> &[i8; 32] {
            &act.qs
        }
        #[inline(always)]
        unsafe fn finish(
            acc: <$s as Simd>::F,
            isum: <$s as Simd>::I,
            d: &<$s as Simd>::F,
            _: &BlockQ8_0,
            da: f32,
            sa: f32,
            _: PairsAt<'_>,
        ) -> <$s as Simd>::F {
            offset_block::<$s>(acc, isum, *d, da, sa, $offset)
        }
    };
}

struct Q40;

impl<S: Simd> Format<S> for Q40 {
    type Act = BlockQ8_0;
    type Fields = [u8; 32];
    type Words = [u8; 256];
    const SUBS: usize = 1;
    const PASS: usize = pass_steps::<S>();
    type Half = S::F;
    type Step = S::I;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 32], _: &[u8; 256], h: usize) -> S::F {
        S::field(fields, 0, h)
    }
    #[inline(always)]
    unsafe fn step(words: &[u8; 256], h: usize, _: usize, c: usize) -> S::I {
        S::nibbles(S::word(words, c % 4, h), c / 4)
    }
    offset_q8_0_sums!(S, 8.0, 8);
}

/// Q4_1: `d * da * sum(q * y) + m * sa`.
struct Q41;

impl<S: Simd> Format<S> for Q41 {
    type Act = BlockQ8_1;
    type Fields = [u8; 64];
    type Words = [u8; 256];
    const SUBS: usize = 1;
    const PASS: usize = pass_steps::<S>();
    type Half = (S::F, S::F);
    type Step = S::I;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 64], _: &[u8; 256], h: usize) -> (S::F, S::F) {
        (S::field(fields, 0, h), S::field(fields, 1, h))
    }
    #[inline(always)]
    unsafe fn step(words: &[u8; 256], h: usize, _: usize, c: usize) -> S::I {
        S::nibbles(S::word(words, c % 4, h), c / 4)
    }
    #[inline(always)]
    unsafe fn pass_sum(
        acc: S::I,
        steps: &[S::I],
        y: &[i8; 32],
        _: &Self::Half,
        _: usize,
        first: usize,
    ) -> S::I {
        // 4-bit quants, as Q4_0's: a whole pass adds up as i16.
        unscaled_sum::<S, 8>(acc, steps, y, first)
    }
    fn y(act: &BlockQ8_1, _: usize) -> &[i8; 32] {
        &act.qs
    }
    #[inline(always)]
    unsafe fn finish(
        acc: S::F,
        isum: S::I,
        &(d, m): &Self::Half,
        _: &BlockQ8_1,
        da: f32,
        sa: f32,
        _: PairsAt<'_>,
    ) -> S::F {
        let acc = scaled::<S>(acc, d, da, S::to_f32(isum));
        S::fmadd(m, S::splat(sa), acc)
    }
}

/// Q5_0: as Q4_0 with the fifth bits of word 4 (bit `j` of byte `i`: column `4j + i`) and
/// offset 16.
struct Q50;

impl<S: Simd> Format<S> for Q50 {
    type Act = BlockQ8_0;
    type Fields = [u8; 32];
    type Words = [u8; 320];
    const SUBS: usize = 1;
    const PASS: usize = pass_steps::<S>();
    type Half = S::F;
    type Step = S::I;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 32], _: &[u8; 320], h: usize) -> S::F {
        S::field(fields, 0, h)
    }
    #[inline(always)]
    unsafe fn step(words: &[u8; 320], h: usize, _: usize, c: usize) -> S::I {
        let low = S::nibbles(S::word(words, c % 4, h), c / 4);
        S::or(low, S::bits_to_4(S::word(words, 4, h), c, 0x10))
    }
    offset_q8_0_sums!(S, 16.0, 4);
}

/// `acc` plus, per row, the dot products of signed steps (values, magnitudes; from step
/// `first`) with `y`, each step's i16 pairs widened against the i16 pairs `scale` (1 where the
/// format has no integer scale): Q8_0's and the IQ4 formats' AVX2 steps.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_pass_sum(
    acc: __m256i,
    steps: &[(__m256i, __m256i)],
    y: &[i8; 32],
    first: usize,
    scale: __m256i,
) -> __m256i {
    let mut sums = acc;
    for (j, &(signed, magnitude)) in steps.iter().enumerate() {
        let y = _mm256_sign_epi8(quad::<V256>(y, first + j), signed);
        let pairs = _mm256_maddubs_epi16(magnitude, y);
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, scale));
    }
    sums
}

/// Q8_0 on AVX2: `d * da * sum(q * y)`, the steps as signed `q` and `|q|`. (AVX-512 without
/// VNNI has no packed Q8_0 kernel: it has no byte sign instruction, and `vpmaddubsw` would
/// saturate on the stored quants.)
struct Q80;

impl Format<V256> for Q80 {
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
        V256::field(fields, 0, h)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &[u8; 512], h: usize, _: usize, c: usize) -> (__m256i, __m256i) {
        let signed = _mm256_xor_si256(V256::word(words, c, h), _mm256_set1_epi8(-128));
        (signed, _mm256_abs_epi8(signed))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        acc: __m256i,
        steps: &[(__m256i, __m256i)],
        y: &[i8; 32],
        _: &__m256,
        _: usize,
        first: usize,
    ) -> __m256i {
        signed_pass_sum(acc, steps, y, first, _mm256_set1_epi16(1))
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
        _: PairsAt<'_>,
    ) -> __m256 {
        scaled::<V256>(acc, *d, da, _mm256_cvtepi32_ps(isum))
    }
}

/// Q8_0 with VNNI: its stored quants (`q + 128`) as they are, their byte products exact in
/// i32 lanes (`vpdpbusd` does not saturate), and the 128 taken back through the token's sum.
impl Format<V512<Vnni>> for Q80 {
    type Act = BlockQ8_0;
    type Fields = [u8; 32];
    type Words = [u8; 512];
    const SUBS: usize = 1;
    const LIGHT: bool = true;
    const PASS: usize = 4;
    type Half = __m512;
    type Step = __m512i;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 32], _: &[u8; 512], h: usize) -> __m512 {
        V512::<Vnni>::field(fields, 0, h)
    }
    #[inline(always)]
    unsafe fn step(words: &[u8; 512], h: usize, _: usize, c: usize) -> __m512i {
        V512::<Vnni>::word(words, c, h)
    }
    offset_q8_0_sums!(V512<Vnni>, 128.0, 4);
}

// ---- K-quants: 256 columns, 8 sub-blocks ----

/// The scales of half a Q4_K/Q5_K block: `d`, `dmin`, per sub-block its 6-bit scale in both
/// i16 of every lane, and per pair of sub-blocks `2j, 2j + 1` their two mins.
struct K4Half<S: Simd> {
    d: S::F,
    dmin: S::F,
    scales: [S::I; 8],
    mins: [S::I; 4],
}

/// Unpacks the 12 scale bytes of each row (words 0..3, as `crate::blocks::k4_scales_mins`).
#[inline(always)]
unsafe fn k4_half<S: Simd>(fields: &[u8; 64], words: &[u8], h: usize) -> K4Half<S> {
    let [p0, p1, p2] = vectors!(3, |w| S::word(words, w, h));
    let low6 = S::splat_i32(0x3f3f3f3f);
    let low4 = S::splat_i32(0x0f0f0f0f);
    let top2 = S::splat_i32(0x30303030);
    // Bytes 0..4 of a lane: scales (mins) 0..4, then 4..8.
    let scales = [
        S::and(p0, low6),
        S::or(S::and(p2, low4), S::and(S::shr16(p0, 2), top2)),
    ];
    let mins = [
        S::and(p1, low6),
        S::or(S::and(S::shr16(p2, 4), low4), S::and(S::shr16(p1, 2), top2)),
    ];
    K4Half {
        d: S::field(fields, 0, h),
        dmin: S::field(fields, 1, h),
        scales: vectors!(8, |s| S::byte_pair(scales[s / 4], s % 4, s % 4, false)),
        mins: vectors!(4, |j| S::byte_pair(
            mins[j / 2],
            2 * (j % 2),
            2 * (j % 2) + 1,
            false
        )),
    }
}

/// Q4_K and Q5_K: `d * da * sum(scale * q * y) - dmin * da * sum(min * y)`, the mins
/// against the token's sub-block sums.
#[inline(always)]
unsafe fn k4_finish<S: Simd>(
    acc: S::F,
    isum: S::I,
    half: &K4Half<S>,
    pairs: &SubBlockPairs,
    da: f32,
) -> S::F {
    let mut mins = S::zero();
    for (&m, &y) in half.mins.iter().zip(pairs) {
        mins = S::madd_add(mins, m, S::splat_i32(y));
    }
    k_min_finish::<S>(acc, isum, half.d, half.dmin, mins, da)
}

/// The K-quants with mins (Q2_K, Q4_K, Q5_K): `d * da * isum - dmin * da * mins`, with
/// `mins` the sum of the mins times the token's sums of their columns.
#[inline(always)]
unsafe fn k_min_finish<S: Simd>(
    acc: S::F,
    isum: S::I,
    d: S::F,
    dmin: S::F,
    mins: S::I,
    da: f32,
) -> S::F {
    let mins = S::to_f32(mins);
    let acc = scaled::<S>(acc, d, da, S::to_f32(isum));
    S::fnmadd(S::mul(dmin, S::splat(da)), mins, acc)
}

/// Steps of a pass for Q2_K, Q3_K and the decoded rows: a whole sub-block where the sums run
/// straight into i32 lanes (and one vector holds the group), so that the sub-block's scale
/// applies once; else [`pass_steps`] (Q3_K at AVX2's width 202 -> 222 GFLOP/s, the decoded
/// IQ2_XS 161 -> 163), each group of 16 columns widened against its own scale.
const fn k_pass<S: Simd>() -> usize {
    if S::FUSED_DOT {
        8
    } else {
        pass_steps::<S>()
    }
}

/// Q4_K's and Q5_K's [`Format::pass_sum`] over a whole sub-block: with VNNI into i32 lanes,
/// times its scale; else summed as i16 in runs of `RUN` steps (as long as the format's pair
/// sums allow), each run widened against the scale. With `high_in_place` (VNNI's Q4_K steps)
/// an odd sub-block's steps are its high nibbles where they lie, 16 times their value: the
/// exact i32 sum (at most 32 * 240 * 127) is divided back by 16.
#[inline(always)]
unsafe fn k4_pass_sum<S: Simd, const RUN: usize>(
    acc: S::I,
    steps: &[S::I],
    y: &[i8; 32],
    half: &K4Half<S>,
    s: usize,
    first: usize,
    high_in_place: bool,
) -> S::I {
    if S::FUSED_DOT {
        let (low, high) = sub_block_halves::<S>(steps, y, first);
        let mut sum = S::add32(low, high);
        if high_in_place {
            sum = S::sra32(sum, 4 * (s % 2) as u32);
        }
        scaled_i32::<S>(acc, sum, half.scales[s])
    } else {
        debug_assert!(
            !high_in_place,
            "in-place nibbles are summed in i32 lanes only"
        );
        weighted_sum::<S, RUN>(acc, steps, y, first, half.scales[s])
    }
}

fn k_y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
    act.qs[32 * s..32 * s + 32].try_into().unwrap()
}

/// Q4_K: a whole sub-block a pass, whose pair sums (within 2 * 15 * 127) add up as i16 over
/// all its 8 steps.
struct Q4K;

impl<S: Simd> Format<S> for Q4K {
    type Act = BlockQ8K;
    type Fields = [u8; 64];
    type Words = [u8; 35 * 64];
    const SUBS: usize = 8;
    const LIGHT: bool = true;
    const PASS: usize = 8;
    type Half = K4Half<S>;
    type Step = S::I;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 64], words: &Self::Words, h: usize) -> K4Half<S> {
        k4_half::<S>(fields, words, h)
    }
    #[inline(always)]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> S::I {
        let word = S::word(words, 3 + 8 * (s / 2) + c, h);
        if S::FUSED_DOT {
            // An odd sub-block's high nibbles where they are, 16 times their value: one `and` a
            // step, where a shift and an `and` took the CPU's vector units from the products.
            S::and(
                word,
                S::splat_i32((0x0f0f_0f0f_u32 << (4 * (s % 2))) as i32),
            )
        } else {
            S::nibbles(word, s % 2)
        }
    }
    #[inline(always)]
    unsafe fn pass_sum(
        acc: S::I,
        steps: &[S::I],
        y: &[i8; 32],
        half: &K4Half<S>,
        s: usize,
        first: usize,
    ) -> S::I {
        // The steps hold the high nibbles in place where the sums run in i32 lanes (`step`).
        k4_pass_sum::<S, 8>(acc, steps, y, half, s, first, S::FUSED_DOT)
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline(always)]
    unsafe fn finish(
        acc: S::F,
        isum: S::I,
        half: &K4Half<S>,
        _: &BlockQ8K,
        da: f32,
        _: f32,
        pairs: PairsAt<'_>,
    ) -> S::F {
        k4_finish::<S>(acc, isum, half, pairs.get(), da)
    }
}

/// Q5_K: Q4_K's nibbles (from word 11) with a fifth bit, bit `s` of word `3 + c` for step `c`
/// of sub-block `s`; its pair sums (within 2 * 31 * 127) add up as i16 over runs of 4 steps.
struct Q5K;

impl<S: Simd> Format<S> for Q5K {
    type Act = BlockQ8K;
    type Fields = [u8; 64];
    type Words = [u8; 43 * 64];
    const SUBS: usize = 8;
    const LIGHT: bool = true;
    const PASS: usize = 8;
    type Half = K4Half<S>;
    type Step = S::I;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 64], words: &Self::Words, h: usize) -> K4Half<S> {
        k4_half::<S>(fields, words, h)
    }
    #[inline(always)]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> S::I {
        let low = S::nibbles(S::word(words, 11 + 8 * (s / 2) + c, h), s % 2);
        S::or(low, S::bits_to_4(S::word(words, 3 + c, h), s, 0x10))
    }
    #[inline(always)]
    unsafe fn pass_sum(
        acc: S::I,
        steps: &[S::I],
        y: &[i8; 32],
        half: &K4Half<S>,
        s: usize,
        first: usize,
    ) -> S::I {
        k4_pass_sum::<S, 4>(acc, steps, y, half, s, first, false)
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline(always)]
    unsafe fn finish(
        acc: S::F,
        isum: S::I,
        half: &K4Half<S>,
        _: &BlockQ8K,
        da: f32,
        _: f32,
        pairs: PairsAt<'_>,
    ) -> S::F {
        k4_finish::<S>(acc, isum, half, pairs.get(), da)
    }
}

/// The scales of half a Q3_K or Q6_K block: `d`; per group of 16 columns its signed scale in
/// both i16 of every lane; per pair of groups `2k, 2k + 1` their two scales.
struct Q6Half<S: Simd> {
    d: S::F,
    scales: [S::I; 16],
    pairs: [S::I; 8],
}

/// Half `h` of the scales of a block whose 16 signed group scales are words 0..4 (group `g`
/// in byte `g % 4` of word `g / 4`), with its float scale `d`: Q6_K's, and the decoded rows'.
#[inline(always)]
unsafe fn signed_scales_half<S: Simd>(d: S::F, words: &[u8], h: usize) -> Q6Half<S> {
    let planes = vectors!(4, |w| S::word(words, w, h));
    Q6Half {
        d,
        scales: vectors!(16, |g| S::byte_pair(planes[g / 4], g % 4, g % 4, true)),
        pairs: vectors!(8, |k| group_pair::<S>(&planes, k, true)),
    }
}

/// Steps of a pass for Q4_0, Q4_1, Q5_0 and Q6_K: eight at AVX2's width, where a pass's sums
/// go through memory once per token and passes twice as long halve that (one thread,
/// 8192x2048 x 512 tokens: Q4_0 163 -> 190 GFLOP/s, Q4_1 164 -> 192, Q5_0 146 -> 174, Q6_K
/// 199 -> 207); four at AVX-512's, where eight were slower (Q6_K: 222 -> 214, with VNNI 284
/// -> 270).
const fn pass_steps<S: Simd>() -> usize {
    if S::HALVES == 2 {
        8
    } else {
        4
    }
}

/// Step 3 of a Q6_K group from its three words `w`: bits 6 and 7 of their bytes to bits 0-1,
/// 2-3 and 4-5. A 16-bit shift moves the next byte's low bits into the top of a byte, which
/// the masks clear.
#[inline(always)]
unsafe fn q6_top<S: Simd>(w: [S::I; 3]) -> S::I {
    let mut step = S::zero();
    for (j, &w) in w.iter().enumerate() {
        let top = S::shr16(w, 6 - 2 * j as u32);
        step = S::or(step, S::and(top, S::splat_i32(0x03030303 << (2 * j))));
    }
    step
}

/// Q6_K: `d * da * sum(scale * (q - 32) * y)`, with `q` (0..64) taken as unsigned bytes and
/// the 32 subtracted through the token's group sums. Group `g` of 16 columns (steps `4g..`)
/// is words `4 + 3g..`: step `j < 3` is word `4 + 3g + j`'s low 6 bits, and step 3 is the
/// three words' top 2 bits.
struct Q6K;

impl<S: Simd> Format<S> for Q6K {
    type Act = BlockQ8K;
    type Fields = [u8; 32];
    type Words = [u8; 52 * 64];
    const SUBS: usize = 8;
    const LIGHT: bool = true;
    const PASS: usize = pass_steps::<S>();
    type Half = Q6Half<S>;
    type Step = S::I;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 32], words: &Self::Words, h: usize) -> Q6Half<S> {
        signed_scales_half::<S>(S::field(fields, 0, h), words, h)
    }
    #[inline(always)]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> S::I {
        let first = 4 + 3 * (2 * s + c / 4);
        if c % 4 < 3 {
            return S::and(S::word(words, first + c % 4, h), S::splat_i32(0x3f3f3f3f));
        }
        q6_top::<S>(vectors!(3, |j| S::word(words, first + j, h)))
    }
    #[inline(always)]
    unsafe fn pass_sum(
        acc: S::I,
        steps: &[S::I],
        y: &[i8; 32],
        half: &Q6Half<S>,
        s: usize,
        first: usize,
    ) -> S::I {
        if S::FUSED_DOT {
            // One group a pass ([`pass_steps`]); its sum, up to 16 * 63 * 127, is no i16.
            let scale = half.scales[2 * s + first / 4];
            scaled_i32::<S>(acc, dot_chain::<S>(S::zero(), steps, y, first), scale)
        } else {
            // Runs of 2 steps, whose i16 pair sums stay within 2 * 2 * 63 * 127.
            group_weighted_sum::<S, 2>(acc, steps, y, first, s, &half.scales)
        }
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline(always)]
    unsafe fn finish(
        acc: S::F,
        isum: S::I,
        half: &Q6Half<S>,
        act: &BlockQ8K,
        da: f32,
        _: f32,
        _: PairsAt<'_>,
    ) -> S::F {
        let offsets = S::shl32::<5>(weighted_bsums::<S>(act, &half.pairs));
        scaled::<S>(acc, half.d, da, S::to_f32(S::sub32(isum, offsets)))
    }
}

/// The scales of half a Q2_K block: `d` and `dmin`; per group of 16 columns its 4-bit scale
/// in both i16 of every lane; per pair of groups `2k, 2k + 1` their two scales and their two
/// mins.
struct Q2Half<S: Simd> {
    d: S::F,
    dmin: S::F,
    scales: [S::I; 16],
    pairs: [S::I; 8],
    mins: [S::I; 8],
}

/// `acc` plus a pass of sub-block `s` of a format with a scale per group of 16 columns and
/// quants of at most 3 bits (Q2_K, Q3_K), whose group sums (within 16 * 7 * 128) fit in i16:
/// with VNNI a whole sub-block, its two groups' sums a lane's i16 pair widened against their
/// two scales (`pairs[s]`) at once; else each group of the pass, four steps whose i16 pair sums
/// stay within 4 * 2 * 7 * 128, widened against its scale (`scales`, one per group).
#[inline(always)]
unsafe fn group_scaled_sum<S: Simd>(
    acc: S::I,
    steps: &[S::I],
    y: &[i8; 32],
    first: usize,
    s: usize,
    scales: &[S::I; 16],
    pairs: &[S::I; 8],
) -> S::I {
    if S::FUSED_DOT {
        let (low, high) = sub_block_halves::<S>(steps, y, first);
        S::madd_add(acc, S::pack_pairs(low, high), pairs[s])
    } else {
        group_weighted_sum::<S, 4>(acc, steps, y, first, s, scales)
    }
}

/// Per i32 lane, the bytes of groups `2k` and `2k + 1` of `planes` (group `g` in byte `g % 4`
/// of plane `g / 4`) as the lane's two i16, sign-extended with `signed`.
#[inline(always)]
unsafe fn group_pair<S: Simd>(planes: &[S::I; 4], k: usize, signed: bool) -> S::I {
    S::byte_pair(planes[k / 2], 2 * (k % 2), 2 * (k % 2) + 1, signed)
}

/// Q2_K: `d * da * sum(scale * q * y) - dmin * da * sum(min * y)`, the mins against the
/// token's group sums. Its words are the GGUF block's: four of scales (group `g`'s scale in
/// the low nibble of byte `g`, its min in the high one), then `qs`, where word `4 + 8n + c`
/// holds step `c` of sub-blocks `4n..4n + 4`, two bits each.
struct Q2K;

impl<S: Simd> Format<S> for Q2K {
    type Act = BlockQ8K;
    type Fields = [u8; 64];
    type Words = [u8; 20 * 64];
    const SUBS: usize = 8;
    const PASS: usize = k_pass::<S>();
    type Half = Q2Half<S>;
    type Step = S::I;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 64], words: &Self::Words, h: usize) -> Q2Half<S> {
        let planes = vectors!(4, |w| S::word(words, w, h));
        let scales = vectors!(4, |p| S::nibbles(planes[p], 0));
        let mins = vectors!(4, |p| S::nibbles(planes[p], 1));
        Q2Half {
            d: S::field(fields, 0, h),
            dmin: S::field(fields, 1, h),
            scales: vectors!(16, |g| S::byte_pair(scales[g / 4], g % 4, g % 4, false)),
            pairs: vectors!(8, |k| group_pair::<S>(&scales, k, false)),
            mins: vectors!(8, |k| group_pair::<S>(&mins, k, false)),
        }
    }
    #[inline(always)]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> S::I {
        let word = S::word(words, 4 + 8 * (s / 4) + c, h);
        S::and(S::shr16(word, 2 * (s % 4) as u32), S::splat_i32(0x03030303))
    }
    #[inline(always)]
    unsafe fn pass_sum(
        acc: S::I,
        steps: &[S::I],
        y: &[i8; 32],
        half: &Q2Half<S>,
        s: usize,
        first: usize,
    ) -> S::I {
        group_scaled_sum::<S>(acc, steps, y, first, s, &half.scales, &half.pairs)
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline(always)]
    unsafe fn finish(
        acc: S::F,
        isum: S::I,
        half: &Q2Half<S>,
        act: &BlockQ8K,
        da: f32,
        _: f32,
        _: PairsAt<'_>,
    ) -> S::F {
        let mins = weighted_bsums::<S>(act, &half.mins);
        k_min_finish::<S>(acc, isum, half.d, half.dmin, mins, da)
    }
}

/// Q3_K: `d * da * sum(scale * (q - 4) * y)`, with `q` (0..8) taken as unsigned bytes and
/// the 4 subtracted through the token's group sums. Sub-block `s` is words `3 + 3s..` (see
/// `crate::packed::layout`): steps 0, 3 and 6 are the low 3 bits of its three words, steps
/// 1, 4 and 7 the next 3, steps 2 and 5 the top 2 bits of words 0 and 1 with a bit of word 2.
/// The 16 scales are 6 bits less 32, from the three scale words as `crate::blocks::q3k_scales`.
struct Q3K;

impl<S: Simd> Format<S> for Q3K {
    type Act = BlockQ8K;
    type Fields = [u8; 32];
    type Words = [u8; 27 * 64];
    const SUBS: usize = 8;
    const LIGHT: bool = true;
    const PASS: usize = k_pass::<S>();
    type Half = Q6Half<S>;
    type Step = S::I;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 32], words: &Self::Words, h: usize) -> Q6Half<S> {
        let [low, high, top] = vectors!(3, |w| S::word(words, w, h));
        let low4 = S::splat_i32(0x0f0f0f0f);
        // Byte `i` of plane `p`: the 6-bit scale of group `4p + i`.
        let planes = [
            S::or(S::and(low, low4), S::bits_to_4(top, 0, 0x30)),
            S::or(S::and(high, low4), S::bits_to_4(top, 2, 0x30)),
            S::or(S::nibbles(low, 1), S::bits_to_4(top, 4, 0x30)),
            S::or(S::nibbles(high, 1), S::bits_to_4(top, 6, 0x30)),
        ];
        let minus32 = S::splat_i16(-32);
        Q6Half {
            d: S::field(fields, 0, h),
            scales: vectors!(16, |g| S::add16(
                S::byte_pair(planes[g / 4], g % 4, g % 4, false),
                minus32
            )),
            pairs: vectors!(8, |k| S::add16(group_pair::<S>(&planes, k, false), minus32)),
        }
    }
    #[inline(always)]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> S::I {
        let word = S::word(words, 3 + 3 * s + c / 3, h);
        let three_bits = S::splat_i32(0x07070707);
        match c % 3 {
            0 => S::and(word, three_bits),
            // A 16-bit shift moves the next byte's low bits into the top of a byte, which the
            // masks clear.
            1 => S::and(S::shr16(word, 3), three_bits),
            _ => {
                let low = S::and(S::shr16(word, 6), S::splat_i32(0x03030303));
                let top = S::shr16(S::word(words, 3 + 3 * s + 2, h), 4 + c as u32 / 3);
                S::or(low, S::and(top, S::splat_i32(0x04040404)))
            }
        }
    }
    #[inline(always)]
    unsafe fn pass_sum(
        acc: S::I,
        steps: &[S::I],
        y: &[i8; 32],
        half: &Q6Half<S>,
        s: usize,
        first: usize,
    ) -> S::I {
        group_scaled_sum::<S>(acc, steps, y, first, s, &half.scales, &half.pairs)
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline(always)]
    unsafe fn finish(
        acc: S::F,
        isum: S::I,
        half: &Q6Half<S>,
        act: &BlockQ8K,
        da: f32,
        _: f32,
        _: PairsAt<'_>,
    ) -> S::F {
        let offsets = S::shl32::<2>(weighted_bsums::<S>(act, &half.pairs));
        scaled::<S>(acc, half.d, da, S::to_f32(S::sub32(isum, offsets)))
    }
}

// ---- rows decoded for one product ----

/// Words of a [`Decoded`] block: four of group scales, then one per step; its f32 field
/// before them.
const DECODED_WORDS: usize = 4 + 64;
const _: () = assert!(64 + DECODED_WORDS * 64 == DECODED_BLOCK_BYTES);

/// The rows of a codebook format (IQ1, IQ2, IQ3, TQ) or of Q3_K, decoded by a product of
/// many tokens into a packed group of its own (see `x86::decoded`), whose blocks multiply as
/// Q6_K's do: `d * da * sum(scale * value * y)`, with `d` the block's f32 scale (its format's
/// unit included) in the field, the 16 signed group scales in words 0..4 (group `g` in byte
/// `g % 4` of word `g / 4`), and each step's values plus [`DECODED_OFFSET`] in word `4 + 8s +
/// c`, unsigned bytes; the offset is taken back through the token's group sums. The integer
/// sum of a block is that of the format's one-token product, and becomes a float the same way
/// (`d * da` times it, added without a fused multiply-add), so the outputs have its bits.
struct Decoded;

/// What a decoded value is stored above: the values lie within -62..=62, so a stored byte is
/// under 127, and a `vpmaddubsw` pair against activations within -128..=127 stays in i16.
pub(in crate::kernels) const DECODED_OFFSET: i8 = 64;

impl<S: Simd> Format<S> for Decoded {
    type Act = BlockQ8K;
    type Fields = [u8; 64];
    type Words = [u8; DECODED_WORDS * 64];
    const SUBS: usize = 8;
    const PASS: usize = k_pass::<S>();
    type Half = Q6Half<S>;
    type Step = S::I;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 64], words: &Self::Words, h: usize) -> Q6Half<S> {
        signed_scales_half::<S>(S::field_f32(fields, h), words, h)
    }
    #[inline(always)]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> S::I {
        S::word(words, 4 + 8 * s + c, h)
    }
    #[inline(always)]
    unsafe fn pass_sum(
        acc: S::I,
        steps: &[S::I],
        y: &[i8; 32],
        half: &Q6Half<S>,
        s: usize,
        first: usize,
    ) -> S::I {
        if S::FUSED_DOT {
            // A group's sum, up to 16 * 126 * 128, is no i16: each times its scale in i32.
            let (low, high) = sub_block_halves::<S>(steps, y, first);
            let acc = scaled_i32::<S>(acc, low, half.scales[2 * s]);
            scaled_i32::<S>(acc, high, half.scales[2 * s + 1])
        } else {
            // One step a run: a pair reaches 2 * 126 * 128.
            group_weighted_sum::<S, 1>(acc, steps, y, first, s, &half.scales)
        }
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline(always)]
    unsafe fn finish(
        acc: S::F,
        isum: S::I,
        half: &Q6Half<S>,
        act: &BlockQ8K,
        da: f32,
        _: f32,
        _: PairsAt<'_>,
    ) -> S::F {
        const { assert!(DECODED_OFFSET == 1 << 6) };
        let offsets = S::shl32::<6>(weighted_bsums::<S>(act, &half.pairs));
        let sums = S::to_f32(S::sub32(isum, offsets));
        S::add(acc, S::mul(S::mul(half.d, S::splat(da)), sums))
    }
}

// ---- the codebook formats (AVX2; AVX-512 runs these) ----

/// A step of IQ4_NL or IQ4_XS: the values its nibbles index (signed, within -127..=113) and
/// their magnitudes, which multiply as unsigned bytes against the activations carrying the
/// values' signs (`vpsignb`), so that a pair of products stays within 2 * 127 * 127.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_step(word: __m256i, n: usize) -> (__m256i, __m256i) {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_VALUES.as_ptr().cast()));
    let signed = _mm256_shuffle_epi8(table, V256::nibbles(word, n));
    (signed, _mm256_abs_epi8(signed))
}

/// IQ4_NL: `d * da * sum(value(q) * y)`, the nibbles as Q4_0's.
struct Iq4Nl;

impl Format<V256> for Iq4Nl {
    type Act = BlockQ8_0;
    type Fields = [u8; 32];
    type Words = [u8; 256];
    const SUBS: usize = 1;
    const PASS: usize = 2;
    type Half = __m256;
    type Step = (__m256i, __m256i);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(fields: &[u8; 32], _: &[u8; 256], h: usize) -> __m256 {
        V256::field(fields, 0, h)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &[u8; 256], h: usize, _: usize, c: usize) -> (__m256i, __m256i) {
        iq4_step(V256::word(words, c % 4, h), c / 4)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        acc: __m256i,
        steps: &[(__m256i, __m256i)],
        y: &[i8; 32],
        _: &__m256,
        _: usize,
        first: usize,
    ) -> __m256i {
        signed_pass_sum(acc, steps, y, first, _mm256_set1_epi16(1))
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
        _: PairsAt<'_>,
    ) -> __m256 {
        scaled::<V256>(acc, *d, da, _mm256_cvtepi32_ps(isum))
    }
}

/// The scales of half an IQ4_XS block: `d`, and per sub-block its scale (`ls - 32`) in both
/// i16 of every lane.
struct Iq4XsHalf {
    d: __m256,
    scales: [__m256i; 8],
}

/// IQ4_XS: `d * da * sum(scale * value(q) * y)` with a scale (`ls - 32`) per sub-block of 32,
/// each sub-block's nibbles as Q4_0's.
struct Iq4Xs;

impl Format<V256> for Iq4Xs {
    type Act = BlockQ8K;
    type Fields = [u8; 64];
    type Words = [u8; 33 * 64];
    const SUBS: usize = 8;
    const PASS: usize = 2;
    type Half = Iq4XsHalf;
    type Step = (__m256i, __m256i);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(fields: &[u8; 64], words: &Self::Words, h: usize) -> Iq4XsHalf {
        // `scales_h` sits where a second f16 field would: two bytes a row.
        let high: &[u8; 16] = fields[32 + 16 * h..][..16].try_into().unwrap();
        let high = _mm256_cvtepu16_epi32(_mm_loadu_si128(high.as_ptr().cast()));
        let low = V256::word(words, 0, h);
        let mut scales = [_mm256_setzero_si256(); 8];
        for (s, scale) in scales.iter_mut().enumerate() {
            let low = _mm256_srlv_epi32(low, _mm256_set1_epi32(4 * s as i32));
            let high = _mm256_srlv_epi32(high, _mm256_set1_epi32(2 * s as i32));
            let ls = _mm256_or_si256(
                _mm256_and_si256(low, _mm256_set1_epi32(0xf)),
                _mm256_slli_epi32::<4>(_mm256_and_si256(high, _mm256_set1_epi32(3))),
            );
            let ls = _mm256_sub_epi32(ls, _mm256_set1_epi32(32));
            // In both i16 of each lane.
            *scale = _mm256_or_si256(
                _mm256_and_si256(ls, _mm256_set1_epi32(0xffff)),
                _mm256_slli_epi32::<16>(ls),
            );
        }
        Iq4XsHalf {
            d: V256::field(fields, 0, h),
            scales,
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> (__m256i, __m256i) {
        iq4_step(V256::word(words, 1 + 4 * s + c % 4, h), c / 4)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pass_sum(
        acc: __m256i,
        steps: &[(__m256i, __m256i)],
        y: &[i8; 32],
        half: &Iq4XsHalf,
        s: usize,
        first: usize,
    ) -> __m256i {
        signed_pass_sum(acc, steps, y, first, half.scales[s])
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(
        acc: __m256,
        isum: __m256i,
        half: &Iq4XsHalf,
        _: &BlockQ8K,
        da: f32,
        _: f32,
        _: PairsAt<'_>,
    ) -> __m256 {
        scaled::<V256>(acc, half.d, da, _mm256_cvtepi32_ps(isum))
    }
}

/// A step of IQ4_NL or IQ4_XS with VNNI: the values the nibbles `n` of `word` index, plus 128
/// (within 1..=241: unsigned bytes for `vpdpbusd`).
#[inline(always)]
unsafe fn iq4_offset_step(word: __m512i, n: usize) -> __m512i {
    let table = _mm_add_epi8(
        _mm_loadu_si128(IQ4_VALUES.as_ptr().cast()),
        _mm_set1_epi8(-128),
    );
    let nibbles = V512::<Vnni>::nibbles(word, n);
    _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), nibbles)
}

/// IQ4_NL with VNNI: Q8_0's sums with VNNI (the 128 taken back through the token's sum) over
/// the steps of [`iq4_offset_step`], the nibbles as Q4_0's.
impl Format<V512<Vnni>> for Iq4Nl {
    type Act = BlockQ8_0;
    type Fields = [u8; 32];
    type Words = [u8; 256];
    const SUBS: usize = 1;
    const LIGHT: bool = true;
    const PASS: usize = 4;
    type Half = __m512;
    type Step = __m512i;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 32], _: &[u8; 256], h: usize) -> __m512 {
        V512::<Vnni>::field(fields, 0, h)
    }
    #[inline(always)]
    unsafe fn step(words: &[u8; 256], h: usize, _: usize, c: usize) -> __m512i {
        iq4_offset_step(V512::<Vnni>::word(words, c % 4, h), c / 4)
    }
    offset_q8_0_sums!(V512<Vnni>, 128.0, 4);
}

/// The scales of an IQ4_XS block with VNNI: `d`, and per sub-block its scale (`ls - 32`) in
/// both i16 of every lane.
struct Iq4XsVnniHalf {
    d: __m512,
    scales: [__m512i; 8],
}

/// IQ4_XS with VNNI: each step's values plus 128 (one lookup, unsigned bytes), their products
/// with the activations exact in i32 lanes (`vpdpbusd`), a sub-block's sum times its scale,
/// and the 128 taken back through the token's group sums times the scales: the integer sum
/// of the AVX2 kernel and the scalar one, without a byte sign instruction (AVX-512 has
/// none).
impl Format<V512<Vnni>> for Iq4Xs {
    type Act = BlockQ8K;
    type Fields = [u8; 64];
    type Words = [u8; 33 * 64];
    const SUBS: usize = 8;
    const LIGHT: bool = true;
    const PASS: usize = 8;
    type Half = Iq4XsVnniHalf;
    type Step = __m512i;

    #[inline(always)]
    unsafe fn half(fields: &[u8; 64], words: &Self::Words, h: usize) -> Iq4XsVnniHalf {
        // `scales_h` sits where a second f16 field would: two bytes a row.
        let high = _mm512_cvtepu16_epi32(_mm256_loadu_si256(fields[32..].as_ptr().cast()));
        let low = V512::<Vnni>::word(words, 0, h);
        let mut scales = [_mm512_setzero_si512(); 8];
        for (s, scale) in scales.iter_mut().enumerate() {
            let low = _mm512_srlv_epi32(low, _mm512_set1_epi32(4 * s as i32));
            let high = _mm512_srlv_epi32(high, _mm512_set1_epi32(2 * s as i32));
            let ls = _mm512_or_si512(
                _mm512_and_si512(low, _mm512_set1_epi32(0xf)),
                _mm512_slli_epi32::<4>(_mm512_and_si512(high, _mm512_set1_epi32(3))),
            );
            let ls = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
            // In both i16 of each lane.
            *scale = _mm512_or_si512(
                _mm512_and_si512(ls, _mm512_set1_epi32(0xffff)),
                _mm512_slli_epi32::<16>(ls),
            );
        }
        Iq4XsVnniHalf {
            d: V512::<Vnni>::field(fields, 0, h),
            scales,
        }
    }
    #[inline(always)]
    unsafe fn step(words: &Self::Words, h: usize, s: usize, c: usize) -> __m512i {
        iq4_offset_step(V512::<Vnni>::word(words, 1 + 4 * s + c % 4, h), c / 4)
    }
    #[inline(always)]
    unsafe fn pass_sum(
        acc: __m512i,
        steps: &[__m512i],
        y: &[i8; 32],
        half: &Iq4XsVnniHalf,
        s: usize,
        first: usize,
    ) -> __m512i {
        // At most 32 * 241 * 128 for a sub-block: an i32, times the scale in i32 lanes.
        let sum = dot_chain::<V512<Vnni>>(V512::<Vnni>::zero(), steps, y, first);
        scaled_i32::<V512<Vnni>>(acc, sum, half.scales[s])
    }
    fn y(act: &BlockQ8K, s: usize) -> &[i8; 32] {
        k_y(act, s)
    }
    #[inline(always)]
    unsafe fn finish(
        acc: __m512,
        isum: __m512i,
        half: &Iq4XsVnniHalf,
        act: &BlockQ8K,
        da: f32,
        _: f32,
        _: PairsAt<'_>,
    ) -> __m512 {
        type S = V512<Vnni>;
        // Sub-block `k`'s scale against its two groups' sums, times the 128.
        let offsets = S::shl32::<7>(weighted_bsums::<S>(act, &half.scales));
        scaled::<S>(acc, half.d, da, S::to_f32(S::sub32(isum, offsets)))
    }
}

// ---- one token on AVX2 ----

/// A format whose products against one token take [`one_token_avx2`] on AVX2 (a decode step's
/// products): both halves of a block's rows in each pass, and each packed word loaded once for
/// every step it holds. The loop of every tile width takes one half and one sub-block at a
/// time, so that a pass's steps serve up to 16 tokens; with one token that left it loading
/// each Q4_K word twice and spilling its sums (a core's products of a 576 x 1536 Q4_K matrix
/// in its L2 cache: 26.0 GiB/s that way, 39.7 this way). The integer sums and the f32
/// operations are the loop's, so the outputs are equal bit for bit.
trait OneTokenAvx2: Format<V256, Act = BlockQ8K> {
    /// Per half, the integer sum of the block's products with the token `act` (what the
    /// loop's passes add up), asking for the weights ahead as `prefetch` says where they come
    /// from memory (`None` where they are in the cache).
    unsafe fn block_sums(
        fields: &Self::Fields,
        words: &Self::Words,
        halves: &[Self::Half; 2],
        act: &BlockQ8K,
        prefetch: Option<Prefetch>,
    ) -> [__m256i; 2];
}

#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_token_avx2<F: OneTokenAvx2>(
    groups: &[u8],
    source: WeightsAt,
    a: TileActs,
    scales: &TileScales,
    out: &mut [&mut [f32]],
) {
    type S = V256;
    let ops = Operands::<F::Act, F::Fields, F::Words, 1>::new(groups, a, scales, out);
    // The running CPU's requests, looked up as it runs, unlike the loop's one-token products:
    // compiled for each kind of core as those are, AVX2's Q4_K read 91% of a read probe's rate
    // in a 1B model's decode steps on a Zen 5, against 98% this way (two threads, in turns).
    let prefetch = (source == WeightsAt::Memory).then(requests::<S, ANY_CORES>);
    for (g, blocks) in ops.each_group().enumerate() {
        let mut acc = [S::zero_f(); 2];
        for (b, (fields, words)) in blocks.enumerate() {
            let act = ops.column(b).token(0);
            let halves = [F::half(fields, words, 0), F::half(fields, words, 1)];
            let isum = F::block_sums(fields, words, &halves, act, prefetch);
            let ((d, sa), pairs) = (ops.scales(b, 0), ops.pairs(b, 0));
            for h in 0..2 {
                acc[h] = F::finish(acc[h], isum[h], &halves[h], act, d, sa, pairs);
            }
        }
        for (h, acc) in acc.into_iter().enumerate() {
            S::store(acc, &mut out[0][g * PACK_ROWS + h * S::ROWS..]);
        }
    }
}

/// Each word's low and high nibbles are sub-blocks 2j and 2j + 1: both taken from one load.
impl OneTokenAvx2 for Q4K {
    #[inline(always)]
    unsafe fn block_sums(
        fields: &[u8; 64],
        words: &[u8; 35 * 64],
        halves: &[Self::Half; 2],
        act: &BlockQ8K,
        prefetch: Option<Prefetch>,
    ) -> [__m256i; 2] {
        type S = V256;
        let low4 = S::splat_i32(0x0f0f0f0f);
        let mut isum = [S::zero(); 2];
        // Sub-blocks 2j and 2j + 1: the low and high nibbles of words 3 + 8j...
        for j in 0..4 {
            if let Some(how) = prefetch {
                prefetch_part::<S, Q4K>(fields, 2 * j, how);
                prefetch_part::<S, Q4K>(fields, 2 * j + 1, how);
            }
            let (y_low, y_high) = (k_y(act, 2 * j), k_y(act, 2 * j + 1));
            // Per half, the i16 pair sums of each sub-block (within 8 * 2 * 15 * 127).
            let mut pairs = [[S::zero(); 2]; 2];
            for c in 0..8 {
                let (low_y, high_y) = (quad::<S>(y_low, c), quad::<S>(y_high, c));
                for (h, pairs) in pairs.iter_mut().enumerate() {
                    let word = S::word(words, 3 + 8 * j + c, h);
                    let low = S::and(word, low4);
                    let high = S::and(S::shr16(word, 4), low4);
                    pairs[0] = S::add16(pairs[0], S::maddubs(low, low_y));
                    pairs[1] = S::add16(pairs[1], S::maddubs(high, high_y));
                }
            }
            for h in 0..2 {
                let scales = &halves[h].scales;
                isum[h] = S::madd_add(isum[h], pairs[h][0], scales[2 * j]);
                isum[h] = S::madd_add(isum[h], pairs[h][1], scales[2 * j + 1]);
            }
        }
        isum
    }
}

/// Each group's three words are loaded once for its four steps: the low 6 bits of each, and
/// their top 2 bits together.
impl OneTokenAvx2 for Q6K {
    #[inline(always)]
    unsafe fn block_sums(
        fields: &[u8; 32],
        words: &[u8; 52 * 64],
        halves: &[Self::Half; 2],
        act: &BlockQ8K,
        prefetch: Option<Prefetch>,
    ) -> [__m256i; 2] {
        type S = V256;
        let low6 = S::splat_i32(0x3f3f3f3f);
        let mut isum = [S::zero(); 2];
        for s in 0..8 {
            if let Some(how) = prefetch {
                prefetch_part::<S, Q6K>(fields, s, how);
            }
            let y = k_y(act, s);
            // Group 2s + k of 16 columns: steps 4k..4k + 4 of sub-block s.
            for k in 0..2 {
                let first = 4 + 3 * (2 * s + k);
                for (h, isum) in isum.iter_mut().enumerate() {
                    let w = vectors!(3, |j| S::word(words, first + j, h));
                    let steps = [
                        S::and(w[0], low6),
                        S::and(w[1], low6),
                        S::and(w[2], low6),
                        q6_top::<S>(w),
                    ];
                    // Runs of 2 steps, as `Q6K::pass_sum` takes them.
                    let scale = halves[h].scales[2 * s + k];
                    *isum = weighted_sum::<S, 2>(*isum, &steps, y, 4 * k, scale);
                }
            }
        }
        isum
    }
}

/// Calls `$f::<$($g),*, CORES>($args)` compiled for the running CPU's kind of cores
/// (`simd::requests`).
macro_rules! on_cores {
    ($f:ident::<$($g:tt),*> $args:tt) => {
        match cores() {
            Cores::ZenUpTo4 => $f::<$($g,)* { Cores::ZenUpTo4 as usize }> $args,
            Cores::Zen5On => $f::<$($g,)* { Cores::Zen5On as usize }> $args,
            Cores::Other => $f::<$($g,)* { Cores::Other as usize }> $args,
        }
    };
}

/// Calls `$loop` with a tile width of `a.len()` tokens: one, compiled for the running CPU's
/// kind of cores, or one of `$($t)*`, compiled for any.
macro_rules! tile_width {
    ($loop:ident::<$simd:ty, $format:ident> $args:tt, $n:expr, $($t:literal)*) => {
        match $n {
            1 => on_cores!($loop::<$simd, $format, 1, 1> $args),
            $($t => $loop::<$simd, $format, $t, { chunk_slots($t) }, ANY_CORES> $args,)*
            n => panic!("no packed tile of {n} tokens"),
        }
    };
}

/// Declares, in module `$module`, each format's entry point through the loop `$loop`: one
/// tile width per token count, picked by `a.len()`, and per format how it takes a packed tile:
/// `whole` (1 to 16 tokens in one call: the unpacked steps of a pass serve all of them) or
/// `by_group` (one group of tile scales, 1 to 8 tokens, at a time: where 16 tokens' sums and
/// a pass's steps outgrow the registers, as in every format on AVX-512 and those on AVX2 whose
/// steps take more than a few instructions to unpack or whose sums widen often), and where
/// `or` names one, the kernel of a single token.
macro_rules! packed_entry_points {
    ($module:ident, $loop:ident::<$simd:ty>, $features:literal: $($format:ident => $entry:ident $tiles:ident $(or $one:path)?),* $(,)?) => {
        pub(super) mod $module {
            use super::*;
            $(
                #[target_feature(enable = $features)]
                pub(in crate::kernels) unsafe fn $entry(
                    groups: &[u8],
                    source: WeightsAt,
                    a: TileActs,
                    scales: &TileScales,
                    out: &mut [&mut [f32]],
                ) {
                    $(if a.len() == 1 {
                        return $one(groups, source, a, scales, out);
                    })?
                    packed_entry_points!(@$tiles $loop::<$simd, $format>(groups, source, a, scales, out));
                }
            )*
        }
    };
    (@whole $loop:ident::<$simd:ty, $format:ident>($groups:ident, $source:ident, $a:ident, $scales:ident, $out:ident)) => {
        tile_width!($loop::<$simd, $format>($groups, $source, $a, $scales, $out), $a.len(),
            16 15 14 13 12 11 10 9 8 7 6 5 4 3 2)
    };
    (@by_group $loop:ident::<$simd:ty, $format:ident>($groups:ident, $source:ident, $a:ident, $scales:ident, $out:ident)) => {
        each_scale_group($source, $a, $scales, $out, |source, a, scales, out| {
            tile_width!($loop::<$simd, $format>($groups, source, a, scales, out), a.len(),
                8 7 6 5 4 3 2)
        })
    };
}

packed_entry_points!(avx2, packed_avx2::<V256>, "avx2,fma,f16c":
    Q40 => q4_0 by_group,
    Q41 => q4_1 by_group,
    Q50 => q5_0 by_group,
    Q80 => q8_0 by_group,
    Q2K => q2_k by_group,
    Q3K => q3_k whole,
    Q4K => q4_k whole or one_token_avx2::<Q4K>,
    Q5K => q5_k by_group,
    Q6K => q6_k whole or one_token_avx2::<Q6K>,
    Iq4Nl => iq4_nl by_group,
    Iq4Xs => iq4_xs by_group,
    Decoded => decoded by_group,
);

packed_entry_points!(avx512, packed_avx512::<V512<Bw>>, "avx512f,avx512bw":
    Q40 => q4_0 by_group,
    Q41 => q4_1 by_group,
    Q50 => q5_0 by_group,
    Q2K => q2_k by_group,
    Q3K => q3_k by_group,
    Q4K => q4_k by_group,
    Q5K => q5_k by_group,
    Q6K => q6_k by_group,
    Decoded => decoded by_group,
);

packed_entry_points!(avx512_vnni, packed_avx512_vnni::<V512<Vnni>>, "avx512f,avx512bw,avx512vnni":
    Q40 => q4_0 by_group,
    Q41 => q4_1 by_group,
    Q50 => q5_0 by_group,
    Q80 => q8_0 by_group,
    Q2K => q2_k by_group,
    Q3K => q3_k by_group,
    Q4K => q4_k by_group,
    Q5K => q5_k by_group,
    Q6K => q6_k by_group,
    Iq4Nl => iq4_nl by_group,
    Iq4Xs => iq4_xs by_group,
    Decoded => decoded by_group,
);
