//! The one error type of this crate.

/// Everything that can go wrong while building a tokenizer from GGUF metadata or decoding ids.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenizerError {
    #[error("missing GGUF metadata key `{0}`")]
    MissingKey(&'static str),

    #[error("GGUF metadata key `{key}` has the wrong type: expected {expected}, found {found}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: &'static str,
    },

    #[error("GGUF metadata key `{key}`: element {index} has the wrong type: expected {expected}, found {found}")]
    WrongElementType {
        key: &'static str,
        index: usize,
        expected: &'static str,
        found: &'static str,
    },

    #[error("GGUF metadata key `{key}` has {found} entries, fewer than the {expected} tokens of the vocabulary")]
    TooFewEntries {
        key: &'static str,
        expected: usize,
        found: usize,
    },

    #[error("unknown tokenizer model `{0}` (supported: `gpt2` byte-level BPE, `llama` SentencePiece BPE)")]
    UnknownModel(String),

    #[error("unknown pre-tokenizer `{0}` for a byte-level BPE tokenizer (supported: {supported})", supported = crate::pre_tokenizer::SUPPORTED_NAMES)]
    UnknownPreTokenizer(String),

    #[error("the text holds the reserved character U+{:04X} (a Unicode noncharacter tallow uses to mark message text in chat prompts)", u32::from(*.0))]
    ReservedCharacter(char),

    #[error("the vocabulary is empty")]
    EmptyVocabulary,

    #[error("the vocabulary has {0} tokens, more than token ids can address")]
    VocabularyTooLarge(usize),

    #[error("duplicate token {text:?} in the vocabulary: ids {first} and {second}")]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },

    #[error("bad merge #{index} {merge:?}: {reason}")]
    BadMerge {
        index: usize,
        merge: String,
        reason: &'static str,
    },

    #[error("byte token {id} {text:?} is not of the form <0xXX>")]
    BadByteToken { id: u32, text: String },

    #[error("`{key}` = {id} is out of range for a vocabulary of {vocab_size} tokens")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: u64,
        vocab_size: usize,
    },

    #[error("`{flag}` is true but the model has no `{id_key}`")]
    MissingSpecialToken {
        flag: &'static str,
        id_key: &'static str,
    },

    #[error("token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    IdOutOfRange { id: u32, vocab_size: usize },
}
