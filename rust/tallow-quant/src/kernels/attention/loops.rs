//! The attention loops written once in portable Rust and compiled per instruction set by the
//! sets' wrappers (the compiler vectorizes them for the features of the function they are
//! inlined into): the scalar set's kernels, and the head sizes and tiles the SIMD kernels do
//! not take.

use super::{plain_scale, weight};
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Sixteen independent sums: the compiler vectorizes them without reassociating.
    let mut acc = [0f32; 16];
    let (a16, a_tail) = a.as_chunks::<16>();
    let (b16, b_tail) = b.as_chunks::<16>();
    for (x, y) in a16.iter().zip(b16) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = a_tail.iter().zip(b_tail).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// [`dot`] of `a` with each of the four rows of `b`, each the same bits as alone: the
/// rows' sums are independent, and taking them side by side keeps the adds from waiting
/// on one another (and each chunk of `a` is loaded once for the four).
#[inline(always)]
fn dots4(a: &[f32], b: &[f32]) -> [f32; 4] {
    let n = a.len();
    // Arrays spelt out: `std::array::from_fn` may stay out of line in the
    // `target_feature` functions that inline this one.
    let rows: [&[f32]; 4] = [&b[..n], &b[n..2 * n], &b[2 * n..3 * n], &b[3 * n..4 * n]];
    let mut acc = [[0f32; 16]; 4];
    let (a16, a_tail) = a.as_chunks::<16>();
    let [y0, y1, y2, y3] = rows.map(|r| r.as_chunks::<16>().0);
    for ((((x, y0), y1), y2), y3) in a16.iter().zip(y0).zip(y1).zip(y2).zip(y3) {
        for i in 0..16 {
            acc[0][i] += x[i] * y0[i];
            acc[1][i] += x[i] * y1[i];
            acc[2][i] += x[i] * y2[i];
            acc[3][i] += x[i] * y3[i];
        }
    }
    let done = a16.len() * 16;
    let total = |k: usize| {
        let tail: f32 = a_tail
            .iter()
            .zip(&rows[k][done..])
            .map(|(x, y)| x * y)
            .sum();
        acc[k].iter().sum::<f32>() + tail
    };
    [total(0), total(1), total(2), total(3)]
}

/// One page for one query head, with the plain scale (what the tests compare with).
#[cfg(test)]
#[inline(always)]
pub(crate) fn page(state: &mut [f32], q: &[f32], keys: &[f32], values: &[f32], scores: &mut [f32]) {
    let scale = plain_scale(q.len());
    page_with(state, q, keys, values, scores, scale, None)
}

/// [`page`] with scores `dot * scale`, soft-capped to `cap * tanh(score / cap)`.
#[inline(always)]
pub(crate) fn page_with(
    state: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    scale: f32,
    softcap: Option<f32>,
) {
    let hd = q.len();
    let (fours, rest) = scores.as_chunks_mut::<4>();
    for (s, k) in fours.iter_mut().zip(keys.chunks_exact(4 * hd)) {
        *s = dots4(q, k);
    }
    let done = fours.len() * 4;
    for (s, k) in rest.iter_mut().zip(keys[done * hd..].chunks_exact(hd)) {
        *s = dot(q, k);
    }
    let alpha = softmax(state, scores, scale, softcap);
    let acc = &mut state[2..];
    let done = weighted_values::<64>(acc, 0, alpha, scores, values);
    let done = weighted_values::<16>(acc, done, alpha, scores, values);
    weighted_values::<1>(acc, done, alpha, scores, values);
}

/// The scores of one page taken into a state `[max, sum, acc...]`: scaled (and
/// soft-capped), turned into weights `exp(score - new max)` in place, their sum added to
/// the state's rescaled sum; returns the factor `alpha` that rescales the state's
/// accumulated values to the new max.
#[inline(always)]
pub(crate) fn softmax(
    state: &mut [f32],
    scores: &mut [f32],
    scale: f32,
    softcap: Option<f32>,
) -> f32 {
    for s in scores.iter_mut() {
        *s *= scale;
        if let Some(cap) = softcap {
            *s = cap * (*s / cap).tanh();
        }
    }
    let page_max = lanes(scores, f32::NEG_INFINITY, f32::max);
    let new_max = state[0].max(page_max);
    let alpha = weight(state[0] - new_max);
    for s in scores.iter_mut() {
        *s = weight(*s - new_max);
    }
    let sum = lanes(scores, 0.0, |a, b| a + b);
    state[1] = state[1] * alpha + sum;
    state[0] = new_max;
    alpha
}

