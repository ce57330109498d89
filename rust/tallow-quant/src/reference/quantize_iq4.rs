//! f32 to IQ4_NL and IQ4_XS as `llama-quantize` writes them without an importance matrix
//! (ggml's `quantize_iq4_nl` and `quantize_iq4_xs`), bit for bit: each group of 32 rounds to
//! the nearest of the sixteen non-uniform values, its scale the best least-squares fit among
//! fifteen starting scales; IQ4_XS then rounds the eight groups' scales to 6 bits against
//! the block's f16 scale and rounds the values again.

use super::quantize::nearest_int;
use super::quantize_k::{signed_max, GROUP_MAX_EPS};
use crate::blocks::{BlockIq4Nl, BlockIq4Xs, IQ4_VALUES, QK_K};
use crate::fp16::f32_to_f16;

/// Starting scales tried on each side of the first (ggml's `ntry`).
const TRIES: i32 = 7;

/// ggml's `best_index_int8`: the index of the value nearest `x` (the upper one on ties).
fn nearest_value(x: f32) -> u8 {
    let value = |i: usize| f32::from(IQ4_VALUES[i]);
    if x <= value(0) {
        return 0;
    }
    if x >= value(15) {
        return 15;
    }
    let (mut low, mut high) = (0, 15);
    while high - low > 1 {
        let mid = (low + high) / 2;
        if x < value(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    if x - value(high - 1) < value(high) - x {
        (high - 1) as u8
    } else {
        high as u8
    }
}

/// The weighted least-squares sums `(sum w q x, sum w q^2)` of `x` rounded at `1 / d = id`,
/// weights `x^2`.
fn fit_sums(x: &[f32; 32], id: f32) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for &v in x {
        let q = f32::from(IQ4_VALUES[nearest_value(id * v) as usize]);
        let w = v * v;
        sumqx += w * q * v;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The scale of one group of 32: the fit at `max / -127` first, then at `max / (t - 127)`
/// for t in -7..=7, the best kept; 0 for a group of (nearly) zeros.
fn group_scale(x: &[f32; 32]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let first = f32::from(IQ4_VALUES[0]);
    let (sumqx, sumq2) = fit_sums(x, 1.0 / (-max / first));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for t in -TRIES..=TRIES {
        let (sumqx, sumq2) = fit_sums(x, (t + i32::from(IQ4_VALUES[0])) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// 32 values' nearest indices at `1 / d = id`, packed as Q4_0's nibbles.
fn packed_indices(x: &[f32; 32], id: f32) -> [u8; 16] {
    let l = x.map(|v| nearest_value(id * v));
    std::array::from_fn(|j| l[j] | (l[j + 16] << 4))
}

pub(crate) fn iq4_nl(x: &[f32; 32], b: &mut BlockIq4Nl) {
    let d = group_scale(x);
    b.d = f32_to_f16(d);
    b.qs = packed_indices(x, if d != 0.0 { 1.0 / d } else { 0.0 });
}

pub(crate) fn iq4_xs(x: &[f32; QK_K], b: &mut BlockIq4Xs) {
    let groups = x.as_chunks::<32>().0;
    let scales: [f32; 8] = std::array::from_fn(|g| group_scale(&groups[g]));
    let (max_scale, _) = signed_max(&scales);
    let d = -max_scale / 32.0;
    b.d = f32_to_f16(d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
    for (g, (xs, &scale)) in groups.iter().zip(&scales).enumerate() {
        let l = nearest_int(id * scale).clamp(-32, 31);
        let dl = d * l as f32;
        b.qs[16 * g..][..16]
            .copy_from_slice(&packed_indices(xs, if dl != 0.0 { 1.0 / dl } else { 0.0 }));
        let l = (l + 32) as u8;
        scales_l[g / 2] |= (l & 0xf) << (4 * (g % 2));
        scales_h |= u16::from(l >> 4) << (2 * g);
    }
    b.scales_l = scales_l;
    b.scales_h = scales_h.to_le_bytes();
}
