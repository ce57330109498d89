//! The llama-family forward pass over a ragged batch of sequences.

use std::collections::HashSet;

use rayon::prelude::*;
use tallow_gguf::{GgmlType, GgufFile};
use tallow_kv::{PagedKvCache, Slot};
use tallow_quant::QuantizedActs;

use crate::batch::{Batch, Logits, SeqChunk};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::ops::{add_in_place, attend, rms_norm, swiglu, Rope};
use crate::weights::{Matrix, Weights};

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

/// Where the tokens of one chunk sit in their sequence.
struct Placed<'a> {
    chunk: &'a SeqChunk,
    /// Position of the chunk's first token.
    first_pos: usize,
}

impl Forward<'_> {
    /// Runs every chunk of `batch` at the positions reserved for it: the last `len`
    /// positions of its sequence in `cache` (see [`PagedKvCache::append_slots`]). Writes their
    /// keys and values there and returns the requested logits (`n_vocab` floats per row, chunk
    /// by chunk).
    pub fn run(&self, cache: &mut PagedKvCache, batch: &Batch) -> Result<Vec<f32>, ModelError> {
        check_batch(batch)?;
        let n_vocab = self.weights.token_embd.rows;
        if let Some(&id) = batch.tokens.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(ModelError::TokenOutOfRange { id, n_vocab });
        }
        let mut placed = Vec::with_capacity(batch.chunks.len());
        let mut slots = Vec::with_capacity(batch.tokens.len());
        for chunk in &batch.chunks {
            let reserved = cache.seq_len(chunk.seq)?;
            let Some(first_pos) = reserved.checked_sub(chunk.len) else {
                return Err(ModelError::InvalidArgument(format!(
                    "sequence {} has {reserved} positions reserved, fewer than its {} new tokens",
                    chunk.seq, chunk.len
                )));
            };
            for pos in first_pos..reserved {
                slots.push(cache.sequences().slot(chunk.seq, pos)?);
            }
            placed.push(Placed { chunk, first_pos });
        }
        self.layers(cache, batch, &placed, &slots)
    }

    fn layers(
        &self,
        cache: &mut PagedKvCache,
        batch: &Batch,
        placed: &[Placed<'_>],
        slots: &[Slot],
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = self.config;
        let n = batch.tokens.len();
        let positions: Vec<usize> = placed
            .iter()
            .flat_map(|p| p.first_pos..p.first_pos + p.chunk.len)
            .collect();
        let d = cfg.n_embd;
        let mut x = self.embed(&batch.tokens)?;
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
            for (i, &pos) in positions.iter().enumerate() {
                self.rope
                    .apply(&mut q[i * cfg.q_dim()..][..cfg.q_dim()], pos);
                self.rope
                    .apply(&mut k[i * cfg.kv_dim()..][..cfg.kv_dim()], pos);
            }
            cache.write(slots, l, &k, &v)?;
            self.attention(cache, l, placed, &q, &mut attn)?;

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

        // Only the rows that produce logits go through the output norm and the LM head.
        let mut rows = Vec::with_capacity(batch.n_logits() * d);
        for chunk in &batch.chunks {
            let wanted = match chunk.logits {
                Logits::None => 0..0,
                Logits::Last => chunk.start + chunk.len - 1..chunk.start + chunk.len,
                Logits::All => chunk.start..chunk.start + chunk.len,
            };
            rows.extend_from_slice(&x[wanted.start * d..wanted.end * d]);
        }
        let n_out = rows.len() / d;
        let mut out = Vec::new();
        if n_out > 0 {
            let mut normed = vec![0.0; rows.len()];
            rms_norm(&rows, &self.weights.output_norm, cfg.rms_eps, &mut normed);
            input.invalidate();
            input.matmul(self.file, &self.weights.output, &normed, n_out, &mut out)?;
        }
        Ok(out)
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let table = &self.weights.token_embd;
        let (d, row_bytes) = (self.config.n_embd, table.row_bytes());
        let bytes = table.bytes(self.file);
        let mut x = vec![0.0; tokens.len() * d];
        for (&id, row) in tokens.iter().zip(x.chunks_exact_mut(d)) {
            let src = &bytes[id as usize * row_bytes..][..row_bytes];
            tallow_quant::dequantize(table.ty, src, row)?;
        }
        Ok(x)
    }

    /// Causal grouped-query attention of every chunk's new tokens over their sequence's
    /// cached positions up to their own. (chunk, head) pairs run in parallel; each reads its
    /// KV head's history through the page table once for all the chunk's tokens.
    fn attention(
        &self,
        cache: &PagedKvCache,
        layer: usize,
        placed: &[Placed<'_>],
        q: &[f32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let cfg = self.config;
        let (hd, q_dim) = (cfg.head_dim, cfg.q_dim());
        let group = cfg.n_head / cfg.n_head_kv;
        let tasks: Vec<(usize, usize)> = (0..placed.len())
            .flat_map(|c| (0..cfg.n_head).map(move |head| (c, head)))
            .collect();
        let results: Vec<Vec<f32>> = tasks
            .par_iter()
            .map_init(AttentionScratch::default, |scratch, &(c, head)| {
                let Placed { chunk, first_pos } = placed[c];
                let n_pos = first_pos + chunk.len;
                let (keys, values) = (&mut scratch.keys, &mut scratch.values);
                cache.read_head_f32(chunk.seq, layer, head / group, n_pos, keys, values)?;
                let mut head_out = vec![0.0; chunk.len * hd];
                for (i, token_out) in head_out.chunks_exact_mut(hd).enumerate() {
                    let q_head = &q[(chunk.start + i) * q_dim + head * hd..][..hd];
                    let visible = (first_pos + i + 1) * hd;
                    let kv = (&scratch.keys[..visible], &scratch.values[..visible]);
                    attend(q_head, kv, &mut scratch.scores, token_out);
                }
                Ok(head_out)
            })
            .collect::<Result<_, tallow_kv::KvError>>()?;
        // Each result is [token][hd] for one (chunk, head); the output projection wants
        // [token][head][hd].
        for (&(c, head), head_out) in tasks.iter().zip(&results) {
            let start = placed[c].chunk.start;
            for (i, row) in head_out.chunks_exact(hd).enumerate() {
                out[(start + i) * q_dim + head * hd..][..hd].copy_from_slice(row);
            }
        }
        Ok(())
    }
}

/// Per-thread buffers of the attention.
#[derive(Default)]
struct AttentionScratch {
    keys: Vec<f32>,
    values: Vec<f32>,
    scores: Vec<f32>,
}

/// Checks the batch's shape: chunks tile `tokens` in order, none is empty, and no sequence
/// appears twice.
fn check_batch(batch: &Batch) -> Result<(), ModelError> {
    let bad = |reason: String| Err(ModelError::InvalidArgument(reason));
    if batch.is_empty() {
        return bad("no tokens to evaluate".into());
    }
    let mut next = 0;
    let mut seen = HashSet::with_capacity(batch.chunks.len());
    for chunk in &batch.chunks {
        if chunk.len == 0 || chunk.start != next {
            return bad(format!(
                "chunk of sequence {} is empty or out of order",
                chunk.seq
            ));
        }
        if !seen.insert(chunk.seq) {
            return bad(format!("sequence {} appears twice in one batch", chunk.seq));
        }
        next += chunk.len;
    }
    if next != batch.tokens.len() {
        return bad("the chunks do not cover every token of the batch".into());
    }
    Ok(())
}
