//! Element-wise and row-wise operations of the forward pass.

use tallow_backend::Activation;
use tallow_quant::ActivationKernels;

/// `out = x / rms(x) * weight` for each row of `x`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    by_rows(out, d, &|out, first| {
        let x = &x[first * d..][..out.len()];
        for (row, out_row) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let scale = inv_rms(row, eps);
            for ((o, &v), &w) in out_row.iter_mut().zip(row).zip(weight) {
                *o = v * scale * w;
            }
        }
    });
}

/// [`rms_norm`] of each row of `x` (rows as long as `weight`), in place.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    by_rows(x, weight.len(), &|rows, _| {
        for row in rows.chunks_exact_mut(weight.len()) {
            let scale = inv_rms(row, eps);
            for (v, &w) in row.iter_mut().zip(weight) {
                *v *= scale * w;
            }
        }
    });
}

/// Runs `f(rows, first)` over `data` cut into runs of whole rows of `row_len` values (`first`:
/// the index of a run's first row), on the thread pool when there are many values; a row's
/// result is the same either way.
fn by_rows(data: &mut [f32], row_len: usize, f: &(dyn Fn(&mut [f32], usize) + Sync)) {
    /// Values per task; below two tasks' worth the calling thread does it all (one token's
    /// 1536 values take about a microsecond, a verification's five tokens more than a
    /// dispatch costs).
    const CHUNK: usize = 1 << 11;
    let n_rows = data.len() / row_len.max(1);
    let rows_per_task = (CHUNK / row_len.max(1)).max(1);
    if data.len() < 2 * CHUNK || n_rows <= rows_per_task {
        return f(data, 0);
    }
    let shared = tallow_threads::DisjointSlice::new(data);
    tallow_threads::global().run(n_rows.div_ceil(rows_per_task), &|task, _| {
        let rows = task * rows_per_task..n_rows.min((task + 1) * rows_per_task);
        // SAFETY: each task writes its own rows.
        let run = unsafe { shared.range_mut(rows.start * row_len..rows.end * row_len) };
        f(run, rows.start);
    });
}

/// `1 / sqrt(mean(row²) + eps)`. The squares go into sixteen running sums, which the compiler
/// vectorizes: one running sum is a chain of dependent adds, a few cycles per element (the
/// per-head Q/K norms and the four norms of a Gemma layer made it a tenth of a prefill).
fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let mut sums = [0f32; 16];
    let (chunks, tail) = row.as_chunks::<16>();
    for chunk in chunks {
        for (sum, v) in sums.iter_mut().zip(chunk) {
            *sum += v * v;
        }
    }
    let square_sum = sums.iter().sum::<f32>() + tail.iter().map(|v| v * v).sum::<f32>();
    1.0 / (square_sum / row.len() as f32 + eps).sqrt()
}

/// Adds `bias` to each row of `x` (rows as long as `bias`).
pub fn add_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

/// `gate = act(gate) * up`, in place; on the thread pool when there are many values, with
/// the CPU's widest vectors.
pub fn gated(activation: Activation, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let (kernels, kernel) = (tallow_quant::activation_kernels(), gated_kernel(activation));
    by_rows(gate, 1, &|gate, first| {
        kernel(&kernels, gate, &up[first..first + gate.len()])
    });
}

/// The kernel table's loop for `activation`.
fn gated_kernel(activation: Activation) -> fn(&ActivationKernels, &mut [f32], &[f32]) {
    match activation {
        Activation::Silu => ActivationKernels::silu,
        Activation::GeluTanh => ActivationKernels::gelu_tanh,
        Activation::ClampedSwiglu => ActivationKernels::clamped_swiglu,
    }
}

/// Rotates every run of `n` values of `x` (`n` a power of two) by the orthonormal
/// Walsh-Hadamard matrix `H / sqrt(n)`, which is symmetric and its own inverse: a fast
/// transform of `n log n` additions, then one scale.
pub fn hadamard(x: &mut [f32], n: usize) {
    let scale = 1.0 / (n as f32).sqrt();
    for run in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for block in run.chunks_exact_mut(2 * h) {
                let (a, b) = block.split_at_mut(h);
                for (a, b) in a.iter_mut().zip(b) {
                    (*a, *b) = (*a + *b, *a - *b);
                }
            }
            h *= 2;
        }
        for v in run {
            *v *= scale;
        }
    }
}

