//! Element-wise and row-wise operations of the forward pass.

use crate::arch::{Activation, RopeStyle};
use crate::config::ModelConfig;

/// `out = x / rms(x) * weight` for each row of `x`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (row, out_row) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let scale = inv_rms(row, eps);
        for ((o, &v), &w) in out_row.iter_mut().zip(row).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// [`rms_norm`] of each row of `x` (rows as long as `weight`), in place.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(weight.len()) {
        let scale = inv_rms(row, eps);
        for (v, &w) in row.iter_mut().zip(weight) {
            *v *= scale * w;
        }
    }
}

/// `1 / sqrt(mean(row²) + eps)`.
fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let mean_square = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
    1.0 / (mean_square + eps).sqrt()
}

/// Adds `bias` to each row of `x` (rows as long as `bias`).
pub fn add_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

/// Rotary position embedding: pair `i` of the first `rope_dim` dimensions of each head (which
/// dimensions pair up is the [`RopeStyle`]) rotates by `pos * base^(-2i / rope_dim) /
/// freq_factor[i]`. The cosines and sines of a position are computed once per step
/// ([`Rope::angles`]) and applied to every head of every layer ([`Rope::apply`]).
pub struct Rope {
    style: RopeStyle,
    /// `base^(-2i / rope_dim) / freq_factor[i]` for each rotated pair.
    inv_freq: Vec<f32>,
    head_dim: usize,
}

impl Rope {
    /// `scale` divides every position (linear RoPE scaling; 1 for none).
    pub fn new(
        style: RopeStyle,
        base: f32,
        rope_dim: usize,
        head_dim: usize,
        freq_factors: Option<&[f32]>,
        scale: f32,
    ) -> Self {
        let inv_freq = (0..rope_dim / 2)
            .map(|i| {
                let f = base.powf(-((2 * i) as f32) / rope_dim as f32);
                f / freq_factors.map_or(1.0, |factors| factors[i]) / scale
            })
            .collect();
        Rope {
            style,
            inv_freq,
            head_dim,
        }
    }

    /// Floats of one position's angles: a cosine and a sine per rotated pair.
    pub fn angles_len(&self) -> usize {
        2 * self.inv_freq.len()
    }

    /// Writes the cosine and sine of each rotated pair at `pos` to `out`
    /// ([`Rope::angles_len`] floats).
    pub fn angles(&self, pos: usize, out: &mut [f32]) {
        for (cs, &inv_freq) in out.chunks_exact_mut(2).zip(&self.inv_freq) {
            let (sin, cos) = (pos as f32 * inv_freq).sin_cos();
            cs[0] = cos;
            cs[1] = sin;
        }
    }

    /// Rotates every head of `x` (one row of `n_heads * head_dim` values) by `angles`, from
    /// [`Rope::angles`] of the row's position.
    pub fn apply(&self, x: &mut [f32], angles: &[f32]) {
        let half = self.inv_freq.len();
        for head in x.chunks_exact_mut(self.head_dim) {
            match self.style {
                RopeStyle::Interleaved => {
                    for (pair, cs) in head.chunks_exact_mut(2).zip(angles.chunks_exact(2)) {
                        (pair[0], pair[1]) = rotate(pair[0], pair[1], cs);
                    }
                }
                RopeStyle::Halves => {
                    let (low, high) = head[..2 * half].split_at_mut(half);
                    for ((a, b), cs) in low.iter_mut().zip(high).zip(angles.chunks_exact(2)) {
                        (*a, *b) = rotate(*a, *b, cs);
                    }
                }
            }
        }
    }
}

/// The RoPE of each layer of a model: the layers that attend globally use the model's base,
/// frequency factors and scaling; sliding-window layers may use their own base, unscaled.
pub struct Ropes {
    ropes: Vec<Rope>,
}

impl Ropes {
    pub fn new(config: &ModelConfig, freq_factors: Option<&[f32]>) -> Self {
        let rope = |base, factors, scale| {
            let style = config.arch.rope;
            Rope::new(
                style,
                base,
                config.rope_dim,
                config.head_dim,
                factors,
                scale,
            )
        };
        let mut ropes = vec![rope(config.rope_base, freq_factors, config.rope_scale)];
        if config.sliding_window.is_some() {
            ropes.push(rope(config.rope_base_swa, None, 1.0));
        }
        Ropes { ropes }
    }

