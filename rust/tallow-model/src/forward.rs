//! The llama-family forward pass over a ragged batch of sequences.

use tallow_arena::Arena;
use tallow_gguf::GgufFile;
use tallow_kv::PagedKvCache;
use tallow_quant::QuantizedActs;

use crate::attention::{Attention, Heads, Plan, Scores};
use crate::batch::{Batch, Logits};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::ops::{add_in_place, add_rows, gated, rms_norm, rms_norm_in_place};
use crate::rope::Ropes;
use crate::scratch::{take, Failure, Scratch, Which};
use crate::weights::{Matrix, Weights};

pub(crate) struct Forward<'a> {
    pub file: &'a GgufFile,
    pub config: &'a ModelConfig,
    pub weights: &'a Weights,
    pub rope: &'a Ropes,
}

/// The activations of one step, all from the step arena.
struct Buffers<'s> {
    /// Position of each chunk's first token.
    first_pos: &'s mut [usize],
    x: &'s mut [f32],
    h: &'s mut [f32],
    q: &'s mut [f32],
    k: &'s mut [f32],
    v: &'s mut [f32],
    attn: &'s mut [f32],
    proj: &'s mut [f32],
    gate: &'s mut [f32],
    up: &'s mut [f32],
    /// How attention is split, and its scratch: per thread of the pool, and the states of
    /// the segments when units are split by segment.
    plan: Plan,
    attention: &'s mut [f32],
    partials: &'s mut [f32],
    /// The residual rows that produce logits, and the same after the output norm.
    rows: &'s mut [f32],
    normed: &'s mut [f32],
}

