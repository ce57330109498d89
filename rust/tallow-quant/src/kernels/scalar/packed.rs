//! The packed kernels in portable scalar code: the reference the SIMD packed kernels are
//! tested against bit for bit, and the packed layout's kernel on CPUs without one.
//!
//! For each row of a group and each token, block after block, the row's block is unpacked to
//! its GGUF bytes, its integer sums are taken exactly, and they become floats through the
//! same f32 operations, in the same order and with the same fused multiply-adds, as in the
//! SIMD kernels (see `crate::kernels::x86::packed`): `d * da` rounded once, then one fused
//! multiply-add per term.

use crate::blocks::{
    as_blocks, k4_scales_mins, q3k_scales, Block, BlockIq4Nl, BlockIq4Xs, BlockQ2K, BlockQ3K,
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
    IQ4_VALUES,
};
use crate::fp16::f16_to_f32;
use crate::kernels::{each_scale_group, TileActs, TileScales, WeightsAt, PACK_ROWS, TILE_LANES};
use crate::packed::{Layout, MAX_BLOCK_BYTES};
use crate::reference::decode;
use crate::GgmlType;

/// One weight block against one token's activation block, with the token's f32 block scale
/// `da` and sum `sa`: `acc` plus the block's product.
type BlockProduct<W, A> = fn(w: &W, a: &A, da: f32, sa: f32, acc: f32) -> f32;

/// The packed product of any format, one row at a time: each of its blocks is unpacked once
/// and taken by every token of the tile.
fn packed<W: Block, A: Block>(
    ty: GgmlType,
    block: BlockProduct<W, A>,
    groups: &[u8],
    a: TileActs,
    scales: &TileScales,
    out: &mut [&mut [f32]],
) {
    let layout = Layout::of(ty).expect("packed formats have a layout");
    let n = a.len();
    assert!((1..=TILE_LANES).contains(&n) && out.len() == n);
    // Token `t`'s blocks are `acts[t * blocks..][..blocks]`.
    let (acts, blocks) = a.blocks::<A>();
    scales.check(blocks, n);
    let group_bytes = blocks * layout.packed_block_bytes();
    assert!(group_bytes > 0 && groups.len().is_multiple_of(group_bytes));
    let (d, s) = (scales.d, scales.s);
    let mut unpacked = [0u8; MAX_BLOCK_BYTES];
    let unpacked = &mut unpacked[..ty.block_bytes()];
    for (g, group) in groups.chunks_exact(group_bytes).enumerate() {
        for row in 0..PACK_ROWS {
            let mut acc = [0.0f32; TILE_LANES];
            let block_scales = d.chunks_exact(TILE_LANES).zip(s.chunks_exact(TILE_LANES));
            for (b, (d, s)) in block_scales.enumerate() {
                layout.unpack_block(group, b, row, unpacked);
                let w = &as_blocks::<W>(unpacked)[0];
                for (t, acc) in acc[..n].iter_mut().enumerate() {
                    *acc = block(w, &acts[t * blocks + b], d[t], s[t], *acc);
                }
            }
            for (out, acc) in out.iter_mut().zip(acc) {
                out[g * PACK_ROWS + row] = acc;
            }
        }
    }
}

fn dot<X: Copy + Into<i32>>(x: &[X], y: &[i8]) -> i32 {
    x.iter()
        .zip(y)
        .map(|(&x, &y)| x.into() * i32::from(y))
        .sum()
}

/// `d * da * (sum((q + offset) * y) - offset * sa)`.
fn offset_block(d: [u8; 2], biased: i32, da: f32, sa: f32, offset: f32, acc: f32) -> f32 {
    let sums = (-offset).mul_add(sa, biased as f32);
    (f16_to_f32(d) * da).mul_add(sums, acc)
}

fn q4_0(w: &BlockQ4_0, a: &BlockQ8_0, da: f32, sa: f32, acc: f32) -> f32 {
    let biased = dot(&decode::nibbles(&w.qs), &a.qs);
    offset_block(w.d, biased, da, sa, 8.0, acc)
}

fn q4_1(w: &BlockQ4_1, a: &BlockQ8_1, da: f32, sa: f32, acc: f32) -> f32 {
    let sums = dot(&decode::nibbles(&w.qs), &a.qs) as f32;
    let acc = (f16_to_f32(w.d) * da).mul_add(sums, acc);
    f16_to_f32(w.m).mul_add(sa, acc)
}

fn q5_0(w: &BlockQ5_0, a: &BlockQ8_0, da: f32, sa: f32, acc: f32) -> f32 {
    let biased = dot(&decode::five_bits(&w.qs, w.qh), &a.qs);
    offset_block(w.d, biased, da, sa, 16.0, acc)
}

fn q8_0(w: &BlockQ8_0, a: &BlockQ8_0, da: f32, _: f32, acc: f32) -> f32 {
    (f16_to_f32(w.d) * da).mul_add(dot(&w.qs, &a.qs) as f32, acc)
}

