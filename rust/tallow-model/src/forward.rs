//! The forward pass over a ragged batch of sequences, written once against the [`Backend`]
//! seam and driven by the architecture's description.

use tallow_backend::{
    Backend, BackendError, Batch, Moe, Output, OutputRows, Scores, Step, StepInput, StepPlan,
};
use tallow_kv::PagedKvCache;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::ropes::rope_index;
use crate::weights::{Dense, FeedForward, LayerWeights, Weights};

/// Where a forward pass writes what its batch asks for.
pub struct Outputs<'o> {
    /// The LM head's result for the rows that produce logits ([`Batch::n_logits`] of them).
    pub head: Output<'o>,
    /// The final hidden states (after the output norm) of the rows that ask for them
    /// ([`Batch::n_hidden`] rows of `n_embd` floats).
    pub hidden: &'o mut [f32],
}

impl<'o> From<Output<'o>> for Outputs<'o> {
    /// The head's result alone, for a batch that asks for no hidden states.
    fn from(head: Output<'o>) -> Self {
        Outputs {
            head,
            hidden: &mut [],
        }
    }
}

pub(crate) struct Forward<'a, B: Backend> {
    pub backend: &'a B,
    pub config: &'a ModelConfig,
    pub weights: &'a Weights<B>,
    pub ropes: &'a B::Ropes,
}

/// Memory the forward pass reuses from one call to the next: the backend's (see
/// [`Backend::Scratch`]) and a little of its own. Once it has served a batch of some shape
/// (tokens per chunk, sequence lengths no longer than before), a call with a batch of that
/// shape makes no heap allocation on the CPU. Keep one per KV cache (per engine).
pub struct Scratch<B: Backend> {
    backend: B::Scratch,
    /// The plan of the step.
    plan: StepPlan,
    /// The batch's sequence ids, sorted to find one that appears twice.
    seqs: Vec<u64>,
}

impl<B: Backend> Default for Scratch<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> Scratch<B> {
    /// Empty: the first calls size it.
    pub fn new() -> Self {
        Scratch {
            backend: B::Scratch::default(),
            plan: StepPlan::new(),
            seqs: Vec::new(),
        }
    }

    /// The backend's part.
    pub fn backend(&self) -> &B::Scratch {
        &self.backend
    }
}