impl Forward<'_> {
    /// Runs every chunk of `batch` at the positions reserved for it: the last `len`
    /// positions of its sequence in `cache` (see [`PagedKvCache::append_slots`]). Writes their
    /// keys and values there and the requested logits (`n_vocab` floats per row, chunk by
    /// chunk) to `logits`, which must hold exactly that many. Takes all its memory from
    /// `scratch`, growing it first if this batch needs more than it has.
    pub fn run(
        &self,
        cache: &mut PagedKvCache,
        batch: &Batch,
        scratch: &mut Scratch,
        logits: &mut [f32],
    ) -> Result<(), ModelError> {
        let n_vocab = self.weights.token_embd.rows;
        if let Some(&id) = batch.tokens.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(ModelError::TokenOutOfRange { id, n_vocab });
        }
        let expected = batch.n_logits() * n_vocab;
        if logits.len() != expected {
            return Err(ModelError::InvalidArgument(format!(
                "the logits buffer holds {} values; this batch produces {expected}",
                logits.len()
            )));
        }
        loop {
            match self.attempt(cache, batch, scratch, logits) {
                Ok(()) => return Ok(()),
                Err(Failure::Model(e)) => return Err(e),
                // Rerunning is safe: an attempt only writes the KV rows of its own tokens,
                // which the next attempt writes again with the same values.
                Err(Failure::Exhausted { which, needed }) => scratch.grow(which, needed)?,
            }
        }
    }

    fn attempt(
        &self,
        cache: &mut PagedKvCache,
        batch: &Batch,
        scratch: &mut Scratch,
        logits: &mut [f32],
    ) -> Result<(), Failure> {
        let Scratch {
            step,
            layer: layer_arena,
        } = scratch;
        step.reset();
        let step: &Arena = step;
        check_batch(step, batch)?;
        let buf = self.buffers(step, cache, batch)?;
        let Buffers {
            first_pos,
            x,
            h,
            q,
            k,
            v,
            attn,
            proj,
            gate,
            up,
            plan,
            attention,
            partials,
            rows,
            normed,
        } = buf;
        let cfg = self.config;
        let n = batch.tokens.len();
        self.embed(&batch.tokens, x)?;
        if cfg.arch.embed_scale {
            let scale = (cfg.n_embd as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= scale);
        }
        // The rotary angles of each token's position, per RoPE, shared by the layers.
        let ropes = self.rope.all();
        let angles_len = ropes[0].angles_len();
        let all_angles = take::<f32>(step, Which::Step, ropes.len() * n * angles_len)?;
        for (rope, table) in ropes
            .iter()
            .zip(all_angles.chunks_exact_mut(n * angles_len))
        {
            for (c, chunk) in batch.chunks.iter().enumerate() {
                for i in 0..chunk.len {
                    let row = &mut table[(chunk.start + i) * angles_len..][..angles_len];
                    rope.angles(first_pos[c] + i, row);
                }
            }
        }

        for (l, layer) in self.weights.layers.iter().enumerate() {
            let r = self.rope.index(cfg, l);
            let (rope, rope_angles) = (&ropes[r], &all_angles[r * n * angles_len..]);
            let scores = Scores {
                scale: cfg.attn_scale,
                softcap: cfg.attn_softcap,
                window: cfg.window(l),
            };
            layer_arena.reset();
            let arena: &Arena = layer_arena;
            let mut acts = Activations::new(arena);

            rms_norm(x, &layer.attn_norm, cfg.rms_eps, h);
            self.project_many(
                &mut acts,
                [&layer.wq, &layer.wk, &layer.wv],
                h,
                n,
                [q, k, v],
            )?;
            for (rows, bias) in [
                (&mut *q, &layer.q_bias),
                (&mut *k, &layer.k_bias),
                (&mut *v, &layer.v_bias),
            ] {
                if let Some(bias) = bias {
                    add_rows(rows, bias);
                }
            }
            // Per-head RMSNorm of Q and K, before RoPE.
            for (rows, gain) in [(&mut *q, &layer.q_norm), (&mut *k, &layer.k_norm)] {
                if let Some(gain) = gain {
                    rms_norm_in_place(rows, gain, cfg.rms_eps);
                }
            }
            for (c, chunk) in batch.chunks.iter().enumerate() {
                for i in 0..chunk.len {
                    let (token, pos) = (chunk.start + i, first_pos[c] + i);
                    let angles = &rope_angles[token * angles_len..][..angles_len];
                    rope.apply(&mut q[token * cfg.q_dim()..][..cfg.q_dim()], angles);
                    let k_row = &mut k[token * cfg.kv_dim()..][..cfg.kv_dim()];
                    rope.apply(k_row, angles);
                    let v_row = &v[token * cfg.kv_dim()..][..cfg.kv_dim()];
                    cache.write_pos(chunk.seq, pos, l, k_row, v_row)?;
                }
            }
            let layer_attention = Attention {
                plan: &plan,
                cache,
                layer: l,
                batch,
                first_pos,
                q,
                scores,
            };
            layer_attention.run(attention, partials, attn)?;

            acts.clear();
            self.project(&mut acts, &layer.wo, attn, n, proj)?;
            if let Some(norm) = &layer.post_attn_norm {
                rms_norm_in_place(proj, norm, cfg.rms_eps);
            }
            add_in_place(x, proj);

            rms_norm(x, &layer.ffn_norm, cfg.rms_eps, h);
            acts.clear();
            self.project_many(&mut acts, [&layer.w_gate, &layer.w_up], h, n, [gate, up])?;
            gated(cfg.arch.activation, gate, up);
            acts.clear();
            self.project(&mut acts, &layer.w_down, gate, n, proj)?;
            if let Some(norm) = &layer.post_ffn_norm {
                rms_norm_in_place(proj, norm, cfg.rms_eps);
            }
            add_in_place(x, proj);
        }

        // Only the rows that produce logits go through the output norm and the LM head.
        let d = cfg.n_embd;
        let mut row = 0;
        for chunk in &batch.chunks {
            let wanted = match chunk.logits {
                Logits::None => 0..0,
                Logits::Last => chunk.start + chunk.len - 1..chunk.start + chunk.len,
                Logits::All => chunk.start..chunk.start + chunk.len,
            };
            rows[row * d..(row + wanted.len()) * d]
                .copy_from_slice(&x[wanted.start * d..wanted.end * d]);
            row += wanted.len();
        }
        if row > 0 {
            layer_arena.reset();
            let mut acts = Activations::new(layer_arena);
            rms_norm(rows, &self.weights.output_norm, cfg.rms_eps, normed);
            self.project(&mut acts, &self.weights.output, normed, row, logits)?;
            if let Some(cap) = cfg.final_softcap {
                logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
            }
        }
        Ok(())
    }

    /// Takes every buffer of the step from `arena`.
    fn buffers<'s>(
        &self,
        arena: &'s Arena,
        cache: &PagedKvCache,
        batch: &Batch,
    ) -> Result<Buffers<'s>, Failure> {
        let cfg = self.config;
        let n = batch.tokens.len();
        let f32s = |len: usize| take::<f32>(arena, Which::Step, len);
        let first_pos = take::<usize>(arena, Which::Step, batch.chunks.len())?;
        for (slot, chunk) in first_pos.iter_mut().zip(&batch.chunks) {
            let reserved = cache.seq_len(chunk.seq)?;
            let Some(first) = reserved.checked_sub(chunk.len) else {
                return Err(Failure::Model(ModelError::InvalidArgument(format!(
                    "sequence {} has {reserved} positions reserved, fewer than its {} new tokens",
                    chunk.seq, chunk.len
                ))));
            };
            *slot = first;
        }
        let threads = tallow_threads::global().threads();
        let heads = Heads {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
        };
        let plan = Plan::new(heads, cache.layout().page_size, batch, first_pos, threads);
        let n_logits = batch.n_logits();
        Ok(Buffers {
            first_pos,
            x: f32s(n * cfg.n_embd)?,
            h: f32s(n * cfg.n_embd)?,
            q: f32s(n * cfg.q_dim())?,
            k: f32s(n * cfg.kv_dim())?,
            v: f32s(n * cfg.kv_dim())?,
            attn: f32s(n * cfg.q_dim())?,
            proj: f32s(n * cfg.n_embd)?,
            gate: f32s(n * cfg.n_ff)?,
            up: f32s(n * cfg.n_ff)?,
            plan,
            attention: f32s(threads * plan.thread_scratch_len())?,
            partials: f32s(plan.partials_len(batch.chunks.len()))?,
            rows: f32s(n_logits * cfg.n_embd)?,
            normed: f32s(n_logits * cfg.n_embd)?,
        })
    }

    /// `out = input · mᵀ` for `n` rows of input, quantizing the input for `m` unless `acts`
    /// already holds it in the right format.
    fn project<'s>(
        &self,
        acts: &mut Activations<'s>,
        m: &Matrix,
        input: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), Failure> {
        let quantized = acts.for_matrix(m, input, n)?;
        m.matmul(self.file, &quantized, out)?;
        Ok(())
    }

    /// [`Forward::project`] of several matrices of the same input, in one parallel loop
    /// where they can be (all packed, reading the same activation format).
    fn project_many<'s, const N: usize>(
        &self,
        acts: &mut Activations<'s>,
        matrices: [&Matrix; N],
        input: &[f32],
        n: usize,
        outs: [&mut [f32]; N],
    ) -> Result<(), Failure> {
        let ty = matrices[0].ty.vec_dot_type();
        if matrices.iter().any(|m| m.ty.vec_dot_type() != ty) {
            for (m, out) in matrices.into_iter().zip(outs) {
                self.project(acts, m, input, n, out)?;
            }
            return Ok(());
        }
        let quantized = acts.for_matrix(matrices[0], input, n)?;
        Matrix::matmul_many(matrices, self.file, &quantized, outs)?;
        Ok(())
    }

    fn embed(&self, tokens: &[u32], x: &mut [f32]) -> Result<(), ModelError> {
        let table = &self.weights.token_embd;
        for (&id, row) in tokens.iter().zip(x.chunks_exact_mut(self.config.n_embd)) {
            table.dequantize_row(self.file, id as usize, row)?;
        }
        Ok(())
    }
}

