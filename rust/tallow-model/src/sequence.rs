//! One sequence with a KV cache of its own: the simplest way to run a model (perplexity,
//! one-request generation), built on the same batched forward and paged cache as the engine.

use tallow_backend::{Batch, Logits, Output};
use tallow_kv::{KvBudget, PagedKvCache, SeqId};

use crate::any::{AnyModel, AnyScratch};
use crate::error::ModelError;

pub struct SingleSequence {
    cache: PagedKvCache,
    seq: SeqId,
    n_ctx: usize,
    scratch: AnyScratch,
}

impl SingleSequence {
    /// A sequence of at most `n_ctx` positions, with exactly the pages that many need, on
    /// `model`'s device.
    pub fn new(model: &dyn AnyModel, n_ctx: usize) -> Result<Self, ModelError> {
        let max = model.max_context();
        if !(1..=max).contains(&n_ctx) {
            return Err(ModelError::InvalidArgument(format!(
                "n_ctx must be from 1 to {max} (the context this model was loaded for), not {n_ctx}"
            )));
        }
        let layout = model.kv_layout();
        // Any number of the positions may come in one evaluation.
        let pages = model
            .kv_groups()
            .pages_to_hold(n_ctx, n_ctx, layout.page_size);
        let mut cache = model.new_kv_cache(layout, KvBudget::Pages(pages))?;
        let seq = cache.create();
        Ok(SingleSequence {
            cache,
            seq,
            n_ctx,
            scratch: AnyScratch::new(),
        })
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Positions evaluated so far.
    pub fn len(&self) -> usize {
        // The sequence is created with the cache and never freed.
        self.cache.seq_len(self.seq).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Evaluates `tokens` at the next positions; returns the logits `logits` asks for.
    pub fn eval(
        &mut self,
        model: &dyn AnyModel,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let used = self.len();
        if used + tokens.len() > self.n_ctx {
            return Err(ModelError::ContextOverflow {
                needed: tokens.len(),
                used,
                n_ctx: self.n_ctx,
            });
        }
        let mut batch = Batch::new();
        batch.push(self.seq, tokens, logits);
        // Every row of a long chunk over a large vocabulary can be gigabytes: an error when it
        // cannot be had, not an abort.
        let n = batch.n_logits().saturating_mul(model.config().n_vocab);
        let mut logits = Vec::new();
        logits.try_reserve_exact(n).map_err(|_| {
            ModelError::InvalidArgument(format!(
                "not enough memory for the logits of {} positions",
                batch.n_logits()
            ))
        })?;
        logits.resize(n, 0.0);
        self.cache.append_slots(self.seq, tokens.len())?;
        let result = model
            .forward_into(
                &mut self.cache,
                &batch,
                &mut self.scratch,
                Output::Logits(&mut logits).into(),
            )
            .map(|()| logits);
        if result.is_err() {
            self.truncate(used);
        }
        result
    }

    /// Keeps the first `n` positions.
    pub fn truncate(&mut self, n: usize) {
        let keep = n.min(self.len());
        // `keep` is within the sequence, so truncation cannot fail.
        let _ = self.cache.truncate(self.seq, keep);
    }

    /// Forgets every position.
    pub fn reset(&mut self) {
        self.truncate(0);
    }
}
