//! The attention tile kernel in AVX2 intrinsics with FMA, for head sizes that are whole
//! vectors of 8 (others take the generic loops).
//!
//! Query rows go four at a time through a tile: their scores three keys at a time (each key
//! chunk loaded once for the four rows, each query chunk once for the three keys, twelve
//! sums in registers), their weighted values sixteen elements at a time (each value chunk
//! loaded once for the four rows). Rows left over go two or one at a time, with more keys
//! and elements at once, through the same arithmetic:
//! a score is one chain of fused multiply-adds over the head's chunks of 8 in order and
//! the same sum of the 8 lanes, an element of the weighted values one chain over the
//! positions in order, so a row's result does not depend on the rows that come with it.

use std::arch::x86_64::*;

use super::generic::{self, softmax};
use super::TILE_POSITIONS;

/// Lanes of a vector.
const LANES: usize = 8;
/// Whether the kernel takes heads of `head_dim` values.
pub(super) fn fits(head_dim: usize) -> bool {
    head_dim.is_multiple_of(LANES) && head_dim > 0
}

/// The sum of `v`'s lanes: halves, then pairs, then the last two.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// `dots[r][k]` = the dot product of query row `q[r]` with key `keys[k]` (`hd` floats each).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots<const R: usize, const K: usize>(
    q: [*const f32; R],
    keys: [*const f32; K],
    hd: usize,
) -> [[f32; K]; R] {
    let mut acc = [[_mm256_setzero_ps(); K]; R];
    for c in (0..hd).step_by(LANES) {
        let mut k = [_mm256_setzero_ps(); K];
        for (k, key) in k.iter_mut().zip(keys) {
            *k = _mm256_loadu_ps(key.add(c));
        }
        for (acc, q) in acc.iter_mut().zip(q) {
            let x = _mm256_loadu_ps(q.add(c));
            for (acc, &k) in acc.iter_mut().zip(&k) {
                *acc = _mm256_fmadd_ps(x, k, *acc);
            }
        }
    }
    let mut out = [[0f32; K]; R];
    for (out, acc) in out.iter_mut().zip(&acc) {
        for (out, &acc) in out.iter_mut().zip(acc) {
            *out = sum8(acc);
        }
    }
    out
}

/// The scores of `R` query rows (`q`, rows of `hd`) against the keys from `j` on, `K` keys at
/// a time while `K` are left: row `r`'s in `scores[r]`. Returns the first key not taken.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_by<const R: usize, const K: usize>(
    q: [*const f32; R],
    keys: &[f32],
    hd: usize,
    scores: &mut [&mut [f32]; R],
    mut j: usize,
) -> usize {
    let n = keys.len() / hd;
    while j + K <= n {
        let key: [*const f32; K] = std::array::from_fn(|k| keys.as_ptr().add((j + k) * hd));
        let d = dots::<R, K>(q, key, hd);
        for (scores, d) in scores.iter_mut().zip(d) {
            scores[j..j + K].copy_from_slice(&d);
        }
        j += K;
    }
    j
}

/// `acc[r] = acc[r] * alpha[r] + sum_j w[r][j] * values[j]` for `R` rows, `V` vectors of
/// elements at a time.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted<const R: usize, const V: usize>(
    acc: [*mut f32; R],
    alpha: [f32; R],
    w: [&[f32]; R],
    values: &[f32],
    hd: usize,
    at: usize,
) {
    let mut sums = [[_mm256_setzero_ps(); V]; R];
    for r in 0..R {
        for (v, sum) in sums[r].iter_mut().enumerate() {
            let a = _mm256_loadu_ps(acc[r].add(at + v * LANES));
            *sum = _mm256_mul_ps(a, _mm256_set1_ps(alpha[r]));
        }
    }
    for (j, value) in values.chunks_exact(hd).enumerate() {
        let mut x = [_mm256_setzero_ps(); V];
        for (v, x) in x.iter_mut().enumerate() {
            *x = _mm256_loadu_ps(value.as_ptr().add(at + v * LANES));
        }
        for (sums, w) in sums.iter_mut().zip(&w) {
            let p = _mm256_set1_ps(*w.get_unchecked(j));
            for (sum, &x) in sums.iter_mut().zip(&x) {
                *sum = _mm256_fmadd_ps(p, x, *sum);
            }
        }
    }
    for r in 0..R {
        for (v, sum) in sums[r].iter().enumerate() {
            _mm256_storeu_ps(acc[r].add(at + v * LANES), *sum);
        }
    }
}

