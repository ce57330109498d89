//! The key/value cache of one sequence.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::config::ModelConfig;

/// Keys and values of every layer for the positions a sequence has seen so far, stored in f16
/// (half the memory of f32, and the precision llama.cpp keeps by default). Memory grows with
/// the positions actually used, up to `n_ctx`.
///
/// Each KV head of each layer has its own contiguous run of `positions x head_dim` values, so
/// attention reads one head's history as a single slice.
pub struct KvCache {
    n_ctx: usize,
    head_dim: usize,
    len: usize,
    /// `[layer][kv_head]`: `len` rows of `head_dim` keys.
    keys: Vec<Vec<Vec<f16>>>,
    values: Vec<Vec<Vec<f16>>>,
}

impl KvCache {
    pub fn new(config: &ModelConfig, n_ctx: usize) -> Self {
        let empty = vec![vec![Vec::new(); config.n_head_kv]; config.n_layer];
        KvCache {
            n_ctx,
            head_dim: config.head_dim,
            len: 0,
            keys: empty.clone(),
            values: empty,
        }
    }

    /// Maximum number of positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Positions stored so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position; memory is kept for reuse.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Keeps the first `len` positions (and drops anything appended but not committed).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        let keep = self.len * self.head_dim;
        for head in self.keys.iter_mut().chain(self.values.iter_mut()).flatten() {
            head.truncate(keep);
        }
    }

    /// Appends the keys and values of new positions to `layer`: `keys` and `values` hold one
    /// row of `n_head_kv * head_dim` values per position. Every layer must receive the same
    /// positions before [`KvCache::commit`].
    pub(crate) fn append(&mut self, layer: usize, keys: &[f32], values: &[f32]) {
        debug_assert_eq!(keys.len(), values.len());
        let (hd, n_heads) = (self.head_dim, self.keys[layer].len());
        for (src, dst) in [
            (keys, &mut self.keys[layer]),
            (values, &mut self.values[layer]),
        ] {
            for row in src.chunks_exact(hd * n_heads) {
                for (head, part) in dst.iter_mut().zip(row.chunks_exact(hd)) {
                    let start = head.len();
                    head.resize(start + hd, f16::ZERO);
                    head[start..].convert_from_f32_slice(part);
                }
            }
        }
    }

    /// Makes the positions appended to every layer part of the sequence.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Keys and values of one KV head of `layer` for the first `n_pos` positions (committed or
    /// appended), converted to f32 into `keys` and `values`.
    pub(crate) fn read_head(
        &self,
        layer: usize,
        kv_head: usize,
        n_pos: usize,
        keys: &mut Vec<f32>,
        values: &mut Vec<f32>,
    ) {
        let n = n_pos * self.head_dim;
        for (src, dst) in [(&self.keys, keys), (&self.values, values)] {
            dst.resize(n, 0.0);
            src[layer][kv_head][..n].convert_to_f32_slice(dst);
        }
    }
}