/// `values` folded by `op` in eight running results, then those in order and the values
/// past the last eight: a loop with one running result is a chain of dependent operations
/// that does not vectorize. (A maximum is the same in any order.)
#[inline(always)]
fn lanes(values: &[f32], start: f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut running = [start; 8];
    let (chunks, tail) = values.as_chunks::<8>();
    for chunk in chunks {
        for (r, &v) in running.iter_mut().zip(chunk) {
            *r = op(*r, v);
        }
    }
    let folded = running.into_iter().fold(start, &op);
    tail.iter().fold(folded, |a, &v| op(a, v))
}

/// `acc = acc * alpha + sum(p * v)` over the positions' weights `scores` and value rows
/// `values`, for the elements of `acc` from `from` on in blocks of `N`; returns where the
/// whole blocks end. Each element is scaled, then takes the positions in order, as a loop
/// over positions would do it, but a block stays in registers across the positions
/// instead of going through memory once per position (and `N` independent sums keep the
/// adds from waiting on one another).
#[inline(always)]
fn weighted_values<const N: usize>(
    acc: &mut [f32],
    from: usize,
    alpha: f32,
    scores: &[f32],
    values: &[f32],
) -> usize {
    let hd = acc.len();
    let mut at = from;
    while at + N <= hd {
        let block: &mut [f32; N] = (&mut acc[at..at + N]).try_into().unwrap();
        let mut sums = block.map(|a| a * alpha);
        for (&p, v) in scores.iter().zip(values.chunks_exact(hd)) {
            let x: &[f32; N] = v[at..at + N].try_into().unwrap();
            for i in 0..N {
                sums[i] += p * x[i];
            }
        }
        *block = sums;
        at += N;
    }
    at
}

/// [`page`] for each query row of `q`, with its state in `states`.
#[inline(always)]
pub(crate) fn rows(
    states: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
) {
    let scale = plain_scale(keys.len() / scores.len());
    rows_with(states, q, keys, values, scores, scale, None)
}

/// [`page_with`] for each query row of `q`: [`JOINT_ROWS`] rows at a time where the
/// tile has at most [`super::TILE_POSITIONS`] positions, so that each key and value row is
/// loaded once for them all; each row's result is the same bits as alone.
#[inline(always)]
pub(crate) fn rows_with(
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
    let rows = q.len() / hd;
    let joint = if n <= super::TILE_POSITIONS {
        rows / JOINT_ROWS * JOINT_ROWS
    } else {
        0
    };
    let (joint_states, states) = states.split_at_mut(joint * (hd + 2));
    let (joint_q, q) = q.split_at(joint * hd);
    for (states, q) in joint_states
        .chunks_exact_mut(JOINT_ROWS * (hd + 2))
        .zip(joint_q.chunks_exact(JOINT_ROWS * hd))
    {
        let mut rest = [0f32; (JOINT_ROWS - 1) * super::TILE_POSITIONS];
        joint_rows(states, q, keys, values, scores, &mut rest, scale, softcap);
    }
    for (state, q) in states.chunks_exact_mut(hd + 2).zip(q.chunks_exact(hd)) {
        page_with(state, q, keys, values, scores, scale, softcap);
    }
}

/// Query rows [`rows_with`] takes through the keys and values together.
const JOINT_ROWS: usize = 4;

