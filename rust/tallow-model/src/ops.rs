//! Element-wise and row-wise operations of the forward pass.

/// `out = x / rms(x) * weight` for each row of `x`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (row, out_row) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        for ((o, &v), &w) in out_row.iter_mut().zip(row).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// Rotary position embedding in GGML's "normal" mode: dimensions `2i` and `2i + 1` of each
/// head rotate together by `pos * base^(-2i / rope_dim) / freq_factor[i]`. `x` holds one row of
/// `n_heads * head_dim` values for one position.
pub struct Rope {
    /// `base^(-2i / rope_dim) / freq_factor[i]` for each rotated pair.
    inv_freq: Vec<f32>,
    head_dim: usize,
}

impl Rope {
    pub fn new(base: f32, rope_dim: usize, head_dim: usize, freq_factors: Option<&[f32]>) -> Self {
        let inv_freq = (0..rope_dim / 2)
            .map(|i| {
                let f = base.powf(-((2 * i) as f32) / rope_dim as f32);
                f / freq_factors.map_or(1.0, |factors| factors[i])
            })
            .collect();
        Rope { inv_freq, head_dim }
    }

    pub fn apply(&self, x: &mut [f32], pos: usize) {
        for head in x.chunks_exact_mut(self.head_dim) {
            for (i, &inv_freq) in self.inv_freq.iter().enumerate() {
                let (sin, cos) = (pos as f32 * inv_freq).sin_cos();
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos - b * sin;
                head[2 * i + 1] = a * sin + b * cos;
            }
        }
    }
}

/// `gate = silu(gate) * up`, in place.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
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
    fn rms_norm_unit_rms() {
        let x = [3.0, -4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let mut out = [0.0; 8];
        rms_norm(&x, &[1.0, 2.0, 1.0, 1.0], 0.0, &mut out);
        assert!((out[0] - 1.2).abs() < 1e-6 && (out[1] + 3.2).abs() < 1e-6);
        assert_eq!(&out[4..], &[1.0, 2.0, 1.0, 1.0]);
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        let rope = Rope::new(10_000.0, 4, 4, None);
        let mut x = [1.0, 0.0, 0.0, 1.0];
        rope.apply(&mut x, 0);
        assert_eq!(x, [1.0, 0.0, 0.0, 1.0]);
        rope.apply(&mut x, 1);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        let theta = 10_000f32.powf(-0.5);
        assert!((x[2] + theta.sin()).abs() < 1e-6 && (x[3] - theta.cos()).abs() < 1e-6);
    }

    #[test]
    fn swiglu_matches_definition() {
        let mut g = [0.0, 1.0, -2.0];
        swiglu(&mut g, &[1.0, 2.0, 3.0]);
        let silu = |x: f32| x / (1.0 + (-x).exp());
        assert_eq!(g, [0.0, silu(1.0) * 2.0, silu(-2.0) * 3.0]);
    }
}
