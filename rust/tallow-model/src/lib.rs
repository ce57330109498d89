//! Transformer architectures over GGUF weights: loading, the forward pass, its KV cache and
//! sampling. Knows nothing of Python.

mod config;
mod error;
mod forward;
mod kv_cache;
mod ops;
mod sampling;
mod weights;

use std::path::Path;

use tallow_gguf::GgufFile;
use tallow_tokenizer::Tokenizer;

pub use config::{ModelConfig, SUPPORTED_ARCHITECTURES};
pub use error::ModelError;
pub use forward::Logits;
pub use kv_cache::KvCache;
pub use sampling::{argmax, Sampler};

use forward::Forward;
use ops::Rope;
use weights::Weights;

/// A loaded model: its file (memory-mapped weights), configuration and tokenizer.
pub struct Model {
    file: GgufFile,
    config: ModelConfig,
    weights: Weights,
    rope: Rope,
    tokenizer: Tokenizer,
}

impl Model {
    /// Opens a GGUF file and checks that it holds a model tallow can run.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        Self::from_gguf(GgufFile::open(path)?)
    }

    pub fn from_gguf(file: GgufFile) -> Result<Self, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        let weights = Weights::load(&file, &config)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let rope = Rope::new(
            config.rope_base,
            config.rope_dim,
            config.head_dim,
            weights.rope_freqs.as_deref(),
        );
        Ok(Model {
            file,
            config,
            weights,
            rope,
            tokenizer,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.file
    }

    /// An empty KV cache for a sequence of at most `n_ctx` positions.
    pub fn new_cache(&self, n_ctx: usize) -> KvCache {
        KvCache::new(&self.config, n_ctx)
    }

    /// Evaluates `tokens` at the next positions of `cache`, appending them to it, and returns
    /// the logits (`n_vocab` floats per requested position).
    pub fn forward(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let forward = Forward {
            file: &self.file,
            config: &self.config,
            weights: &self.weights,
            rope: &self.rope,
        };
        let result = forward.run(cache, tokens, logits);
        if result.is_err() {
            // A failed call may have appended some layers; keep the cache consistent.
            cache.truncate(cache.len());
        }
        result
    }
}