    /// Every distinct RoPE; [`Ropes::index`] says which one a layer uses.
    pub fn all(&self) -> &[Rope] {
        &self.ropes
    }

    pub fn index(&self, config: &ModelConfig, layer: usize) -> usize {
        usize::from(config.slides(layer))
    }
}

/// `(a, b)` rotated by the angle whose cosine and sine are `cs`.
#[inline(always)]
fn rotate(a: f32, b: f32, cs: &[f32]) -> (f32, f32) {
    (a * cs[0] - b * cs[1], a * cs[1] + b * cs[0])
}

/// `exp(x)`, as Cephes' single-precision polynomial (relative error about 1e-7), written
/// so that loops over it vectorize; `x` is clamped to [-87, 88], so `exp(-inf)` is a value
/// under 2^-125 rather than 0.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_MIN, EXP_MAX);
    let n = (x * std::f32::consts::LOG2_E + EXP_ROUND) - EXP_ROUND;
    let r = x - n * EXP_LN2_HI + n * EXP_LN2_LO;
    let mut y = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        y = y * r + c;
    }
    y = y * (r * r) + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// The constants of [`exp`], shared with the vector versions: the clamp, the rounding constant
/// (adding and subtracting 1.5 * 2^23 rounds to the nearest integer), ln 2 in two parts
/// (`x - n ln 2` = `x - n * HI + n * LO`) and the polynomial of `(e^r - 1 - r) / r^2`,
/// highest degree first.
pub(crate) const EXP_MIN: f32 = -87.0;
pub(crate) const EXP_MAX: f32 = 88.0;
pub(crate) const EXP_ROUND: f32 = 12_582_912.0;
pub(crate) const EXP_LN2_HI: f32 = 0.693_359_4;
pub(crate) const EXP_LN2_LO: f32 = 2.121_944_4e-4;
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `gate = act(gate) * up`, in place; on the thread pool when there are many values, with
/// the CPU's widest vectors.
pub fn gated(activation: Activation, gate: &mut [f32], up: &[f32]) {
    /// Values per task on the pool; below two tasks' worth the calling thread does it all
    /// (one token's 1536 values take about a microsecond, a verification's five tokens more
    /// than a dispatch costs).
    const CHUNK: usize = 1 << 11;
    assert_eq!(gate.len(), up.len());
    let kernels = gated_kernels();
    let kernel = match activation {
        Activation::Silu => kernels.silu,
        Activation::GeluTanh => kernels.gelu_tanh,
    };
    if gate.len() < 2 * CHUNK {
        return kernel(gate, up);
    }
    let shared = tallow_threads::DisjointSlice::new(gate);
    tallow_threads::global().run(up.len().div_ceil(CHUNK), &|task, _| {
        let range = task * CHUNK..up.len().min((task + 1) * CHUNK);
        // SAFETY: each task writes its own range.
        kernel(unsafe { shared.range_mut(range.clone()) }, &up[range]);
    });
}

/// `sqrt(2 / pi)`, of GELU's tanh approximation.
const GELU_C: f32 = 0.797_884_6;

/// `gate = act(gate) * up` for SiLU (`GELU` false) or GELU-tanh, written with [`exp`] so that
/// it vectorizes: `gelu(x) = x * sigmoid(2c(x + 0.044715 x^3))` is the tanh form.
#[inline(always)]
fn gated_loop<const GELU: bool>(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let z = if GELU {
            2.0 * GELU_C * (x + 0.044_715 * x * x * x)
        } else {
            x
        };
        *g = x / (1.0 + exp(-z)) * u;
    }
}

/// `gate = act(gate) * up`, in place.
type GatedFn = fn(&mut [f32], &[f32]);

#[derive(Clone, Copy)]
struct GatedKernels {
    silu: GatedFn,
    gelu_tanh: GatedFn,
}