/// `x += scale * y`.
pub fn add_scaled(x: &mut [f32], y: &[f32], scale: f32) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += scale * b;
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hadamard_is_the_orthonormal_walsh_matrix_and_its_own_inverse() {
        // Two runs of 4: H4 / 2 row by row.
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 0.5, 0.0, 0.0, 0.0];
        hadamard(&mut x, 4);
        assert_eq!(x, [5.0, -1.0, -2.0, 0.0, 0.25, 0.25, 0.25, 0.25]);
        // Twice is the identity; dot products are kept.
        let a: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let b: Vec<f32> = (0..64).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.7).collect();
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
        let (mut ra, mut rb) = (a.clone(), b.clone());
        hadamard(&mut ra, 64);
        hadamard(&mut rb, 64);
        assert!((dot(&ra, &rb) - dot(&a, &b)).abs() < 1e-4);
        hadamard(&mut ra, 64);
        for (x, y) in ra.iter().zip(&a) {
            assert!((x - y).abs() < 1e-5);
        }
    }

    #[test]
    fn rms_norm_unit_rms() {
        let x = [3.0, -4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let mut out = [0.0; 8];
        rms_norm(&x, &[1.0, 2.0, 1.0, 1.0], 0.0, &mut out);
        assert!((out[0] - 1.2).abs() < 1e-6 && (out[1] + 3.2).abs() < 1e-6);
        assert_eq!(&out[4..], &[1.0, 2.0, 1.0, 1.0]);
    }

    /// Many rows (on the pool) give each row the bits it gets alone.
    #[test]
    fn rms_norm_on_the_pool_equals_one_row_at_a_time() {
        let (rows, d) = (300, 64);
        let x: Vec<f32> = (0..rows * d)
            .map(|i| (i as f32 * 0.37).sin() * 3.0)
            .collect();
        let weight: Vec<f32> = (0..d).map(|i| 1.0 + i as f32 / 64.0).collect();
        let mut pooled = vec![0f32; rows * d];
        rms_norm(&x, &weight, 1e-6, &mut pooled);
        let mut in_place = x.clone();
        rms_norm_in_place(&mut in_place, &weight, 1e-6);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (r, row) in x.chunks_exact(d).enumerate() {
            let mut alone = vec![0f32; d];
            rms_norm(row, &weight, 1e-6, &mut alone);
            assert_eq!(bits(&pooled[r * d..(r + 1) * d]), bits(&alone), "row {r}");
            let mut alone = row.to_vec();
            rms_norm_in_place(&mut alone, &weight, 1e-6);
            assert_eq!(bits(&in_place[r * d..(r + 1) * d]), bits(&alone), "row {r}");
        }
    }

    /// On the pool (many values) it gives the bits of the one-thread loop.
    #[test]
    fn gated_on_the_pool_equals_one_thread() {
        let n = 10_000;
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        for activation in [Activation::Silu, Activation::GeluTanh] {
            let mut pooled = gate.clone();
            gated(activation, &mut pooled, &up);
            let mut alone = gate.clone();
            gated_kernel(activation)(&tallow_quant::activation_kernels(), &mut alone, &up);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&pooled), bits(&alone));
        }
    }

    #[test]
    fn gated_activations_match_their_definitions() {
        let x = [0.0f32, 1.0, -2.0, 3.5, -9.0, 12.0];
        let up = [1.0, 2.0, 3.0, -1.0, 0.5, 2.0];
        let silu = |x: f64| x / (1.0 + (-x).exp());
        let gelu = |x: f64| {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh())
        };
        for (activation, f) in [
            (Activation::Silu, &silu as &dyn Fn(f64) -> f64),
            (Activation::GeluTanh, &gelu),
        ] {
            let mut g = x;
            gated(activation, &mut g, &up);
            for ((&got, &x), &u) in g.iter().zip(&x).zip(&up) {
                let want = f(f64::from(x)) * f64::from(u);
                assert!(
                    (f64::from(got) - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{x}"
                );
            }
        }
    }
}
