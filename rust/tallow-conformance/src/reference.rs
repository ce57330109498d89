//! Scalar references in f64: what each operation of the seam computes, written as plainly as
//! the formula.

use tallow_backend::{Activation, Moe, Rope, RopeStyle, Routing, Scores};
use tallow_kv::KvDtype;
use tallow_quant::{dequantize, quantize_row};

/// `x · Wᵀ` for the `x.len() / cols` tokens of `x` and the `w.len() / cols` rows of `w` (token
/// after token), and the magnitude `Σ|w·x|` of each value (the scale of its rounding error).
pub fn products(w: &[f32], x: &[f32], cols: usize) -> (Vec<f64>, Vec<f64>) {
    x.chunks_exact(cols)
        .flat_map(|x| w.chunks_exact(cols).map(move |w| (w, x)))
        .map(|(w, x)| {
            let pairs = w.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b));
            let magnitude = w.iter().zip(x).map(|(&a, &b)| f64::from(a * b).abs());
            (pairs.sum::<f64>(), magnitude.sum::<f64>())
        })
        .unzip()
}

/// RMSNorm of each row of `x` (rows as long as `gain`).
pub fn rms_norm(x: &[f64], gain: &[f32], eps: f32) -> Vec<f64> {
    x.chunks_exact(gain.len())
        .flat_map(|row| {
            let mean_square = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
            let scale = 1.0 / (mean_square + f64::from(eps)).sqrt();
            row.iter()
                .zip(gain)
                .map(move |(v, &g)| v * scale * f64::from(g))
        })
        .collect()
}

/// `activation(gate) * up`, element by element.
pub fn gated(activation: Activation, gate: &[f64], up: &[f64]) -> Vec<f64> {
    gate.iter()
        .zip(up)
        .map(|(&x, &u)| {
            let a = match activation {
                Activation::Silu => x / (1.0 + (-x).exp()),
                Activation::ClampedSwiglu => {
                    let (g, u) = (x.min(7.0), u.clamp(-7.0, 7.0));
                    return g / (1.0 + (-1.702 * g).exp()) * (u + 1.0);
                }
                Activation::GeluTanh => {
                    let c = (2.0 / std::f64::consts::PI).sqrt();
                    0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
                }
            };
            a * u
        })
        .collect()
}

/// The experts of one token and their weights from its router `logits`: the `top_k` largest
/// (ties to the lower index), weighted by `routing`.
pub fn route(logits: &[f32], top_k: usize, routing: Routing) -> Vec<(usize, f64)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let exp = |e: usize| f64::from(logits[e]).exp();
    let total: f64 = match routing {
        Routing::TopKSoftmax => order[..top_k].iter().map(|&e| exp(e)).sum(),
        Routing::SoftmaxTopK => (0..logits.len()).map(exp).sum(),
    };
    order[..top_k]
        .iter()
        .map(|&e| (e, exp(e) / total))
        .collect()
}

/// A mixture-of-experts block for each row of `x` (rows of `d`): the weighted sum of its
/// experts' `down(act(gate · x) * (up · x))`, `experts[e]` holding expert `e`'s gate, up and
/// down matrices (and `biases[e]` their biases); and the magnitude of each value
/// (`Σ weight · Σ|down · h|`).
pub fn experts(
    x: &[f32],
    router: &[f32],
    experts: &[[Vec<f32>; 3]],
    biases: Option<&[[Vec<f32>; 3]]>,
    moe: Moe,
    d: usize,
) -> (Vec<f64>, Vec<f64>) {
    let biased = |mut values: Vec<f64>, e: usize, part: usize| {
        if let Some(b) = biases {
            values
                .iter_mut()
                .zip(&b[e][part])
                .for_each(|(v, &b)| *v += f64::from(b));
        }
        values
    };
    let mut want = vec![0f64; x.len()];
    let mut scale = vec![0f64; x.len()];
    let rows = x.chunks_exact(d).zip(router.chunks_exact(experts.len()));
    for (t, (x, logits)) in rows.enumerate() {
        for (e, weight) in route(logits, moe.top_k, moe.routing) {
            let [gate, up, down] = &experts[e];
            let g = biased(products(gate, x, d).0, e, 0);
            let h = gated(moe.activation, &g, &biased(products(up, x, d).0, e, 1));
            let h: Vec<f32> = h.iter().map(|&v| v as f32).collect();
            let (y, magnitude) = products(down, &h, h.len());
            let y = biased(y, e, 2);
            for (i, (y, m)) in y.iter().zip(magnitude).enumerate() {
                want[t * d + i] += weight * y;
                scale[t * d + i] += weight * m;
            }
        }
    }
    (want, scale)
}

