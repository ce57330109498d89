//! The attention tile kernel with fused multiply-adds, written once over a vector of
//! [`Lanes`] floats and compiled for AVX2 (8 lanes, module [`avx2`]) and AVX-512 (16 lanes,
//! module [`avx512`]), for head sizes that are whole vectors (others take the portable loops, `crate::kernels::attention::loops`).
//!
//! Query rows go four at a time through a tile: their scores three keys at a time (each key
//! chunk loaded once for the four rows, each query chunk once for the three keys, twelve
//! sums in registers), their weighted values two vectors of elements at a time (each value chunk
//! loaded once for the four rows). Rows left over go two or one at a time, with more keys
//! and elements at once, through the same arithmetic:
//! a score is one chain of fused multiply-adds over the head's chunks in order and
//! the same sum of the lanes, an element of the weighted values one chain over the
//! positions in order, so a row's result does not depend on the rows that come with it.
//!
//! The generic functions are inlined into each set's entry point, which carries the target
//! features (and no closure holds an intrinsic, since a closure does not take them).
//!
//! # Safety
//! The [`avx2`] entry points need AVX2 and FMA, the [`avx512`] ones AVX-512 F; the kernel
//! table (`crate::kernels::table`) only picks them where the CPU has them.

use std::arch::x86_64::*;

use half::f16;

use crate::kernels::attention::loops::{self, softmax};
use crate::kernels::attention::{plain_scale, TILE_POSITIONS};

/// A vector of f32 lanes and the operations the kernel takes.
trait Lanes: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    /// `LANES` floats from `p`.
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    unsafe fn mul(self, b: Self) -> Self;
    /// `self * b + c`, rounded once.
    unsafe fn fmadd(self, b: Self, c: Self) -> Self;
    /// The sum of the lanes, in a fixed order.
    unsafe fn sum(self) -> f32;
    /// `out[i] = v[i].sum()`, bit for bit.
    #[inline(always)]
    unsafe fn sums(v: &[Self], out: &mut [f32]) {
        for (out, v) in out.iter_mut().zip(v) {
            *out = v.sum();
        }
    }
}

impl Lanes for __m256 {
    const LANES: usize = 8;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn zero() -> Self {
        _mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn splat(x: f32) -> Self {
        _mm256_set1_ps(x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(p: *const f32) -> Self {
        _mm256_loadu_ps(p)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mul(self, b: Self) -> Self {
        _mm256_mul_ps(self, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        _mm256_fmadd_ps(self, b, c)
    }
    /// Halves, then pairs, then the last two.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sum(self) -> f32 {
        let s = _mm_add_ps(
            _mm256_castps256_ps128(self),
            _mm256_extractf128_ps::<1>(self),
        );
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
    /// Eight sums at a time in one vector, each through the additions of [`Lanes::sum`]: 21
    /// instructions where eight sums one by one take 48.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums(v: &[Self], out: &mut [f32]) {
        let (eights, rest) = v.as_chunks::<8>();
        let (out_eights, out_rest) = out.as_chunks_mut::<8>();
        for (v, out) in eights.iter().zip(out_eights) {
            _mm256_storeu_ps(out.as_mut_ptr(), sums8(v));
        }
        for (out, v) in out_rest.iter_mut().zip(rest) {
            *out = v.sum();
        }
    }
}

/// Lane `i` of the result: the sum of the lanes of `v[i]`, added as [`Lanes::sum`] adds them
/// (the halves, then lanes two apart, then the last two).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sums8(v: &[__m256; 8]) -> __m256 {
    // Inputs paired so that the sums land in lanes 0..8.
    let (v04, v15) = (halves(v[0], v[4]), halves(v[1], v[5]));
    let (v26, v37) = (halves(v[2], v[6]), halves(v[3], v[7]));
    let (v0145, v2367) = (two_apart(v04, v15), two_apart(v26, v37));
    // [x0 + x1 of each of v0..4 | of each of v4..8].
    _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(v0145, v2367),
        _mm256_shuffle_ps::<0b11_01_11_01>(v0145, v2367),
    )
}

/// `[x.lo + x.hi | y.lo + y.hi]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn halves(x: __m256, y: __m256) -> __m256 {
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(x, y),
        _mm256_permute2f128_ps::<0x31>(x, y),
    )
}

/// Per 128-bit lane, `[x0 + x2, x1 + x3, y0 + y2, y1 + y3]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn two_apart(x: __m256, y: __m256) -> __m256 {
    _mm256_add_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
        _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
    )
}

