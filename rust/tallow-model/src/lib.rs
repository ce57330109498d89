//! Transformer architectures over GGUF weights: loading, the forward pass, its KV cache and
//! sampling. Knows nothing of Python.

mod any;
mod arch;
mod config;
mod error;
mod forward;
mod ropes;
mod sampling;
mod sequence;
mod weights;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tallow_gguf::GgufFile;
use tallow_grammar::GrammarCompiler;
use tallow_tokenizer::Tokenizer;

pub use any::{AnyModel, AnyScratch};
pub use arch::{
    Activation, Architecture, GateUpTensors, QkvTensors, RopeStyle, SlidingLayers, ARCHITECTURES,
};
pub use config::{supported_architectures, ModelConfig};
pub use error::ModelError;
pub use forward::{Outputs, Scratch};
pub use sampling::{sample_batch, Reasoning, Sampled, Sampler, SamplingParams};
pub use sequence::SingleSequence;
pub use tallow_backend::{
    argmax, Backend, Batch, DeviceInfo, Draw, Logits, Output, RopeScaling, SeqChunk,
};
pub use tallow_convert::OutType;
pub use tallow_grammar::{Constraint, GrammarError, Structured};
pub use tallow_kv::{
    pages_for_budget, KvBudget, KvDtype, KvLayout, KvStats, LayerGroups, PagedKvCache, SeqId,
};

use forward::Forward;
use weights::Weights;

/// A loaded model: its file (memory-mapped), configuration, tokenizer, and weights on the
/// device of backend `B`.
pub struct Model<B: Backend> {
    backend: B,
    file: Arc<GgufFile>,
    config: ModelConfig,
    weights: Weights<B>,
    ropes: B::Ropes,
    tokenizer: Arc<Tokenizer>,
    /// Compiles constraints on outputs; built on first use (it indexes the vocabulary).
    grammar: OnceLock<Result<GrammarCompiler, GrammarError>>,
    /// How the layers share KV page tables (sliding-window layers apart).
    kv_groups: LayerGroups,
    /// The most positions a sequence may hold with the RoPE chosen at load.
    max_context: usize,
}

/// How [`Model::load`] prepares the model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadOptions {
    /// The longest context the model will run at. A model trained to stretch its context with
    /// long-context RoPE factors (Phi-3 128k) uses them when this exceeds its original
    /// training context, and its short ones otherwise; `None` means the original context.
    pub context: Option<usize>,
    /// What a Hugging Face checkpoint folder's matrices become at load (see
    /// [`tallow_convert`]); a GGUF file's are used as they are.
    pub convert: OutType,
    /// The folder a checkpoint folder's conversion is written to, as a file without a name
    /// that is gone once the model no longer reads it; `None`: the system's temporary folder.
    /// A folder on disk, not in memory (a tmpfs), keeps the peak memory of a load near the
    /// size of the model.
    pub scratch: Option<PathBuf>,
}

/// The GGUF model at `path`: the file, or a Hugging Face checkpoint folder (`config.json`,
/// `*.safetensors`, tokenizer files) converted into a file in `options.scratch`, its matrices
/// as `options.convert` says (a file's tensors are used as they are: rounding them again is
/// refused).
pub fn open_model(path: &Path, options: &LoadOptions) -> Result<GgufFile, ModelError> {
    let convert = options.convert;
    if path.is_dir() {
        let scratch = options.scratch.clone().unwrap_or_else(std::env::temp_dir);
        let file = tallow_convert::convert_to_temp_file(path, convert, &scratch)?;
        let name = format!("the conversion of {}", path.display());
        return Ok(GgufFile::from_file(&file, &name)?);
    }
    if convert != OutType::Keep {
        return Err(ModelError::InvalidArgument(format!(
            "{}: quantize applies to a checkpoint folder; a GGUF file's tensors are used as \
             they are (requantize the file with llama-quantize)",
            path.display()
        )));
    }
    Ok(GgufFile::open(path)?)
}

impl<B: Backend> Model<B> {
    /// Opens the model at `path` (a GGUF file or a checkpoint folder, see [`open_model`])
    /// and checks that it holds a model tallow can run on `backend`, then uploads its weights
    /// there.
    pub fn load(
        backend: B,
        path: impl AsRef<Path>,
        options: LoadOptions,
    ) -> Result<Self, ModelError> {
        Self::from_gguf(backend, open_model(path.as_ref(), &options)?, options)
    }