/// The quantized form of one layer input, made on first use by each weight format that reads
/// it, from the layer arena.
struct Activations<'s> {
    arena: &'s Arena,
    quantized: Option<QuantizedActs<'s>>,
}

impl<'s> Activations<'s> {
    fn new(arena: &'s Arena) -> Self {
        Activations {
            arena,
            quantized: None,
        }
    }

    /// Marks the input as changed.
    fn clear(&mut self) {
        self.quantized = None;
    }

    fn for_matrix(
        &mut self,
        m: &Matrix,
        input: &[f32],
        n: usize,
    ) -> Result<QuantizedActs<'s>, Failure> {
        let ty = m.ty.vec_dot_type();
        if let Some(acts) = self.quantized.filter(|a| a.ty() == ty) {
            return Ok(acts);
        }
        let len = QuantizedActs::buffer_len(ty, n, m.cols)?;
        let bytes = take::<u8>(self.arena, Which::Layer, len.bytes)?;
        let scales = take::<f32>(self.arena, Which::Layer, len.scales)?;
        let acts = QuantizedActs::quantize(ty, input, n, m.cols, bytes, scales)?;
        self.quantized = Some(acts);
        Ok(acts)
    }
}

/// Checks the batch's shape: chunks tile `tokens` in order, none is empty, and no sequence
/// appears twice.
fn check_batch(arena: &Arena, batch: &Batch) -> Result<(), Failure> {
    let bad = |reason: String| Err(Failure::Model(ModelError::InvalidArgument(reason)));
    if batch.is_empty() {
        return bad("no tokens to evaluate".into());
    }
    let mut next = 0;
    for chunk in &batch.chunks {
        if chunk.len == 0 || chunk.start != next {
            return bad(format!(
                "chunk of sequence {} is empty or out of order",
                chunk.seq
            ));
        }
        next += chunk.len;
    }
    if next != batch.tokens.len() {
        return bad("the chunks do not cover every token of the batch".into());
    }
    let seqs = take::<u64>(arena, Which::Step, batch.chunks.len())?;
    for (id, chunk) in seqs.iter_mut().zip(&batch.chunks) {
        *id = chunk.seq.0;
    }
    seqs.sort_unstable();
    if let Some(pair) = seqs.windows(2).find(|pair| pair[0] == pair[1]) {
        return bad(format!("sequence {} appears twice in one batch", pair[0]));
    }
    Ok(())
}
