//! The key/value cache of one sequence.

use crate::config::ModelConfig;

/// Keys and values of every layer for the positions a sequence has seen so far. Memory grows
/// with the positions actually used, up to `n_ctx`.
pub struct KvCache {
    n_ctx: usize,
    kv_dim: usize,
    len: usize,
    /// Per layer: `len` rows of `kv_dim` keys (all KV heads side by side).
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(config: &ModelConfig, n_ctx: usize) -> Self {
        KvCache {
            n_ctx,
            kv_dim: config.kv_dim(),
            len: 0,
            keys: vec![Vec::new(); config.n_layer],
            values: vec![Vec::new(); config.n_layer],
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

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        for layer in self.keys.iter_mut().chain(self.values.iter_mut()) {
            layer.truncate(self.len * self.kv_dim);
        }
    }

    /// Appends the keys and values of `n` new positions to `layer`. Every layer must receive
    /// the same positions before [`KvCache::commit`].
    pub(crate) fn append(&mut self, layer: usize, keys: &[f32], values: &[f32]) {
        debug_assert_eq!(keys.len(), values.len());
        debug_assert_eq!(self.keys[layer].len(), self.len * self.kv_dim);
        self.keys[layer].extend_from_slice(keys);
        self.values[layer].extend_from_slice(values);
    }

    /// Makes the positions appended to every layer part of the sequence.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Keys and values of `layer` for all positions appended so far, committed or not.
    pub(crate) fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.keys[layer], &self.values[layer])
    }
}