impl<B: Backend> Forward<'_, B> {
    /// Runs every chunk of `batch` at the positions reserved for it: the last `len`
    /// positions of its sequence in `cache` (see [`PagedKvCache::append_slots`]). Writes their
    /// keys and values there and, for the rows that ask for logits (chunk by chunk), their
    /// logits or greedy tokens to `out.head`, and for those that ask for hidden states, those
    /// to `out.hidden`; each must hold exactly that many.
    pub fn run(
        &self,
        cache: &mut PagedKvCache,
        batch: &Batch,
        scratch: &mut Scratch<B>,
        out: Outputs<'_>,
    ) -> Result<(), ModelError> {
        let n_vocab = self.config.n_vocab;
        if let Some(&id) = batch.tokens.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(ModelError::TokenOutOfRange { id, n_vocab });
        }
        if let Output::Selected { tokens, .. } = &out.head {
            if let Some(&id) = tokens.iter().find(|&&id| id as usize >= n_vocab) {
                return Err(ModelError::TokenOutOfRange { id, n_vocab });
            }
        }
        let expected = out.head.len_for(batch.n_logits(), n_vocab);
        if out.head.len() != expected {
            return Err(ModelError::InvalidArgument(format!(
                "the output buffer holds {} values; this batch produces {expected}",
                out.head.len()
            )));
        }
        let expected = batch.n_hidden() * self.config.n_embd;
        if out.hidden.len() != expected {
            return Err(ModelError::InvalidArgument(format!(
                "the hidden-state buffer holds {} values; this batch produces {expected}",
                out.hidden.len()
            )));
        }
        let Scratch {
            backend: backend_scratch,
            plan,
            seqs,
        } = scratch;
        check_batch(batch, seqs)?;
        plan.build(batch, cache)?;
        let cfg = self.config;
        let draws = match &out.head {
            Output::Draw { draws, .. } => Some(*draws),
            _ => None,
        };
        let input = StepInput {
            batch,
            plan,
            heads: cfg.heads(),
            page_size: cache.layout().page_size,
            ropes: self.ropes,
            draws,
        };
        self.backend.run_step(backend_scratch, &input, |step| {
            self.layers(step, cache, batch, out)
        })?;
        Ok(())
    }

    /// The operations of one step.
    fn layers<S: Step<B>>(
        &self,
        step: &mut S,
        cache: &mut PagedKvCache,
        batch: &Batch,
        out: Outputs<'_>,
    ) -> Result<(), BackendError> {
        let (cfg, w) = (self.config, self.weights);
        let (n, d) = (batch.tokens.len(), cfg.n_embd);
        let mut x = step.rows(n, d)?;
        let mut rows = LayerRows::new(step, cfg, n)?;
        let mut q = step.rows(n, cfg.q_dim())?;
        let mut k = step.rows(n, cfg.kv_dim())?;
        let mut v = step.rows(n, cfg.kv_dim())?;
        let mut attn = step.rows(n, cfg.q_dim())?;
        let mut moe = match &cfg.experts {
            Some(e) => Some(MoeRows {
                router: step.rows(n, e.count)?,
                shared: match e.n_ff_shared {
                    Some(ff) => Some(SharedRows {
                        gate: step.rows(n, 1)?,
                        out: step.rows(n, d)?,
                        ffn: FfnRows::new(step, n, ff)?,
                    }),
                    None => None,
                },
            }),
            None => None,
        };
        let scale = if cfg.arch.embed_scale {
            (d as f32).sqrt()
        } else {
            1.0
        };
        step.embed(&w.token_embd, scale, &mut x)?;
        // Whether the last layer runs its output projection and feed-forward on the rows that
        // produce logits alone: where those are all the batch asks for and fewer than its
        // tokens (a mixture of experts routes every row of the step, so it runs them all).
        let pruned = batch.n_hidden() == 0
            && batch.n_logits() > 0
            && batch.n_logits() < n
            && cfg.experts.is_none();

        for (l, layer) in w.layers.iter().enumerate() {
            let scores = Scores {
                scale: cfg.attn_scale,
                softcap: cfg.attn_softcap,
                window: cfg.window(l),
            };
            step.rms_norm(&x, &layer.attn_norm, cfg.rms_eps, &mut rows.h)?;
            step.matmul(
                &rows.h,
                [&layer.wq, &layer.wk, &layer.wv],
                [&mut q, &mut k, &mut v],
            )?;
            for (rows, bias) in [
                (&mut q, &layer.q_bias),
                (&mut k, &layer.k_bias),
                (&mut v, &layer.v_bias),
            ] {
                if let Some(bias) = bias {
                    step.add_bias(rows, bias)?;
                }
            }
            // Per-head RMSNorm of Q and K, before RoPE.
            for (rows, gain) in [(&mut q, &layer.q_norm), (&mut k, &layer.k_norm)] {
                if let Some(gain) = gain {
                    step.rms_norm_in_place(rows, gain, cfg.rms_eps)?;
                }
            }
            let rope = rope_index(cfg, l);
            step.rope(rope, &mut q)?;
            step.rope(rope, &mut k)?;
            step.write_kv(cache, l, &mut k, &mut v)?;
            step.attention(cache, l, scores, layer.sinks.as_ref(), &mut q, &mut attn)?;

            if l + 1 == w.layers.len() && pruned {
                // Past the last attention, only the rows that produce logits are read: the
                // rest of the layer runs on those alone.
                let n_out = batch.n_logits();
                let mut attn_out = step.rows(n_out, cfg.q_dim())?;
                step.output_rows(&attn, OutputRows::Logits, &mut attn_out)?;
                let mut x_out = step.rows(n_out, d)?;
                step.output_rows(&x, OutputRows::Logits, &mut x_out)?;
                let mut out_rows = LayerRows::new(step, cfg, n_out)?;
                self.after_attention(step, layer, &attn_out, &mut x_out, &mut out_rows, &mut moe)?;
                x = x_out;
            } else {
                self.after_attention(step, layer, &attn, &mut x, &mut rows, &mut moe)?;
            }
        }

        // Only the rows that produce hidden states or logits go through the output norm, and
        // only those that produce logits through the LM head.
        let n_hidden = batch.n_hidden();
        if n_hidden > 0 {
            let normed = self.output_norm(step, &x, OutputRows::Hidden, n_hidden)?;
            step.read(&normed, out.hidden)?;
        }
        let n_logits = batch.n_logits();
        if pruned {
            let mut normed = step.rows(n_logits, d)?;
            step.rms_norm(&x, &w.output_norm, cfg.rms_eps, &mut normed)?;
            step.logits(&normed, w.output(), cfg.final_softcap, out.head)?;
        } else if n_logits > 0 {
            let normed = self.output_norm(step, &x, OutputRows::Logits, n_logits)?;
            step.logits(&normed, w.output(), cfg.final_softcap, out.head)?;
        }
        Ok(())
    }

    /// The rest of `layer` after its attention (`attn`, the heads' outputs): the output
    /// projection and the feed-forward block, each added to the residual rows `x`.
    fn after_attention<S: Step<B>>(
        &self,
        step: &mut S,
        layer: &LayerWeights<B>,
        attn: &S::Rows,
        x: &mut S::Rows,
        rows: &mut LayerRows<S::Rows>,
        moe: &mut Option<MoeRows<S::Rows>>,
    ) -> Result<(), BackendError> {
        let cfg = self.config;
        let LayerRows { h, proj, ffn } = rows;
        step.matmul(attn, [&layer.wo], [&mut *proj])?;
        if let Some(bias) = &layer.o_bias {
            step.add_bias(proj, bias)?;
        }
        if let Some(norm) = &layer.post_attn_norm {
            step.rms_norm_in_place(proj, norm, cfg.rms_eps)?;
        }
        step.add(x, proj)?;

        step.rms_norm(x, &layer.ffn_norm, cfg.rms_eps, h)?;
        self.feed_forward(step, &layer.ffn, h, ffn, moe, proj)?;
        if let Some(norm) = &layer.post_ffn_norm {
            step.rms_norm_in_place(proj, norm, cfg.rms_eps)?;
        }
        step.add(x, proj)
    }

    /// The `n` output rows `which` of `x`, after the output norm.
    fn output_norm<S: Step<B>>(
        &self,
        step: &mut S,
        x: &S::Rows,
        which: OutputRows,
        n: usize,
    ) -> Result<S::Rows, BackendError> {
        let d = self.config.n_embd;
        let mut rows = step.rows(n, d)?;
        let mut normed = step.rows(n, d)?;
        step.output_rows(x, which, &mut rows)?;
        step.rms_norm(
            &rows,
            &self.weights.output_norm,
            self.config.rms_eps,
            &mut normed,
        )?;
        Ok(normed)
    }
}

