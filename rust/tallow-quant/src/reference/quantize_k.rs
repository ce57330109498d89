//! f32 to the K-quant formats, as ggml's `quantize_row_q{2,3,4,5,6}_K_ref` (what
//! `llama-quantize` writes without an importance matrix), bit for bit: each group of 16 or
//! 32 values searches for the scale (and minimum) of least weighted error, then the groups'
//! scales are rounded to 4, 6 or 8 bits against the block's f16 scale, and the values are
//! rounded again against the scales as stored.
//!
//! The float operations run in ggml's order, one rounding each (ggml's reference code is
//! built without contraction into fused multiply-adds), so that every search makes the
//! same choices.

use super::quantize::{nearest_int, signed_absmax};
use crate::blocks::{
    k4_scales_mins, q3k_scales, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, QK_K,
};
use crate::fp16::{f16_to_f32, f32_to_f16};

/// A group whose largest magnitude is below this is all zeros (`GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// How [`scale_and_min`] searches: `steps + 1` inverse scales `(nmax + rmin + rdelta * i) /
/// (max - min)`, each refined by weighted least squares, the best kept by absolute or
/// squared error.
#[derive(Clone, Copy)]
struct Search {
    rmin: f32,
    rdelta: f32,
    steps: i32,
    abs_error: bool,
}

/// Groups searched side by side by [`scale_and_min`], one per lane.
pub(super) const LANES: usize = 8;

/// ggml's `make_qkx2_quants` for [`LANES`] groups of `N` at once (`x[i][g]`: element i of
/// group g): quants `l` in `0..=nmax` of each group as `scale * l - min`, with `min >= 0`;
/// returns each group's `(scale, min)`.
///
/// Each lane does the scalar search's float operations in its order, so every group comes
/// out bit for bit as ggml's; the loops over lanes are what the compiler vectorizes (the
/// search's running sums are otherwise one long chain of dependent additions).
#[inline(always)]
fn scale_and_min<const N: usize>(
    x: &[[f32; LANES]; N],
    weights: &[[f32; LANES]; N],
    nmax: i32,
    search: Search,
    l: &mut [[u8; LANES]; N],
) -> ([f32; LANES], [f32; LANES]) {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x: [f32; LANES] = std::array::from_fn(|g| sum_w[g] * x[0][g]);
    for i in 1..N {
        for g in 0..LANES {
            let v = x[i][g];
            min[g] = if v < min[g] { v } else { min[g] };
            max[g] = if v > max[g] { v } else { max[g] };
            sum_w[g] += weights[i][g];
            sum_x[g] += weights[i][g] * v;
        }
    }
    for m in &mut min {
        *m = if *m > 0.0 { 0.0 } else { *m };
    }
    let error = |diff: f32| {
        if search.abs_error {
            diff.abs()
        } else {
            diff * diff
        }
    };
    let quant = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax);
    let range: [f32; LANES] = std::array::from_fn(|g| max[g] - min[g]);
    let iscale: [f32; LANES] = std::array::from_fn(|g| nmax as f32 / range[g]);
    let mut scale: [f32; LANES] = std::array::from_fn(|g| 1.0 / iscale[g]);
    let mut best_error = [0.0f32; LANES];
    for i in 0..N {
        for g in 0..LANES {
            let q = quant(iscale[g], x[i][g], min[g]);
            l[i][g] = q as u8;
            best_error[g] += weights[i][g] * error(scale[g] * q as f32 + min[g] - x[i][g]);
        }
    }
    let start_min = min;
    let mut aux = [[0u8; LANES]; N];
    for step in 0..=search.steps {
        let top = search.rmin + search.rdelta * step as f32 + nmax as f32;
        let (mut sum_l, mut sum_l2, mut sum_xl) =
            ([0.0f32; LANES], [0.0f32; LANES], [0.0f32; LANES]);
        for i in 0..N {
            for g in 0..LANES {
                let q = quant(top / (max[g] - min[g]), x[i][g], min[g]);
                aux[i][g] = q as u8;
                let (w, q) = (weights[i][g], q as f32);
                sum_l[g] += w * q;
                sum_l2[g] += w * q * q;
                sum_xl[g] += w * q * x[i][g];
            }
        }
        let mut this_scale = [0.0f32; LANES];
        let mut this_min = [0.0f32; LANES];
        let mut fits = [false; LANES];
        for g in 0..LANES {
            let det = sum_w[g] * sum_l2[g] - sum_l[g] * sum_l[g];
            fits[g] = det > 0.0;
            let s = (sum_w[g] * sum_xl[g] - sum_x[g] * sum_l[g]) / det;
            let m = (sum_l2[g] * sum_x[g] - sum_l[g] * sum_xl[g]) / det;
            (this_scale[g], this_min[g]) = if m > 0.0 {
                (sum_xl[g] / sum_l2[g], 0.0)
            } else {
                (s, m)
            };
        }
        let mut this_error = [0.0f32; LANES];
        for i in 0..N {
            for g in 0..LANES {
                let diff = this_scale[g] * aux[i][g] as f32 + this_min[g] - x[i][g];
                this_error[g] += weights[i][g] * error(diff);
            }
        }
        let better: [bool; LANES] =
            std::array::from_fn(|g| fits[g] && this_error[g] < best_error[g]);
        for i in 0..N {
            for g in 0..LANES {
                l[i][g] = if better[g] { aux[i][g] } else { l[i][g] };
            }
        }
        for g in 0..LANES {
            if better[g] {
                best_error[g] = this_error[g];
                scale[g] = this_scale[g];
                min[g] = this_min[g];
            }
        }
    }
    // A group of one value: nothing to search (its lane computed with a zero range).
    for g in (0..LANES).filter(|&g| range[g] == 0.0) {
        l.iter_mut().for_each(|q| q[g] = 0);
        (scale[g], min[g]) = (0.0, start_min[g]);
    }
    (scale, min.map(|m| -m))
}

