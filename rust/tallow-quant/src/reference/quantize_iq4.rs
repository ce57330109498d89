//! f32 to IQ4_NL and IQ4_XS as `llama-quantize` writes them without an importance matrix
//! (ggml's `quantize_iq4_nl` and `quantize_iq4_xs`), bit for bit: each group of 32 rounds to
//! the nearest of the sixteen non-uniform values, its scale the best least-squares fit among
//! fifteen starting scales; IQ4_XS then rounds the eight groups' scales to 6 bits against
//! the block's f16 scale and rounds the values again.
//!
//! Eight groups are searched side by side, one per lane (as the K-quants' searches are), each
//! lane with ggml's float operations in ggml's order; the nearest value is found without
//! branches, by comparing with all sixteen.

use super::quantize::{inverse, nearest_int, signed_absmax};
use super::quantize_k::{lanes, GROUP_MAX_EPS, LANES};
use crate::blocks::{as_blocks_mut, BlockIq4Nl, BlockIq4Xs, IQ4_VALUES, QK_K};
use crate::fp16::f32_to_f16;

/// Starting scales tried on each side of the first (ggml's `ntry`).
const TRIES: i32 = 7;

/// ggml's `best_index_int8` over the sixteen values: the index of the value nearest `x` (the
/// upper one on ties) and that value.
#[inline(always)]
fn nearest(x: f32) -> (u8, f32) {
    let values = IQ4_VALUES.map(f32::from);
    // Below: how many values are <= x, the largest of them and the smallest above x.
    let (mut below, mut low, mut high) = (0u8, values[0], values[15]);
    for &v in &values {
        below += u8::from(v <= x);
        low = if v <= x { v } else { low };
    }
    for &v in values.iter().rev() {
        high = if v > x { v } else { high };
    }
    if below == 0 {
        (0, values[0])
    } else if below == 16 {
        (15, values[15])
    } else if x - low < high - x {
        (below - 1, low)
    } else {
        (below, high)
    }
}

/// Each lane's weighted least-squares sums `(sum w q x, sum w q^2)` of its group rounded at
/// `1 / d = id`, weights `x^2`.
#[inline(always)]
fn fit_sums(x: &[[f32; LANES]; 32], id: &[f32; LANES]) -> ([f32; LANES], [f32; LANES]) {
    let (mut sumqx, mut sumq2) = ([0.0f32; LANES], [0.0f32; LANES]);
    for row in x {
        for g in 0..LANES {
            let v = row[g];
            let (_, q) = nearest(id[g] * v);
            let w = v * v;
            sumqx[g] += w * q * v;
            sumq2[g] += w * q * q;
        }
    }
    (sumqx, sumq2)
}

/// Each lane's group scale: the fit at `max / -127` first, then at `max / (t - 127)` for t in
/// -7..=7, the best kept; 0 for a group of (nearly) zeros.
#[inline(always)]
fn group_scales(x: &[[f32; LANES]; 32]) -> [f32; LANES] {
    let (mut max, mut amax) = ([0.0f32; LANES], [0.0f32; LANES]);
    for row in x {
        for g in 0..LANES {
            if row[g].abs() > amax[g] {
                amax[g] = row[g].abs();
                max[g] = row[g];
            }
        }
    }
    let first = f32::from(IQ4_VALUES[0]);
    let (sumqx, sumq2) = fit_sums(x, &max.map(|m| 1.0 / (-m / first)));
    let mut d: [f32; LANES] = std::array::from_fn(|g| {
        if sumq2[g] > 0.0 {
            sumqx[g] / sumq2[g]
        } else {
            0.0
        }
    });
    let mut best: [f32; LANES] = std::array::from_fn(|g| d[g] * sumqx[g]);
    for t in -TRIES..=TRIES {
        let top = (t + i32::from(IQ4_VALUES[0])) as f32;
        let (sumqx, sumq2) = fit_sums(x, &max.map(|m| top / m));
        for g in 0..LANES {
            if sumq2[g] > 0.0 && sumqx[g] * sumqx[g] > best[g] * sumq2[g] {
                d[g] = sumqx[g] / sumq2[g];
                best[g] = d[g] * sumqx[g];
            }
        }
    }
    std::array::from_fn(|g| if amax[g] < GROUP_MAX_EPS { 0.0 } else { d[g] })
}

/// 32 values' nearest indices at `1 / d = id`, packed as Q4_0's nibbles.
#[inline(always)]
fn packed_indices(x: &[f32], id: f32) -> [u8; 16] {
    let l: [u8; 32] = std::array::from_fn(|j| nearest(id * x[j]).0);
    std::array::from_fn(|j| l[j] | (l[j + 16] << 4))
}

/// A row of IQ4_NL blocks, searched eight blocks at a time (a last partial eight padded with
/// zeros whose results are dropped).
#[inline(always)]
pub(crate) fn iq4_nl_row(x: &[f32], dst: &mut [u8]) {
    for (x, blocks) in x
        .chunks(32 * LANES)
        .zip(as_blocks_mut::<BlockIq4Nl>(dst).chunks_mut(LANES))
    {
        let mut eight = [0.0f32; 32 * LANES];
        eight[..x.len()].copy_from_slice(x);
        let scales = group_scales(&lanes::<32>(&eight));
        for ((b, xs), &d) in blocks.iter_mut().zip(x.chunks_exact(32)).zip(&scales) {
            b.d = f32_to_f16(d);
            b.qs = packed_indices(xs, inverse(d));
        }
    }
}

#[inline(always)]
pub(crate) fn iq4_xs(x: &[f32; QK_K], b: &mut BlockIq4Xs) {
    let scales = group_scales(&lanes::<32>(x));
    let max_scale = signed_absmax(&scales);
    let d = -max_scale / 32.0;
    b.d = f32_to_f16(d);
    let id = inverse(d);
    let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
    for (g, (xs, &scale)) in x.chunks_exact(32).zip(&scales).enumerate() {
        let l = nearest_int(id * scale).clamp(-32, 31);
        b.qs[16 * g..][..16].copy_from_slice(&packed_indices(xs, inverse(d * l as f32)));
        let l = (l + 32) as u8;
        scales_l[g / 2] |= (l & 0xf) << (4 * (g % 2));
        scales_h |= u16::from(l >> 4) << (2 * g);
    }
    b.scales_l = scales_l;
    b.scales_h = scales_h.to_le_bytes();
}
