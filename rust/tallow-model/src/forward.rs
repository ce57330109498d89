//! The llama-family forward pass over the new tokens of one sequence.

use rayon::prelude::*;
use tallow_gguf::{GgmlType, GgufFile};
use tallow_quant::QuantizedActs;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::kv_cache::KvCache;
use crate::ops::{add_in_place, attend, rms_norm, swiglu, Rope};
use crate::weights::{Matrix, Weights};

/// Which positions of a forward call produce logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token (perplexity, verification of proposed tokens).
    All,
}

/// Activations of the quantized input of a linear layer, remembered so that several matrices
/// reading the same input (q/k/v, gate/up) quantize it once.
struct LinearInput {
    acts: QuantizedActs,
    format: Option<GgmlType>,
}

impl LinearInput {
    fn new() -> Self {
        LinearInput {
            acts: QuantizedActs::new(),
            format: None,
        }
    }

    /// Marks the input as changed.
    fn invalidate(&mut self) {
        self.format = None;
    }

    /// `out = input · mᵀ` for `n` rows of input.
    fn matmul(
        &mut self,
        file: &GgufFile,
        m: &Matrix,
        input: &[f32],
        n: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let format = m.ty.vec_dot_type();
        if self.format != Some(format) {
            self.acts.quantize(format, input, n, m.cols)?;
            self.format = Some(format);
        }
        out.resize(n * m.rows, 0.0);
        tallow_quant::matmul(m.ty, m.bytes(file), m.rows, m.cols, &self.acts, out)?;
        Ok(())
    }
}

pub(crate) struct Forward<'a> {
    pub file: &'a GgufFile,
    pub config: &'a ModelConfig,
    pub weights: &'a Weights,
    pub rope: &'a Rope,
}

impl Forward<'_> {
    /// Runs `tokens` at the next positions of `cache` and returns their logits, `n_vocab` per
    /// requested position.
    pub fn run(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = self.config;
        let n = tokens.len();
        let start = cache.len();
        if n == 0 {
            return Err(ModelError::InvalidArgument("no tokens to evaluate".into()));
        }
        if start + n > cache.n_ctx() {
            return Err(ModelError::ContextOverflow {
                needed: n,
                used: start,
                n_ctx: cache.n_ctx(),
            });
        }
        let d = cfg.n_embd;
        let mut x = self.embed(tokens)?;
        let mut h = vec![0.0; n * d];
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        let (mut attn, mut proj) = (vec![0.0; n * cfg.q_dim()], Vec::new());
        let (mut gate, mut up) = (Vec::new(), Vec::new());
        let mut input = LinearInput::new();

        for (l, layer) in self.weights.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm, cfg.rms_eps, &mut h);
            input.invalidate();
            input.matmul(self.file, &layer.wq, &h, n, &mut q)?;
            input.matmul(self.file, &layer.wk, &h, n, &mut k)?;
            input.matmul(self.file, &layer.wv, &h, n, &mut v)?;
            for i in 0..n {
                self.rope
                    .apply(&mut q[i * cfg.q_dim()..][..cfg.q_dim()], start + i);
                self.rope
                    .apply(&mut k[i * cfg.kv_dim()..][..cfg.kv_dim()], start + i);
            }
            cache.append(l, &k, &v);
            self.attention(cache, l, &q, start, &mut attn);

            input.invalidate();
            input.matmul(self.file, &layer.wo, &attn, n, &mut proj)?;
            add_in_place(&mut x, &proj);

            rms_norm(&x, &layer.ffn_norm, cfg.rms_eps, &mut h);
            input.invalidate();
            input.matmul(self.file, &layer.w_gate, &h, n, &mut gate)?;
            input.matmul(self.file, &layer.w_up, &h, n, &mut up)?;
            swiglu(&mut gate, &up);
            input.invalidate();
            input.matmul(self.file, &layer.w_down, &gate, n, &mut proj)?;
            add_in_place(&mut x, &proj);
        }
        cache.commit(n);

        let rows = match logits {
            Logits::Last => &x[(n - 1) * d..],
            Logits::All => &x[..],
        };
        let n_out = rows.len() / d;
        let mut normed = vec![0.0; rows.len()];
        rms_norm(rows, &self.weights.output_norm, cfg.rms_eps, &mut normed);
        let mut out = Vec::new();
        input.invalidate();
        input.matmul(self.file, &self.weights.output, &normed, n_out, &mut out)?;
        Ok(out)
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let table = &self.weights.token_embd;
        let (d, row_bytes) = (self.config.n_embd, table.row_bytes());
        let bytes = table.bytes(self.file);
        let mut x = vec![0.0; tokens.len() * d];
        for (&id, row) in tokens.iter().zip(x.chunks_exact_mut(d)) {
            if id as usize >= table.rows {
                return Err(ModelError::TokenOutOfRange {
                    id,
                    n_vocab: table.rows,
                });
            }
            let src = &bytes[id as usize * row_bytes..][..row_bytes];
            tallow_quant::dequantize(table.ty, src, row)?;
        }
        Ok(x)
    }

    /// Causal grouped-query attention of the `n` new tokens of `layer` (queries `q`, at
    /// positions `start..`) over every cached position up to their own. Heads run in
    /// parallel; each converts its KV head's history from f16 once for all its tokens.
    fn attention(&self, cache: &KvCache, layer: usize, q: &[f32], start: usize, out: &mut [f32]) {
        let cfg = self.config;
        let (hd, q_dim) = (cfg.head_dim, cfg.q_dim());
        let n = q.len() / q_dim;
        let group = cfg.n_head / cfg.n_head_kv;
        let mut per_head = vec![0.0f32; n * q_dim];
        per_head.par_chunks_mut(n * hd).enumerate().for_each_init(
            AttentionScratch::default,
            |scratch, (head, head_out)| {
                let n_pos = start + n;
                cache.read_head(
                    layer,
                    head / group,
                    n_pos,
                    &mut scratch.keys,
                    &mut scratch.values,
                );
                for (token, token_out) in head_out.chunks_exact_mut(hd).enumerate() {
                    let q_head = &q[token * q_dim + head * hd..][..hd];
                    let visible = (start + token + 1) * hd;
                    let kv = (&scratch.keys[..visible], &scratch.values[..visible]);
                    attend(q_head, kv, &mut scratch.scores, token_out);
                }
            },
        );
        // per_head is [head][token][hd]; the output projection wants [token][head][hd].
        for (head, head_rows) in per_head.chunks_exact(n * hd).enumerate() {
            for (token, row) in head_rows.chunks_exact(hd).enumerate() {
                out[token * q_dim + head * hd..][..hd].copy_from_slice(row);
            }
        }
    }
}

/// Per-thread buffers of the attention.
#[derive(Default)]
struct AttentionScratch {
    keys: Vec<f32>,
    values: Vec<f32>,
    scores: Vec<f32>,
}