/// [`LANES`] consecutive groups of `N` values as `N` rows of one value of each group.
pub(super) fn lanes<const N: usize>(x: &[f32]) -> [[f32; LANES]; N] {
    std::array::from_fn(|i| std::array::from_fn(|g| x[N * g + i]))
}

/// [`LANES`] groups' quants back in order, group after group.
fn unlanes<const N: usize>(q: &[[u8; LANES]; N], l: &mut [u8]) {
    for (i, row) in q.iter().enumerate() {
        for (g, &v) in row.iter().enumerate() {
            l[N * g + i] = v;
        }
    }
}

/// The largest of `x` and 0 (ggml's running maximum of the groups' scales and minimums).
fn largest_from_zero(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, &v| if v > m { v } else { m })
}

/// The sums of ggml's weighted least-squares fit of `x` by `scale * l` with weights `x^2`:
/// `(sum w x l, sum w l^2)`.
#[inline(always)]
fn fit_sums(x: &[f32], l: impl Fn(usize) -> i32) -> (f32, f32) {
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let (w, q) = (v * v, l(i) as f32);
        sumlx += w * v * q;
        suml2 += w * q * q;
    }
    (sumlx, suml2)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 (weights `x^2`): symmetric quants
/// `l + nmax` in `0..2 nmax` of `x` as `scale * l`, the inverse scale tried at `nmax +
/// 0.1 i` for i in -9..=9; returns the scale.
#[inline(always)]
fn symmetric_scale(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let iscale = -(nmax as f32) / max;
    for (q, &v) in l.iter_mut().zip(x) {
        *q = (quant(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = fit_sums(x, |i| quant(iscale, x[i]));
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for step in (-9..=9).filter(|&s| s != 0) {
        let iscale = -(nmax as f32 + 0.1 * step as f32) / max;
        let (sumlx, suml2) = fit_sums(x, |i| quant(iscale, x[i]));
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (q, &v) in l.iter_mut().zip(x) {
                *q = (quant(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: symmetric quants `l + nmax` in `0..2 nmax`,
/// moved one at a time while that lowers the weighted error (at most five passes); returns
/// the scale.
#[inline(always)]
fn refined_symmetric_scale(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    for (q, &v) in l.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as i8;
    }
    let (mut sumlx, mut suml2) = fit_sums(x, |i| i32::from(l[i]));
    for _ in 0..5 {
        let mut changed = false;
        for (i, &v) in x.iter().enumerate() {
            let (w, old) = (v * v, f32::from(l[i]));
            let mut slx = sumlx - w * v * old;
            if slx <= 0.0 {
                continue;
            }
            let mut sl2 = suml2 - w * old * old;
            let new = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
            if new == i32::from(l[i]) {
                continue;
            }
            slx += w * v * new as f32;
            sl2 += w * new as f32 * new as f32;
            if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                l[i] = new as i8;
                (sumlx, suml2) = (slx, sl2);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    for q in l.iter_mut() {
        *q += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Each group of 16's scale by `scale_of` (which writes the group's quants into `l`).
#[inline(always)]
fn scales_of_16(
    x: &[f32; QK_K],
    l: &mut [i8; QK_K],
    scale_of: impl Fn(&[f32], &mut [i8]) -> f32,
) -> [f32; 16] {
    std::array::from_fn(|j| scale_of(&x[16 * j..][..16], &mut l[16 * j..][..16]))
}

/// Packs 128 quants below 4 as Q2_K and Q3_K hold them: byte l holds elements l, l + 32,
/// l + 64 and l + 96 at bits 0, 2, 4 and 6.
fn pack_crumbs(l: &[u8]) -> [u8; 32] {
    std::array::from_fn(|i| l[i] | (l[i + 32] << 2) | (l[i + 64] << 4) | (l[i + 96] << 6))
}

#[inline(always)]
pub(crate) fn q2_k(x: &[f32; QK_K], b: &mut BlockQ2K) {
    const SEARCH: Search = Search {
        rmin: -0.5,
        rdelta: 0.1,
        steps: 15,
        abs_error: true,
    };
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
    for half in 0..2 {
        let x = lanes::<16>(&x[128 * half..]);
        let weights = x.map(|xs| xs.map(f32::abs));
        let mut q = [[0u8; LANES]; 16];
        let (s, m) = scale_and_min(&x, &weights, 3, SEARCH, &mut q);
        scales[8 * half..][..8].copy_from_slice(&s);
        mins[8 * half..][..8].copy_from_slice(&m);
        unlanes(&q, &mut l[128 * half..]);
    }
    let max_scale = largest_from_zero(&scales);
    let max_min = largest_from_zero(&mins);
    b.scales = [0; 16];
    b.d = f32_to_f16(0.0);
    b.dmin = f32_to_f16(0.0);
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (packed, &s) in b.scales.iter_mut().zip(&scales) {
            *packed = nearest_int(iscale * s) as u8;
        }
        b.d = f32_to_f16(max_scale / 15.0);
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (packed, &m) in b.scales.iter_mut().zip(&mins) {
            *packed |= (nearest_int(iscale * m) << 4) as u8;
        }
        b.dmin = f32_to_f16(max_min / 15.0);
    }
    let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
    for (j, xs) in x.chunks_exact(16).enumerate() {
        let dj = d * f32::from(b.scales[j] & 0xf);
        if dj == 0.0 {
            continue;
        }
        let mj = dmin * f32::from(b.scales[j] >> 4);
        for (q, &v) in l[16 * j..][..16].iter_mut().zip(xs) {
            *q = nearest_int((v + mj) / dj).clamp(0, 3) as u8;
        }
    }
    for (half, qs) in b.qs.chunks_exact_mut(32).enumerate() {
        qs.copy_from_slice(&pack_crumbs(&l[128 * half..]));
    }
}

#[inline(always)]
pub(crate) fn q3_k(x: &[f32; QK_K], b: &mut BlockQ3K) {
    let mut l = [0i8; QK_K];
    let scales = scales_of_16(x, &mut l, |xs, l| refined_symmetric_scale(xs, 4, l));
    let max_scale = signed_absmax(&scales);
    b.scales = [0; 12];
    b.d = f32_to_f16(0.0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // ggml stores the rounded value in an int8_t before clamping it.
            let q = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
            b.scales[j % 8] |= (q & 0xf) << (4 * (j / 8));
            b.scales[8 + j % 4] |= (q >> 4) << (2 * (j / 4));
        }
        b.d = f32_to_f16(1.0 / iscale);
    }
    let d = f16_to_f32(b.d);
    for ((j, xs), sc) in x.chunks_exact(16).enumerate().zip(q3k_scales(&b.scales)) {
        let dj = d * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        for (q, &v) in l[16 * j..][..16].iter_mut().zip(xs) {
            *q = (nearest_int(v / dj).clamp(-4, 3) + 4) as i8;
        }
    }
    // The high bit of element e goes to bit e / 32 of hmask[e % 32].
    b.hmask = [0; 32];
    let mut low = [0u8; QK_K];
    for (e, (&q, low)) in l.iter().zip(&mut low).enumerate() {
        let q = q as u8;
        if q > 3 {
            b.hmask[e % 32] |= 1 << (e / 32);
        }
        *low = q & 3;
    }
    for (half, qs) in b.qs.chunks_exact_mut(32).enumerate() {
        qs.copy_from_slice(&pack_crumbs(&low[128 * half..]));
    }
}

/// Q4_K and Q5_K: eight groups of 32, each with a scale and a minimum, both rounded to 6
/// bits against the block's f16 `d` and `dmin`. Returns `(d, dmin, packed scales, quants)`.
#[inline(always)]
fn groups_of_32(
    x: &[f32; QK_K],
    nmax: i32,
    search: Search,
) -> ([u8; 2], [u8; 2], [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let x_lanes = lanes::<32>(x);
    let mut weights = [[0.0f32; LANES]; 32];
    for (g, xs) in x.chunks_exact(32).enumerate() {
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (i, &v) in xs.iter().enumerate() {
            weights[i][g] = av_x + v.abs();
        }
    }
    let mut q = [[0u8; LANES]; 32];
    let (scales, mins) = scale_and_min(&x_lanes, &weights, nmax, search, &mut q);
    unlanes(&q, &mut l);
    let max_scale = largest_from_zero(&scales);
    let max_min = largest_from_zero(&mins);
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dmin) = (f32_to_f16(max_scale / 63.0), f32_to_f16(max_min / 63.0));
    let (group_scales, group_mins) = k4_scales_mins(&packed);
    for (j, xs) in x.chunks_exact(32).enumerate() {
        let dj = f16_to_f32(d) * f32::from(group_scales[j]);
        if dj == 0.0 {
            continue;
        }
        let mj = f16_to_f32(dmin) * f32::from(group_mins[j]);
        for (q, &v) in l[32 * j..][..32].iter_mut().zip(xs) {
            *q = nearest_int((v + mj) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

#[inline(always)]
pub(crate) fn q4_k(x: &[f32; QK_K], b: &mut BlockQ4K) {
    let search = Search {
        rmin: -1.0,
        rdelta: 0.1,
        steps: 20,
        abs_error: false,
    };
    let l;
    (b.d, b.dmin, b.scales, l) = groups_of_32(x, 15, search);
    // Bytes 32k..32k+32 hold group 2k in their low nibbles and group 2k + 1 in their high.
    for (k, qs) in b.qs.chunks_exact_mut(32).enumerate() {
        for (i, q) in qs.iter_mut().enumerate() {
            *q = l[64 * k + i] | (l[64 * k + 32 + i] << 4);
        }
    }
}

#[inline(always)]
pub(crate) fn q5_k(x: &[f32; QK_K], b: &mut BlockQ5K) {
    let search = Search {
        rmin: -0.5,
        rdelta: 0.1,
        steps: 15,
        abs_error: false,
    };
    let l;
    (b.d, b.dmin, b.scales, l) = groups_of_32(x, 31, search);
    // As Q4_K's nibbles, the fifth bit of element i of group g in bit g of qh[i].
    b.qh = [0; 32];
    for (k, qs) in b.qs.chunks_exact_mut(32).enumerate() {
        for (i, q) in qs.iter_mut().enumerate() {
            let (lo, hi) = (l[64 * k + i], l[64 * k + 32 + i]);
            b.qh[i] |= ((lo >> 4) << (2 * k)) | ((hi >> 4) << (2 * k + 1));
            *q = (lo & 0xf) | ((hi & 0xf) << 4);
        }
    }
}

#[inline(always)]
pub(crate) fn q6_k(x: &[f32; QK_K], b: &mut BlockQ6K) {
    let mut l = [0i8; QK_K];
    let scales = scales_of_16(x, &mut l, |xs, l| symmetric_scale(xs, 32, l));
    let max_scale = signed_absmax(&scales);
    if max_scale.abs() < GROUP_MAX_EPS {
        *b = BlockQ6K {
            ql: [0; 128],
            qh: [0; 64],
            scales: [0; 16],
            d: f32_to_f16(0.0),
        };
        return;
    }
    let iscale = -128.0 / max_scale;
    b.d = f32_to_f16(1.0 / iscale);
    for (packed, &s) in b.scales.iter_mut().zip(&scales) {
        *packed = nearest_int(iscale * s).min(127) as i8;
    }
    let d = f16_to_f32(b.d);
    for (j, xs) in x.chunks_exact(16).enumerate() {
        let dj = d * f32::from(b.scales[j]);
        if dj == 0.0 {
            continue;
        }
        for (q, &v) in l[16 * j..][..16].iter_mut().zip(xs) {
            *q = (nearest_int(v / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    // In half h, element 32k + i: low 4 bits in ql[64h + i + 32(k & 1)] (low nibble for
    // k < 2), top 2 bits at bits 2k of qh[32h + i].
    for (h, (ql, qh)) in
        b.ql.chunks_exact_mut(64)
            .zip(b.qh.chunks_exact_mut(32))
            .enumerate()
    {
        let q = |k: usize, i: usize| l[128 * h + 32 * k + i] as u8;
        for i in 0..32 {
            ql[i] = (q(0, i) & 0xf) | ((q(2, i) & 0xf) << 4);
            ql[i + 32] = (q(1, i) & 0xf) | ((q(3, i) & 0xf) << 4);
            qh[i] = (0..4).fold(0, |acc, k| acc | ((q(k, i) >> 4) << (2 * k)));
        }
    }
}