/// A layer's buffers beside its attention's: the normalized rows, a projection's output and
/// the dense feed-forward's.
struct LayerRows<R> {
    h: R,
    proj: R,
    ffn: Option<FfnRows<R>>,
}

impl<R> LayerRows<R> {
    /// Buffers for `n` rows of a model of `cfg`.
    fn new<B: Backend, S: Step<B, Rows = R>>(
        step: &mut S,
        cfg: &ModelConfig,
        n: usize,
    ) -> Result<Self, BackendError> {
        Ok(LayerRows {
            h: step.rows(n, cfg.n_embd)?,
            proj: step.rows(n, cfg.n_embd)?,
            ffn: match cfg.dense_ff() {
                Some(ff) => Some(FfnRows::new(step, n, ff)?),
                None => None,
            },
        })
    }
}

/// The buffers of a dense gated feed-forward (a layer's or a shared expert's).
struct FfnRows<R> {
    gate: R,
    up: R,
}

impl<R> FfnRows<R> {
    /// Buffers for `n` rows of a feed-forward `ff` wide.
    fn new<B: Backend, S: Step<B, Rows = R>>(
        step: &mut S,
        n: usize,
        ff: usize,
    ) -> Result<Self, BackendError> {
        Ok(FfnRows {
            gate: step.rows(n, ff)?,
            up: step.rows(n, ff)?,
        })
    }
}

