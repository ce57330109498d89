//! Errors of model loading and inference.

use tallow_backend::BackendError;
use tallow_convert::ConvertError;
use tallow_gguf::GgufError;
use tallow_grammar::GrammarError;
use tallow_kv::KvError;
use tallow_quant::QuantError;
use tallow_tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A Hugging Face checkpoint folder that cannot be converted.
    #[error(transparent)]
    Convert(#[from] ConvertError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A constraint on the output cannot be compiled, or failed while generating.
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    #[error("unknown architecture '{0}' (supported: {supported})", supported = crate::config::supported_architectures().join(", "))]
    UnknownArchitecture(String),
    #[error("not supported yet: {0}")]
    Unsupported(String),
    #[error("metadata key '{0}' is missing")]
    MissingMetadata(String),
    #[error("metadata key '{key}' has an invalid value: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error("tensor '{0}' is missing")]
    MissingTensor(String),
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("{needed} positions do not fit the context of {n_ctx} ({used} already used)")]
    ContextOverflow {
        needed: usize,
        used: usize,
        n_ctx: usize,
    },
    #[error("token id {id} is out of range (vocabulary size {n_vocab})")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device the model runs on failed, or is not there.
    #[error("device error: {0}")]
    Device(String),
}

impl From<BackendError> for ModelError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::Gguf(e) => ModelError::Gguf(e),
            BackendError::Quant(e) => ModelError::Quant(e),
            BackendError::Kv(e) => ModelError::Kv(e),
            BackendError::Unsupported(what) => ModelError::Unsupported(what),
            BackendError::InvalidArgument(what) => ModelError::InvalidArgument(what),
            BackendError::Device(what) => ModelError::Device(what),
        }
    }
}