/// Each row of `x` (one per position of `positions`) with every head rotated by `rope`: the
/// angles as [`Rope::angles`] gives them (in f32, as every backend takes them), the rotation
/// in f64. Dimensions past the rotated pairs are kept.
pub fn rope(rope: &Rope, x: &[f32], positions: &[usize]) -> Vec<f64> {
    let row_len = x.len() / positions.len();
    let pairs = rope.angles_len() / 2;
    let mut angles = vec![0f32; rope.angles_len()];
    let mut out = crate::widen(x);
    for (row, &pos) in out.chunks_exact_mut(row_len).zip(positions) {
        rope.angles(pos, &mut angles);
        for head in row.chunks_exact_mut(rope.head_dim()) {
            for (pair, cs) in angles.chunks_exact(2).enumerate() {
                let (i, j) = match rope.style() {
                    RopeStyle::Interleaved => (2 * pair, 2 * pair + 1),
                    RopeStyle::Halves => (pair, pair + pairs),
                };
                let (c, s) = (f64::from(cs[0]), f64::from(cs[1]));
                let (a, b) = (head[i], head[j]);
                (head[i], head[j]) = (a * c - b * s, a * s + b * c);
            }
        }
    }
    out
}

/// `row` as KV pages of `dtype` hold it: rounded to its floats, or through its blocks.
pub fn stored(dtype: KvDtype, row: &[f32]) -> Vec<f32> {
    match dtype.block_format() {
        Some(format) => {
            let mut blocks = vec![0u8; dtype.bytes_for(row.len())];
            quantize_row(format, row, &mut blocks).expect("whole blocks of a KV format");
            let mut back = vec![0f32; row.len()];
            dequantize(format, &blocks, &mut back).expect("whole blocks of a KV format");
            back
        }
        None => match dtype {
            KvDtype::F16 => row
                .iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect(),
            KvDtype::Bf16 => row
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_f32())
                .collect(),
            _ => row.to_vec(),
        },
    }
}

/// Causal attention of one token's query heads (`q`, `n_head * head_dim` values) at `pos`
/// over the keys and values of its sequence's positions `0..=pos` (`keys[p]` and
/// `values[p]`, `n_head_kv * head_dim` each); query head `h` reads KV head
/// `h / (n_head / n_head_kv)`.
pub fn attention(
    q: &[f32],
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    pos: usize,
    head_dim: usize,
    scores: Scores,
    sinks: Option<&[f32]>,
) -> Vec<f64> {
    let n_head = q.len() / head_dim;
    let n_head_kv = keys[0].len() / head_dim;
    let group = n_head / n_head_kv;
    let visible = scores.first_visible(pos)..=pos;
    let mut out = Vec::with_capacity(q.len());
    for (h, q) in q.chunks_exact(head_dim).enumerate() {
        let kv = (h / group) * head_dim..(h / group + 1) * head_dim;
        let logits: Vec<f64> = visible
            .clone()
            .map(|p| {
                let dot: f64 = q
                    .iter()
                    .zip(&keys[p][kv.clone()])
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let s = dot * f64::from(scores.scale);
                match scores.softcap {
                    Some(cap) => f64::from(cap) * (s / f64::from(cap)).tanh(),
                    None => s,
                }
            })
            .collect();
        let top = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = logits.iter().map(|l| (l - top).exp()).collect();
        let sink = sinks.map_or(0.0, |s| (f64::from(s[h]) - top).exp());
        let total: f64 = weights.iter().sum::<f64>() + sink;
        for d in kv.clone() {
            let mixed: f64 = visible
                .clone()
                .zip(&weights)
                .map(|(p, w)| w * f64::from(values[p][d]))
                .sum();
            out.push(mixed / total);
        }
    }
    out
}