/// Q4_K and Q5_K: `d * da * sum(scale * q * y) - dmin * da * sum(min * y)`, the mins against
/// the token's group sums.
fn k4(
    d: [u8; 2],
    dmin: [u8; 2],
    packed: &[u8; 12],
    q: &[u8; 256],
    a: &BlockQ8K,
    da: f32,
    acc: f32,
) -> f32 {
    let (scales, mins) = k4_scales_mins(packed);
    let (mut sums, mut offsets) = (0i32, 0i32);
    for s in 0..8 {
        sums += i32::from(scales[s]) * dot(&q[32 * s..32 * s + 32], &a.qs[32 * s..]);
        offsets += i32::from(mins[s]) * (a.bsum(2 * s) + a.bsum(2 * s + 1));
    }
    let acc = (f16_to_f32(d) * da).mul_add(sums as f32, acc);
    (-(f16_to_f32(dmin) * da)).mul_add(offsets as f32, acc)
}

/// Q2_K: `d * da * sum(scale * q * y) - dmin * da * sum(min * y)`, a scale and a min per
/// group of 16.
fn q2_k(w: &BlockQ2K, a: &BlockQ8K, da: f32, _: f32, acc: f32) -> f32 {
    let q = decode::q2k(w);
    let (mut sums, mut offsets) = (0i32, 0i32);
    for (g, &packed) in w.scales.iter().enumerate() {
        sums += i32::from(packed & 0xf) * dot(&q[16 * g..16 * g + 16], &a.qs[16 * g..]);
        offsets += i32::from(packed >> 4) * a.bsum(g);
    }
    let acc = (f16_to_f32(w.d) * da).mul_add(sums as f32, acc);
    (-(f16_to_f32(w.dmin) * da)).mul_add(offsets as f32, acc)
}

fn q4_k(w: &BlockQ4K, a: &BlockQ8K, da: f32, _: f32, acc: f32) -> f32 {
    k4(w.d, w.dmin, &w.scales, &decode::q4k(w), a, da, acc)
}

fn q5_k(w: &BlockQ5K, a: &BlockQ8K, da: f32, _: f32, acc: f32) -> f32 {
    k4(w.d, w.dmin, &w.scales, &decode::q5k(w), a, da, acc)
}

/// Q3_K and Q6_K: `d * da * sum(scale * (q - offset) * y)` for quants `q` stored as the
/// value plus `offset`, the offset taken off through the group sums.
fn signed_scales(
    d: [u8; 2],
    scales: [i8; 16],
    q: &[u8; 256],
    offset: i32,
    a: &BlockQ8K,
    da: f32,
    acc: f32,
) -> f32 {
    let (mut sums, mut offsets) = (0i32, 0i32);
    for (g, &scale) in scales.iter().enumerate() {
        let scale = i32::from(scale);
        sums += scale * dot(&q[16 * g..16 * g + 16], &a.qs[16 * g..]);
        offsets += scale * a.bsum(g);
    }
    (f16_to_f32(d) * da).mul_add((sums - offset * offsets) as f32, acc)
}

fn q3_k(w: &BlockQ3K, a: &BlockQ8K, da: f32, _: f32, acc: f32) -> f32 {
    let q = decode::q3k(w).map(|q| (q + 4) as u8);
    signed_scales(w.d, q3k_scales(&w.scales), &q, 4, a, da, acc)
}

fn q6_k(w: &BlockQ6K, a: &BlockQ8K, da: f32, _: f32, acc: f32) -> f32 {
    let q = decode::q6k(w).map(|q| (q + 32) as u8);
    signed_scales(w.d, w.scales, &q, 32, a, da, acc)
}

/// IQ4_NL: `d * da * sum(value(q) * y)`.
fn iq4_nl(w: &BlockIq4Nl, a: &BlockQ8_0, da: f32, _: f32, acc: f32) -> f32 {
    let sums = dot(&decode::looked_up(&w.qs, &IQ4_VALUES), &a.qs);
    (f16_to_f32(w.d) * da).mul_add(sums as f32, acc)
}

/// IQ4_XS: `d * da * sum(scale * value(q) * y)`, the scaled group sums exact in an i32.
fn iq4_xs(w: &BlockIq4Xs, a: &BlockQ8K, da: f32, _: f32, acc: f32) -> f32 {
    let groups = w.qs.as_chunks::<16>().0.iter().zip(w.scales());
    let sums: i32 = (groups.zip(a.qs.as_chunks::<32>().0))
        .map(|((qs, scale), y)| scale * dot(&decode::looked_up(qs, &IQ4_VALUES), y))
        .sum();
    (f16_to_f32(w.d) * da).mul_add(sums as f32, acc)
}

/// Declares each format's entry point.
macro_rules! packed_entry_points {
    ($($ty:ident => $entry:ident($block:ident)),* $(,)?) => {
        $(
            pub(super) fn $entry(
                groups: &[u8],
                source: WeightsAt,
                a: TileActs,
                scales: &TileScales,
                out: &mut [&mut [f32]],
            ) {
                each_scale_group(source, a, scales, out, |_, a, scales, out| {
                    packed(GgmlType::$ty, $block, groups, a, scales, out)
                });
            }
        )*
    };
}

packed_entry_points!(
    Q4_0 => q4_0_entry(q4_0),
    Q4_1 => q4_1_entry(q4_1),
    Q5_0 => q5_0_entry(q5_0),
    Q8_0 => q8_0_entry(q8_0),
    Q2_K => q2_k_entry(q2_k),
    Q3_K => q3_k_entry(q3_k),
    Q4_K => q4_k_entry(q4_k),
    Q5_K => q5_k_entry(q5_k),
    Q6_K => q6_k_entry(q6_k),
    IQ4_NL => iq4_nl_entry(iq4_nl),
    IQ4_XS => iq4_xs_entry(iq4_xs),
);