    /// [`Model::load`] of a file already open.
    pub fn from_gguf(backend: B, file: GgufFile, options: LoadOptions) -> Result<Self, ModelError> {
        let file = Arc::new(file);
        let config = ModelConfig::from_gguf(&file)?;
        backend
            .capabilities()
            .check_head_dim(config.heads().head_dim)?;
        let weights = Weights::load(&backend, &file, &config)?;
        let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
        // Everything needed from the header is parsed by now.
        file.release_header();
        let trained = config.n_ctx_train;
        let original = config.rope_original_context.min(trained);
        let context = match options.context {
            None => original,
            Some(n) if (1..=trained).contains(&n) => n,
            Some(n) => {
                return Err(ModelError::InvalidArgument(format!(
                    "n_ctx={n} is beyond the {trained} positions this model was trained with"
                )))
            }
        };
        let ropes = ropes::ropes(&config, weights.rope_factors(&config, context));
        let ropes = backend.upload_ropes(ropes)?;
        let max_context = match weights.long_rope {
            Some(_) if context <= original => original,
            _ => trained,
        };
        let windows: Vec<_> = (0..config.n_layer).map(|l| config.window(l)).collect();
        let kv_groups = LayerGroups::from_windows(&windows)?;
        Ok(Model {
            backend,
            file,
            config,
            weights,
            ropes,
            tokenizer,
            grammar: OnceLock::new(),
            kv_groups,
            max_context,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// What the model runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The most positions a sequence may hold: the training context, or the original one where
    /// the model has long-context RoPE factors and was loaded for a context within it
    /// ([`LoadOptions::context`]).
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The constraint that `structured` puts on an output of this model, compiled against its
    /// vocabulary (the first call indexes the vocabulary).
    pub fn constraint(&self, structured: &Structured) -> Result<Constraint, ModelError> {
        Ok(self.grammar_compiler()?.compile(structured)?)
    }

    /// Whether [`Model::constraint`] gives `structured` a constraint, without making one.
    pub fn check_constraint(&self, structured: &Structured) -> Result<(), ModelError> {
        Ok(self.grammar_compiler()?.check(structured)?)
    }

    /// The compiler of this model's constraints (the first call indexes the vocabulary).
    fn grammar_compiler(&self) -> Result<&GrammarCompiler, ModelError> {
        self.grammar
            .get_or_init(|| GrammarCompiler::new(Arc::clone(&self.tokenizer)))
            .as_ref()
            .map_err(|e| ModelError::Grammar(e.clone()))
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.file
    }

    /// The shape of this model's KV cache: f16 pages of 16 positions, each holding one layer
    /// group (see [`Model::kv_groups`]).
    pub fn kv_layout(&self) -> KvLayout {
        let c = &self.config;
        KvLayout::new(c.n_layer, c.n_head_kv, c.head_dim)
            .with_page_layers(self.kv_groups().page_layers())
    }

    /// How this model's layers share page tables: sliding-window layers apart from global
    /// ones, so that their pages are given back once no query sees them.
    pub fn kv_groups(&self) -> &LayerGroups {
        &self.kv_groups
    }

    /// An empty paged KV cache of `layout` (from [`Model::kv_layout`], maybe with another page
    /// size or dtype) holding as many pages as `budget` allows.
    pub fn new_kv_cache(
        &self,
        layout: KvLayout,
        budget: KvBudget,
    ) -> Result<PagedKvCache, ModelError> {
        self.check_kv_layout(&layout)?;
        self.backend.capabilities().check_kv(layout.dtype)?;
        let n_pages = pages_for_budget(&layout, budget)?;
        let pages = self.backend.new_pages(layout, &self.kv_groups, n_pages)?;
        Ok(PagedKvCache::over(self.kv_groups.clone(), pages)?)
    }

    fn check_kv_layout(&self, layout: &KvLayout) -> Result<(), ModelError> {
        let own = self.kv_layout();
        if (
            layout.n_layer,
            layout.page_layers,
            layout.n_head_kv,
            layout.head_dim,
        ) != (own.n_layer, own.page_layers, own.n_head_kv, own.head_dim)
        {
            return Err(ModelError::InvalidArgument(format!(
                "a KV cache of {} layers ({} a page) x {} heads x {} does not fit this model \
                 ({} ({}) x {} x {})",
                layout.n_layer,
                layout.page_layers,
                layout.n_head_kv,
                layout.head_dim,
                own.n_layer,
                own.page_layers,
                own.n_head_kv,
                own.head_dim
            )));
        }
        Ok(())
    }

    fn check_kv_cache(&self, cache: &PagedKvCache) -> Result<(), ModelError> {
        self.check_kv_layout(cache.layout())?;
        if cache.store::<B::Pages>().is_err() {
            return Err(ModelError::InvalidArgument(format!(
                "the KV cache's pages are not on this model's device ({})",
                self.backend.device().name
            )));
        }
        if cache.groups() != &self.kv_groups {
            return Err(ModelError::InvalidArgument(
                "the KV cache's layer groups (sliding windows) are not this model's".into(),
            ));
        }
        Ok(())
    }

    /// Runs one ragged batch (one matrix product per linear layer for all its tokens). Each
    /// chunk's tokens take the last `len` positions reserved for its sequence in `cache`
    /// ([`PagedKvCache::append_slots`]): the caller (the scheduler) decides which pages a step
    /// writes. Returns the logits the chunks ask for, `n_vocab` floats per row, chunk by chunk.
    ///
    /// Uses fresh scratch memory; an engine that steps repeatedly keeps a [`Scratch`] and calls
    /// [`Model::forward_into`] instead.
    pub fn forward(&self, cache: &mut PagedKvCache, batch: &Batch) -> Result<Vec<f32>, ModelError> {
        let mut logits = vec![0.0; batch.n_logits() * self.config.n_vocab];
        self.forward_into(
            cache,
            batch,
            &mut Scratch::new(),
            Output::Logits(&mut logits).into(),
        )?;
        Ok(logits)
    }

    /// [`Model::forward`] writing its result to `out` (exactly `batch.n_logits() * n_vocab`
    /// logits, or `batch.n_logits()` greedy tokens, and `batch.n_hidden() * n_embd` floats of
    /// hidden states for the chunks that ask for them) and taking every intermediate buffer from
    /// `scratch`. Once `scratch` has served a batch of this shape (tokens per chunk, sequence
    /// lengths no longer than before), the call makes no heap allocation on the CPU.
    pub fn forward_into(
        &self,
        cache: &mut PagedKvCache,
        batch: &Batch,
        scratch: &mut Scratch<B>,
        out: Outputs<'_>,
    ) -> Result<(), ModelError> {
        self.check_kv_cache(cache)?;
        let forward = Forward {
            backend: &self.backend,
            config: &self.config,
            weights: &self.weights,
            ropes: &self.ropes,
        };
        forward.run(cache, batch, scratch, out)
    }
}