/// The tile's positions taken into the states of `R` query rows, their scores `K` keys and
/// their values `V` vectors at a time (enough independent sums to keep the multiply-adds busy:
/// `R * K` and `R * V` of 8 or more).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_of<const R: usize, const K: usize, const V: usize>(
    states: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [&mut [f32]; R],
    scale: f32,
    softcap: Option<f32>,
) {
    let hd = q.len() / R;
    let rows: [*const f32; R] = std::array::from_fn(|r| q.as_ptr().add(r * hd));
    let j = dots_by::<R, K>(rows, keys, hd, scores, 0);
    let j = dots_by::<R, 2>(rows, keys, hd, scores, j);
    dots_by::<R, 1>(rows, keys, hd, scores, j);
    let mut alpha = [0f32; R];
    for ((state, scores), alpha) in states
        .chunks_exact_mut(hd + 2)
        .zip(scores.iter_mut())
        .zip(&mut alpha)
    {
        *alpha = softmax(state, scores, scale, softcap);
    }
    let acc: [*mut f32; R] = std::array::from_fn(|r| states.as_mut_ptr().add(r * (hd + 2) + 2));
    let w: [&[f32]; R] = std::array::from_fn(|r| &*scores[r]);
    let mut at = 0;
    while at + V * LANES <= hd {
        weighted::<R, V>(acc, alpha, w, values, hd, at);
        at += V * LANES;
    }
    while at < hd {
        weighted::<R, 1>(acc, alpha, w, values, hd, at);
        at += LANES;
    }
}

/// Takes `n = scores.len()` positions (`keys` and `values`, `n` rows of the head) into the
/// states of the query rows `q` (one state per row, side by side in `states`), with scores
/// `dot * scale` soft-capped to `cap * tanh(score / cap)`. Heads that do not [`fits`] take the
/// generic loops; tiles of more than [`TILE_POSITIONS`] positions go one row at a time.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows_with(
    states: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    scale: f32,
    softcap: Option<f32>,
) {
    let n = scores.len();
    let hd = keys.len() / n;
    if !fits(hd) {
        return generic::rows_with(states, q, keys, values, scores, scale, softcap);
    }
    assert!(keys.len() == values.len() && states.len() / (hd + 2) == q.len() / hd);
    let rows = q.len() / hd;
    // Rows taken four and two at a time; the scores of all but the first go on the stack.
    let (fours, twos) = if n <= TILE_POSITIONS {
        (rows / 4, rows % 4 / 2)
    } else {
        (0, 0)
    };
    let mut rest = [0f32; 3 * TILE_POSITIONS];
    let (r1, rest) = rest.split_at_mut(TILE_POSITIONS);
    let (r2, r3) = rest.split_at_mut(TILE_POSITIONS);
    let m = n.min(TILE_POSITIONS);
    let mut four = [&mut scores[..], &mut r1[..m], &mut r2[..m], &mut r3[..m]];
    let (states, q) =
        groups_of::<4, 3, 2>(states, q, fours, keys, values, &mut four, scale, softcap);
    let [s0, s1, ..] = four;
    let mut two = [s0, s1];
    let (states, q) = groups_of::<2, 4, 4>(states, q, twos, keys, values, &mut two, scale, softcap);
    let [s0, _] = two;
    let rows_left = q.len() / hd;
    groups_of::<1, 8, 8>(
        states,
        q,
        rows_left,
        keys,
        values,
        &mut [s0],
        scale,
        softcap,
    );
}

/// [`rows_of`] for the first `count` groups of `R` query rows of `states` and `q`; returns the
/// states and queries of the rows after them.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn groups_of<'s, 'q, const R: usize, const K: usize, const V: usize>(
    states: &'s mut [f32],
    q: &'q [f32],
    count: usize,
    keys: &[f32],
    values: &[f32],
    scores: &mut [&mut [f32]; R],
    scale: f32,
    softcap: Option<f32>,
) -> (&'s mut [f32], &'q [f32]) {
    let hd = keys.len() / scores[0].len();
    let (grouped, states) = states.split_at_mut(count * R * (hd + 2));
    let (grouped_q, q) = q.split_at(count * R * hd);
    for (group, q) in grouped
        .chunks_exact_mut(R * (hd + 2))
        .zip(grouped_q.chunks_exact(R * hd))
    {
        rows_of::<R, K, V>(group, q, keys, values, scores, scale, softcap);
    }
    (states, q)
}

/// [`rows_with`] with the plain scale `1 / sqrt(head_dim)`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows(
    states: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
) {
    let scale = 1.0 / ((keys.len() / scores.len()) as f32).sqrt();
    rows_with(states, q, keys, values, scores, scale, None)
}
