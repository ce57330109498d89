//! The tokenizer's inputs, read from the `tokenizer.ggml.*` metadata of a GGUF file.

use tallow_gguf::{GgufFile, Value};

use crate::TokenizerError;

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const SCORES: &str = "tokenizer.ggml.scores";
const MERGES: &str = "tokenizer.ggml.merges";
pub(crate) const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
pub(crate) const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
pub(crate) const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
pub(crate) const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
pub(crate) const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
pub(crate) const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
pub(crate) const FIM_PAD_ID: &str = "tokenizer.ggml.fim_pad_token_id";
pub(crate) const FIM_REP_ID: &str = "tokenizer.ggml.fim_rep_token_id";
pub(crate) const FIM_SEP_ID: &str = "tokenizer.ggml.fim_sep_token_id";
pub(crate) const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub(crate) const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// Everything a [`crate::Tokenizer`] is built from. `None` means "not in the metadata": the
/// tokenizer then uses llama.cpp's default for the model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenizerConfig {
    /// `gpt2` (byte-level BPE) or `llama` (SentencePiece BPE).
    pub model: String,
    /// The pre-tokenizer of a byte-level BPE model (`smollm`, `llama-bpe`, `qwen2`...).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// llama.cpp token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte);
    /// every token is normal when absent.
    pub token_types: Option<Vec<i64>>,
    /// SentencePiece merge scores; 0 for every token when absent.
    pub scores: Option<Vec<f32>>,
    /// Byte-level BPE merges `"left right"`, highest priority first.
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub fim_pad_id: Option<u32>,
    pub fim_rep_id: Option<u32>,
    pub fim_sep_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

impl TokenizerConfig {
    /// Reads the `tokenizer.ggml.*` keys. Only the model and the tokens are required here;
    /// what else a model needs (merges for `gpt2`) is checked when the tokenizer is built.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let tokens = string_array(file, TOKENS)?;
        let n = tokens.as_ref().map_or(0, Vec::len);
        Ok(Self {
            model: string(file, MODEL)?
                .ok_or(TokenizerError::MissingKey(MODEL))?
                .to_owned(),
            pre: string(file, PRE)?.map(str::to_owned),
            tokens: tokens.ok_or(TokenizerError::MissingKey(TOKENS))?,
            token_types: array(file, TOKEN_TYPE, "an integer array", |v| v.as_i64())?,
            scores: array(file, SCORES, "a number array", |v| {
                v.as_f64().map(|x| x as f32)
            })?,
            merges: string_array(file, MERGES)?.unwrap_or_default(),
            bos_id: token_id(file, BOS_ID, n)?,
            eos_id: token_id(file, EOS_ID, n)?,
            unk_id: token_id(file, UNK_ID, n)?,
            pad_id: token_id(file, PAD_ID, n)?,
            eot_id: token_id(file, EOT_ID, n)?,
            eom_id: token_id(file, EOM_ID, n)?,
            fim_pad_id: token_id(file, FIM_PAD_ID, n)?,
            fim_rep_id: token_id(file, FIM_REP_ID, n)?,
            fim_sep_id: token_id(file, FIM_SEP_ID, n)?,
            add_bos: boolean(file, ADD_BOS)?,
            add_eos: boolean(file, ADD_EOS)?,
            add_space_prefix: boolean(file, ADD_SPACE_PREFIX)?,
        })
    }
}

fn wrong_type(key: &'static str, expected: &'static str, found: &Value) -> TokenizerError {
    TokenizerError::WrongType {
        key,
        expected,
        found: found.type_name(),
    }
}

fn string<'f>(file: &'f GgufFile, key: &'static str) -> Result<Option<&'f str>, TokenizerError> {
    file.get(key)
        .map(|v| v.as_str().ok_or_else(|| wrong_type(key, "a string", v)))
        .transpose()
}

fn boolean(file: &GgufFile, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    file.get(key)
        .map(|v| v.as_bool().ok_or_else(|| wrong_type(key, "a bool", v)))
        .transpose()
}

/// A token id, which must name a token. Some converters write -1 for "none": a negative id
/// counts as absent.
fn token_id(
    file: &GgufFile,
    key: &'static str,
    vocab_size: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(value) = file.get(key) else {
        return Ok(None);
    };
    let id = match (value.as_i64(), value.as_u64()) {
        (Some(id), _) if id < 0 => return Ok(None),
        (_, Some(id)) => id,
        _ => return Err(wrong_type(key, "an integer", value)),
    };
    // Whether the id names a token is checked when the tokenizer is built.
    u32::try_from(id)
        .map(Some)
        .map_err(|_| TokenizerError::SpecialIdOutOfRange {
            key,
            id,
            vocab_size,
        })
}

fn array<T>(
    file: &GgufFile,
    key: &'static str,
    expected: &'static str,
    element: impl Fn(Value) -> Option<T>,
) -> Result<Option<Vec<T>>, TokenizerError> {
    let Some(value) = file.get(key) else {
        return Ok(None);
    };
    let items = value
        .as_array()
        .ok_or_else(|| wrong_type(key, expected, value))?;
    items
        .values()
        .enumerate()
        .map(|(index, item)| {
            let found = item.type_name();
            element(item).ok_or(TokenizerError::WrongElementType {
                key,
                index,
                expected,
                found,
            })
        })
        .collect::<Result<Vec<T>, _>>()
        .map(Some)
}

fn string_array(file: &GgufFile, key: &'static str) -> Result<Option<Vec<String>>, TokenizerError> {
    array(file, key, "a string array", |v| match v {
        Value::String(s) => Some(s),
        _ => None,
    })
}