/// [`gated_loop`] compiled for the best vectors of the running CPU (picked once).
fn gated_kernels() -> GatedKernels {
    static KERNELS: std::sync::OnceLock<GatedKernels> = std::sync::OnceLock::new();
    *KERNELS.get_or_init(pick_gated_kernels)
}

fn pick_gated_kernels() -> GatedKernels {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512<const GELU: bool>(gate: &mut [f32], up: &[f32]) {
            gated_loop::<GELU>(gate, up)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<const GELU: bool>(gate: &mut [f32], up: &[f32]) {
            gated_loop::<GELU>(gate, up)
        }
        use tallow_quant::Isa;
        if Isa::detected() >= Isa::Avx512 {
            // SAFETY: the CPU has AVX-512 F.
            return GatedKernels {
                silu: |gate, up| unsafe { avx512::<false>(gate, up) },
                gelu_tanh: |gate, up| unsafe { avx512::<true>(gate, up) },
            };
        }
        if Isa::detected() >= Isa::Avx2 {
            // SAFETY: the CPU has AVX2 and FMA.
            return GatedKernels {
                silu: |gate, up| unsafe { avx2::<false>(gate, up) },
                gelu_tanh: |gate, up| unsafe { avx2::<true>(gate, up) },
            };
        }
    }
    GatedKernels {
        silu: gated_loop::<false>,
        gelu_tanh: gated_loop::<true>,
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
        let rope = Rope::new(RopeStyle::Interleaved, 10_000.0, 4, 4, None, 1.0);
        let mut angles = vec![0.0; rope.angles_len()];
        let mut x = [1.0, 0.0, 0.0, 1.0];
        rope.angles(0, &mut angles);
        rope.apply(&mut x, &angles);
        assert_eq!(x, [1.0, 0.0, 0.0, 1.0]);
        rope.angles(1, &mut angles);
        rope.apply(&mut x, &angles);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        let theta = 10_000f32.powf(-0.5);
        assert!((x[2] + theta.sin()).abs() < 1e-6 && (x[3] - theta.cos()).abs() < 1e-6);
    }

    #[test]
    fn rope_in_halves_pairs_i_with_i_plus_half() {
        let rope = Rope::new(RopeStyle::Halves, 10_000.0, 4, 6, None, 1.0);
        let mut angles = vec![0.0; rope.angles_len()];
        rope.angles(1, &mut angles);
        // Two heads of 6; the last 2 dimensions of each are not rotated.
        let mut x = [1.0, 0.0, 0.0, 1.0, 7.0, 8.0, 0.0, 2.0, 0.0, 0.0, 9.0, 9.0];
        rope.apply(&mut x, &angles);
        let theta = 10_000f32.powf(-0.5);
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        // Pair (0, 2) turns by 1 radian, pair (1, 3) by theta.
        assert!(close(x[0], 1f32.cos()) && close(x[2], 1f32.sin()));
        assert!(close(x[1], -theta.sin()) && close(x[3], theta.cos()));
        assert_eq!(&x[4..6], &[7.0, 8.0]);
        assert!(close(x[7], 2.0 * theta.cos()) && close(x[9], 2.0 * theta.sin()));
        assert_eq!(&x[10..], &[9.0, 9.0]);
    }

    #[test]
    fn exp_is_close_to_std() {
        let mut worst = 0f64;
        for i in -87_000..=88_000 {
            let x = i as f32 / 1000.0;
            let (got, want) = (f64::from(exp(x)), f64::from(x).exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert!(exp(f32::NEG_INFINITY) < 1e-37);
        assert!(exp(f32::INFINITY).is_finite());
        assert_eq!(exp(0.0), 1.0);
    }

    /// On the pool (many values) it gives the bits of the one-thread loop.
    #[test]
    fn gated_on_the_pool_equals_one_thread() {
        let n = 10_000;
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        for (activation, kernel) in [
            (Activation::Silu, gated_kernels().silu),
            (Activation::GeluTanh, gated_kernels().gelu_tanh),
        ] {
            let mut pooled = gate.clone();
            gated(activation, &mut pooled, &up);
            let mut alone = gate.clone();
            kernel(&mut alone, &up);
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
