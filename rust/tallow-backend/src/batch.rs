//! A ragged batch: the new tokens of several sequences, flattened into one forward call.

use std::ops::Range;

use tallow_kv::{PageId, SeqId};

/// Which positions of a sequence's chunk produce logits (or, for a chunk that asks for hidden
/// states, which produce those instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (a prompt chunk that is not the last one).
    None,
    /// Only the chunk's last token (generation).
    Last,
    /// Every token of the chunk (perplexity, verification of proposed tokens).
    All,
}

/// The tokens one sequence adds in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqChunk {
    pub seq: SeqId,
    /// Offset of the chunk's first token in [`Batch::tokens`].
    pub start: usize,
    pub len: usize,
    pub logits: Logits,
    /// The sequence this one was forked from for this batch (see [`Batch::push_branch`]).
    pub branch_of: Option<SeqId>,
    /// Whether the rows [`SeqChunk::logits`] selects give their final hidden states (after the
    /// output norm, what embeddings pool) instead of logits (see [`Batch::push_hidden`]).
    pub hidden: bool,
}

impl SeqChunk {
    /// The rows of the batch (its tokens) that [`SeqChunk::logits`] selects.
    fn selected_rows(&self) -> Range<usize> {
        let end = self.start + self.len;
        match self.logits {
            Logits::None => end..end,
            Logits::Last => end - 1..end,
            Logits::All => self.start..end,
        }
    }

    /// The rows of the batch (its tokens) whose logits this chunk produces.
    pub fn logit_rows(&self) -> Range<usize> {
        if self.hidden {
            self.start..self.start
        } else {
            self.selected_rows()
        }
    }

    /// The rows of the batch whose final hidden states this chunk produces.
    pub fn hidden_rows(&self) -> Range<usize> {
        if self.hidden {
            self.selected_rows()
        } else {
            self.start..self.start
        }
    }

    /// Rows of logits this chunk produces.
    pub fn n_logits(&self) -> usize {
        self.logit_rows().len()
    }

    /// Rows of hidden states this chunk produces.
    pub fn n_hidden(&self) -> usize {
        self.hidden_rows().len()
    }
}

/// Positions `0..len` of page `src` copied to page `dst` in one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCopy {
    pub src: PageId,
    pub dst: PageId,
    pub len: usize,
}

/// The flattened tokens of several sequences (each at most once), with per-sequence chunks.
/// Prompt chunks and single decode tokens mix freely.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub chunks: Vec<SeqChunk>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tokens` as the next positions of `seq`.
    pub fn push(&mut self, seq: SeqId, tokens: &[u32], logits: Logits) -> &mut Self {
        self.push_chunk(seq, tokens, logits, None, false)
    }

    /// Adds `tokens` as the next positions of `seq`, the rows `rows` selects giving their final
    /// hidden states (after the output norm, `n_embd` values a row) instead of logits: what an
    /// embedding pools. No LM head runs for them.
    pub fn push_hidden(&mut self, seq: SeqId, tokens: &[u32], rows: Logits) -> &mut Self {
        self.push_chunk(seq, tokens, rows, None, true)
    }

    /// Adds `tokens` as the next positions of `seq`, a fork of `parent` made after `parent`
    /// reserved the positions it computes in this batch: the positions of `parent` that share
    /// the page `seq`'s first new token goes to (a copy-on-write copy that could not yet
    /// hold them) are copied into `seq`'s page layer by layer, once `parent` has written
    /// them. Several branches of one parent (each a continuation of the same text) are so
    /// computed in the same forward as the text itself.
    pub fn push_branch(
        &mut self,
        seq: SeqId,
        parent: SeqId,
        tokens: &[u32],
        logits: Logits,
    ) -> &mut Self {
        self.push_chunk(seq, tokens, logits, Some(parent), false)
    }

    fn push_chunk(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        logits: Logits,
        branch_of: Option<SeqId>,
        hidden: bool,
    ) -> &mut Self {
        self.chunks.push(SeqChunk {
            seq,
            start: self.tokens.len(),
            len: tokens.len(),
            logits,
            branch_of,
            hidden,
        });
        self.tokens.extend_from_slice(tokens);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Removes every chunk, keeping the buffers' capacity for the next step.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.chunks.clear();
    }

    /// Whether a branch in this batch was forked from `seq`.
    pub fn is_parent(&self, seq: SeqId) -> bool {
        self.chunks.iter().any(|c| c.branch_of == Some(seq))
    }

    /// Rows of logits the batch produces, in chunk order.
    pub fn n_logits(&self) -> usize {
        self.chunks.iter().map(SeqChunk::n_logits).sum()
    }

    /// Rows of hidden states the batch produces, in chunk order.
    pub fn n_hidden(&self) -> usize {
        self.chunks.iter().map(SeqChunk::n_hidden).sum()
    }
}