impl Lanes for __m512 {
    const LANES: usize = 16;
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn zero() -> Self {
        _mm512_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn splat(x: f32) -> Self {
        _mm512_set1_ps(x)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const f32) -> Self {
        _mm512_loadu_ps(p)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn mul(self, b: Self) -> Self {
        _mm512_mul_ps(self, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        _mm512_fmadd_ps(self, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sum(self) -> f32 {
        _mm512_reduce_add_ps(self)
    }
}

/// Whether the kernel of vectors of `lanes` takes heads of `head_dim` values.
fn fits(head_dim: usize, lanes: usize) -> bool {
    head_dim.is_multiple_of(lanes) && head_dim > 0
}

/// `dots[r][k]` = the dot product of query row `q[r]` with key `keys[k]` (`hd` floats each).
#[inline(always)]
unsafe fn dots<L: Lanes, const R: usize, const K: usize>(
    q: [*const f32; R],
    keys: [*const f32; K],
    hd: usize,
) -> [[f32; K]; R] {
    let mut acc = [[L::zero(); K]; R];
    for c in (0..hd).step_by(L::LANES) {
        let mut k = [L::zero(); K];
        for (k, key) in k.iter_mut().zip(keys) {
            *k = L::load(key.add(c));
        }
        for (acc, q) in acc.iter_mut().zip(q) {
            let x = L::load(q.add(c));
            for (acc, &k) in acc.iter_mut().zip(&k) {
                *acc = x.fmadd(k, *acc);
            }
        }
    }
    let mut out = [[0f32; K]; R];
    L::sums(acc.as_flattened(), out.as_flattened_mut());
    out
}

/// The scores of `R` query rows (`q`, rows of `hd`) against the keys from `j` on, `K` keys at
/// a time while `K` are left: row `r`'s in `scores[r]`. Returns the first key not taken.
#[inline(always)]
unsafe fn dots_by<L: Lanes, const R: usize, const K: usize>(
    q: [*const f32; R],
    keys: &[f32],
    hd: usize,
    scores: &mut [&mut [f32]; R],
    mut j: usize,
) -> usize {
    let n = keys.len() / hd;
    while j + K <= n {
        let key: [*const f32; K] = std::array::from_fn(|k| keys.as_ptr().add((j + k) * hd));
        let d = dots::<L, R, K>(q, key, hd);
        for (scores, d) in scores.iter_mut().zip(d) {
            scores[j..j + K].copy_from_slice(&d);
        }
        j += K;
    }
    j
}

/// `acc[r] = acc[r] * alpha[r] + sum_j w[r][j] * values[j]` for `R` rows, `V` vectors of
/// elements at a time.
#[inline(always)]
unsafe fn weighted<L: Lanes, const R: usize, const V: usize>(
    acc: [*mut f32; R],
    alpha: [f32; R],
    w: [&[f32]; R],
    values: &[f32],
    hd: usize,
    at: usize,
) {
    let mut sums = [[L::zero(); V]; R];
    for r in 0..R {
        for (v, sum) in sums[r].iter_mut().enumerate() {
            let a = L::load(acc[r].add(at + v * L::LANES));
            *sum = a.mul(L::splat(alpha[r]));
        }
    }
    for (j, value) in values.chunks_exact(hd).enumerate() {
        let mut x = [L::zero(); V];
        for (v, x) in x.iter_mut().enumerate() {
            *x = L::load(value.as_ptr().add(at + v * L::LANES));
        }
        for (sums, w) in sums.iter_mut().zip(&w) {
            let p = L::splat(*w.get_unchecked(j));
            for (sum, &x) in sums.iter_mut().zip(&x) {
                *sum = p.fmadd(x, *sum);
            }
        }
    }
    for r in 0..R {
        for (v, sum) in sums[r].iter().enumerate() {
            sum.store(acc[r].add(at + v * L::LANES));
        }
    }
}

/// The tile's positions taken into the states of `R` query rows, their scores `K` keys and
/// their values `V` vectors at a time (enough independent sums to keep the multiply-adds busy:
/// `R * K` and `R * V` of 8 or more).
#[inline(always)]
unsafe fn rows_of<L: Lanes, const R: usize, const K: usize, const V: usize>(
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
    let j = dots_by::<L, R, K>(rows, keys, hd, scores, 0);
    let j = dots_by::<L, R, 2>(rows, keys, hd, scores, j);
    dots_by::<L, R, 1>(rows, keys, hd, scores, j);
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
    while at + V * L::LANES <= hd {
        weighted::<L, R, V>(acc, alpha, w, values, hd, at);
        at += V * L::LANES;
    }
    while at < hd {
        weighted::<L, R, 1>(acc, alpha, w, values, hd, at);
        at += L::LANES;
    }
}

/// Takes `n = scores.len()` positions (`keys` and `values`, `n` rows of the head) into the
/// states of the query rows `q` (one state per row, side by side in `states`), with scores
/// `dot * scale` soft-capped to `cap * tanh(score / cap)`. Heads that are not whole vectors
/// take the generic loops; tiles of more than [`TILE_POSITIONS`] positions go one row at a
/// time.
#[inline(always)]
unsafe fn rows_with<L: Lanes>(
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
    if !fits(hd, L::LANES) {
        return loops::rows_with(states, q, keys, values, scores, scale, softcap);
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
        groups_of::<L, 4, 3, 2>(states, q, fours, keys, values, &mut four, scale, softcap);
    let [s0, s1, ..] = four;
    let mut two = [s0, s1];
    let (states, q) =
        groups_of::<L, 2, 4, 4>(states, q, twos, keys, values, &mut two, scale, softcap);
    let [s0, _] = two;
    let rows_left = q.len() / hd;
    groups_of::<L, 1, 8, 8>(
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
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn groups_of<'s, 'q, L: Lanes, const R: usize, const K: usize, const V: usize>(
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
        rows_of::<L, R, K, V>(group, q, keys, values, scores, scale, softcap);
    }
    (states, q)
}

/// Declares module `$module`: [`rows_with`] at vectors of `$lanes`, compiled with `$features`.
macro_rules! entry_points {
    ($module:ident, $lanes:ty, $features:literal) => {
        pub(crate) mod $module {
            use super::*;

            /// See [`super::rows_with`].
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn rows_with(
                states: &mut [f32],
                q: &[f32],
                keys: &[f32],
                values: &[f32],
                scores: &mut [f32],
                scale: f32,
                softcap: Option<f32>,
            ) {
                super::rows_with::<$lanes>(states, q, keys, values, scores, scale, softcap)
            }
        }
    };
}

entry_points!(avx2, __m256, "avx2,fma");
entry_points!(avx512, __m512, "avx512f");

/// [`avx2::rows_with`] with the plain scale `1 / sqrt(head_dim)` (AVX-512 has a kernel of its
/// own for it, `super::avx512::attention::rows`).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn rows_avx2(
    states: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
) {
    let scale = plain_scale(keys.len() / scores.len());
    avx2::rows_with(states, q, keys, values, scores, scale, None)
}

/// f16 to f32 with F16C, eight values per instruction (exact, as every f16 conversion).
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn widen_f16c(src: &[f16], out: &mut [f32]) {
    assert_eq!(src.len(), out.len());
    let (src8, src_tail) = src.as_chunks::<8>();
    let (out8, out_tail) = out.as_chunks_mut::<8>();
    for (s, o) in src8.iter().zip(out8) {
        let halves = _mm_loadu_si128(s.as_ptr().cast());
        _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(halves));
    }
    for (s, o) in src_tail.iter().zip(out_tail) {
        *o = s.to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    /// The eight sums at once are each vector's [`Lanes::sum`] bit for bit, for sums that
    /// round differently in every order (lanes of mixed magnitudes and signs).
    #[test]
    fn eight_sums_at_once_equal_each_sum() {
        if !crate::Isa::Avx2.is_available() {
            return;
        }
        let mut rng = Rng::new(31);
        for _ in 0..1000 {
            let lanes: Vec<f32> = (0..64)
                .map(|_| rng.range(-1.0, 1.0) * 10f32.powi(rng.range(-4.0, 4.0) as i32))
                .collect();
            // SAFETY: AVX2 and FMA are available (checked above).
            unsafe {
                let v: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(&lanes[8 * i]));
                let mut each = [0f32; 8];
                for (each, v) in each.iter_mut().zip(&v) {
                    *each = v.sum();
                }
                let mut at_once = [0f32; 8];
                <__m256 as Lanes>::sums(&v, &mut at_once);
                assert_eq!(at_once.map(f32::to_bits), each.map(f32::to_bits));
            }
        }
    }
}