/// The buffers of a mixture-of-experts block: the router's logits, and the shared expert's
/// where there is one.
struct MoeRows<R> {
    router: R,
    shared: Option<SharedRows<R>>,
}

/// The buffers of a shared expert: its sigmoid gate (one value a row), its output and its
/// feed-forward's.
struct SharedRows<R> {
    gate: R,
    out: R,
    ffn: FfnRows<R>,
}

impl<B: Backend> Forward<'_, B> {
    /// `out` = the feed-forward block of the normalized rows `h`.
    fn feed_forward<S: Step<B>>(
        &self,
        step: &mut S,
        ffn: &FeedForward<B>,
        h: &S::Rows,
        dense_rows: &mut Option<FfnRows<S::Rows>>,
        moe_rows: &mut Option<MoeRows<S::Rows>>,
        out: &mut S::Rows,
    ) -> Result<(), BackendError> {
        let activation = self.config.arch.activation;
        let missing = || BackendError::InvalidArgument("no buffers for this feed-forward".into());
        let dense = |step: &mut S, w: &Dense<B>, rows: &mut FfnRows<S::Rows>, out: &mut S::Rows| {
            let FfnRows { gate, up } = rows;
            step.matmul(h, [&w.gate, &w.up], [&mut *gate, &mut *up])?;
            step.gated(activation, gate, up)?;
            step.matmul(gate, [&w.down], [out])
        };
        let layer = match ffn {
            FeedForward::Dense(w) => {
                return dense(step, w, dense_rows.as_mut().ok_or_else(missing)?, out)
            }
            FeedForward::Experts(layer) => layer,
        };
        let (config, rows) = (
            self.config.experts.as_ref().ok_or_else(missing)?,
            moe_rows.as_mut().ok_or_else(missing)?,
        );
        let moe = Moe {
            top_k: config.used,
            routing: config.routing,
            activation,
        };
        step.matmul(h, [&layer.router], [&mut rows.router])?;
        if let Some(bias) = &layer.router_bias {
            step.add_bias(&mut rows.router, bias)?;
        }
        step.experts(h, &rows.router, &layer.experts, moe, out)?;
        if let Some((shared, gate)) = &layer.shared {
            let SharedRows {
                gate: shared_gate,
                out: shared_out,
                ffn: shared_rows,
            } = rows.shared.as_mut().ok_or_else(missing)?;
            dense(step, shared, shared_rows, shared_out)?;
            step.matmul(h, [gate], [&mut *shared_gate])?;
            step.scale_by_sigmoid(shared_out, shared_gate)?;
            step.add(out, shared_out)?;
        }
        Ok(())
    }
}

/// Checks the batch's shape: chunks tile `tokens` in order, none is empty, and no sequence
/// appears twice (`seqs` is room to sort their ids).
fn check_batch(batch: &Batch, seqs: &mut Vec<u64>) -> Result<(), ModelError> {
    let bad = |reason: String| Err(ModelError::InvalidArgument(reason));
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
    seqs.clear();
    seqs.extend(batch.chunks.iter().map(|c| c.seq.0));
    seqs.sort_unstable();
    if let Some(pair) = seqs.windows(2).find(|pair| pair[0] == pair[1]) {
        return bad(format!("sequence {} appears twice in one batch", pair[0]));
    }
    Ok(())
}