/// [`page_with`] for [`JOINT_ROWS`] query rows at once: the scores of row 0 in `scores`,
/// of the others in `rest`; every score and every element of a state computed with the
/// operations of [`page_with`], in its order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn joint_rows(
    states: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    rest: &mut [f32],
    scale: f32,
    softcap: Option<f32>,
) {
    let n = scores.len();
    let hd = keys.len() / n;
    let (r1, rest) = rest.split_at_mut(n);
    let (r2, rest) = rest.split_at_mut(n);
    let r3 = &mut rest[..n];
    let mut rows: [&mut [f32]; JOINT_ROWS] = [scores, r1, r2, r3];
    let qr: [&[f32]; JOINT_ROWS] = [&q[..hd], &q[hd..2 * hd], &q[2 * hd..3 * hd], &q[3 * hd..]];
    // The scores: each key's chunks loaded once for the four rows, each row's sums as
    // `dot` makes them.
    let [q0, q1, q2, q3] = qr.map(|q| q.as_chunks::<16>().0);
    for (j, key) in keys.chunks_exact(hd).enumerate() {
        let mut acc = [[0f32; 16]; JOINT_ROWS];
        let (k16, k_tail) = key.as_chunks::<16>();
        for ((((y, x0), x1), x2), x3) in k16.iter().zip(q0).zip(q1).zip(q2).zip(q3) {
            for i in 0..16 {
                acc[0][i] += x0[i] * y[i];
                acc[1][i] += x1[i] * y[i];
                acc[2][i] += x2[i] * y[i];
                acc[3][i] += x3[i] * y[i];
            }
        }
        let done = k16.len() * 16;
        for ((row, acc), q) in rows.iter_mut().zip(&acc).zip(&qr) {
            let tail: f32 = q[done..].iter().zip(k_tail).map(|(x, y)| x * y).sum();
            row[j] = acc.iter().sum::<f32>() + tail;
        }
    }
    // The softmax of each row, as `page_with`.
    let mut alphas = [0f32; JOINT_ROWS];
    for ((row, state), alpha) in rows
        .iter_mut()
        .zip(states.chunks_exact_mut(hd + 2))
        .zip(&mut alphas)
    {
        *alpha = softmax(state, row, scale, softcap);
    }
    // The values: a block of 16 elements of the four rows in registers across the
    // positions, each value chunk loaded once for the four.
    let mut accs = states.chunks_exact_mut(hd + 2).map(|s| &mut s[2..]);
    let mut accs: [&mut [f32]; JOINT_ROWS] = [
        accs.next().unwrap(),
        accs.next().unwrap(),
        accs.next().unwrap(),
        accs.next().unwrap(),
    ];
    let mut at = 0;
    while at + 16 <= hd {
        let mut sums = [[0f32; 16]; JOINT_ROWS];
        for ((sums, acc), alpha) in sums.iter_mut().zip(&accs).zip(alphas) {
            for i in 0..16 {
                sums[i] = acc[at + i] * alpha;
            }
        }
        let [w0, w1, w2, w3] = [&*rows[0], &*rows[1], &*rows[2], &*rows[3]];
        for ((((v, &w0), &w1), &w2), &w3) in values.chunks_exact(hd).zip(w0).zip(w1).zip(w2).zip(w3)
        {
            let x: &[f32; 16] = v[at..at + 16].try_into().unwrap();
            for i in 0..16 {
                sums[0][i] += w0 * x[i];
                sums[1][i] += w1 * x[i];
                sums[2][i] += w2 * x[i];
                sums[3][i] += w3 * x[i];
            }
        }
        for (sums, acc) in sums.iter().zip(&mut accs) {
            acc[at..at + 16].copy_from_slice(sums);
        }
        at += 16;
    }
    for ((acc, alpha), row) in accs.iter_mut().zip(alphas).zip(&rows) {
        let scores: &[f32] = row;
        weighted_values::<1>(acc, at, alpha, scores, values);
    }
}

#[inline(always)]
pub(crate) fn merge(state: &mut [f32], other: &[f32]) {
    let new_max = state[0].max(other[0]);
    let a = weight(state[0] - new_max);
    let b = weight(other[0] - new_max);
    state[0] = new_max;
    state[1] = state[1] * a + other[1] * b;
    for (x, &y) in state[2..].iter_mut().zip(&other[2..]) {
        *x = *x * a + y * b;
    }
}
