//! The vocabulary's metadata, as llama.cpp's converter writes it: tokens, scores and types from
//! SentencePiece's `tokenizer.model`, the tokens `tokenizer_config.json` adds, the special
//! tokens' ids, whether BOS and EOS are added, and the chat template.

use std::path::Path;

use serde_json::{Map, Value as Json};
use tallow_gguf::{Array, Strings, Value};

use crate::config::{read_json, Config};
use crate::sentencepiece::{self, PieceType};
use crate::ConvertError;

/// GGUF's token types (llama.cpp's `llama_token_type`).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// The tokenizer metadata of the checkpoint in `dir`; `space_prefix` false writes
/// `add_space_prefix` false (Gemma's vocabulary).
pub fn metadata(
    dir: &Path,
    config: &Config,
    space_prefix: bool,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let tokenizer_config = match dir.join("tokenizer_config.json") {
        path if path.exists() => match read_json(&path)? {
            Json::Object(map) => map,
            _ => return Err(bad("tokenizer_config.json", "not a JSON object")),
        },
        _ => Map::new(),
    };
    let model = dir.join("tokenizer.model");
    if !model.exists() {
        return Err(bad(
            "tokenizer.model",
            if dir.join("tokenizer.json").exists() {
                "missing: a vocabulary in tokenizer.json alone is not converted yet"
            } else {
                "missing (no tokenizer.model in the folder)"
            },
        ));
    }
    let vocab = sentencepiece_vocab(&model, config, &tokenizer_config)?;
    let mut out = vec![
        key("model", Value::String("llama".into())),
        key("pre", Value::String("default".into())),
    ];
    let mut tokens = Strings::with_capacity(vocab.tokens.len());
    for t in &vocab.tokens {
        tokens.push(t);
    }
    out.push(key("tokens", Value::Array(Array::String(tokens))));
    out.push(key("scores", Value::Array(Array::F32(vocab.scores))));
    out.push(key("token_type", Value::Array(Array::I32(vocab.types))));
    for (name, id) in special_ids(config)? {
        out.push(key(&format!("{name}_token_id"), Value::U32(id)));
    }
    for flag in ["add_bos_token", "add_eos_token"] {
        if let Some(value) = tokenizer_config.get(flag).and_then(Json::as_bool) {
            out.push(key(flag, Value::Bool(value)));
        }
    }
    if !space_prefix {
        out.push(key("add_space_prefix", Value::Bool(false)));
    }
    out.extend(chat_templates(dir, &tokenizer_config)?);
    Ok(out)
}

fn key(name: &str, value: Value) -> (String, Value) {
    (format!("tokenizer.ggml.{name}"), value)
}

fn bad(file: &str, reason: &str) -> ConvertError {
    ConvertError::Tokenizer {
        file: file.into(),
        reason: reason.into(),
    }
}

struct Vocab {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
}

/// A SentencePiece vocabulary as long as the model's embedding (`vocab_size`; ids past the
/// pieces are `[PADn]`, unused), with the tokens `tokenizer_config.json` adds.
fn sentencepiece_vocab(
    path: &Path,
    config: &Config,
    tokenizer_config: &Map<String, Json>,
) -> Result<Vocab, ConvertError> {
    let bytes = std::fs::read(path).map_err(|source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let pieces = sentencepiece::pieces(&bytes)?;
    let n = config
        .uint(&["vocab_size"])?
        .map_or(pieces.len(), |n| n as usize);
    let mut vocab = Vocab {
        tokens: (0..n).map(|i| format!("[PAD{i}]")).collect(),
        scores: vec![-10_000.0; n],
        types: vec![UNUSED; n],
    };
    for (id, piece) in pieces.into_iter().enumerate().take(n) {
        vocab.types[id] = match piece.kind {
            PieceType::Unknown => UNKNOWN,
            PieceType::Control => CONTROL,
            PieceType::Unused => UNUSED,
            PieceType::Byte => BYTE,
            PieceType::Normal | PieceType::UserDefined => NORMAL,
        };
        vocab.tokens[id] = piece.text;
        vocab.scores[id] = piece.score;
    }
    let added = tokenizer_config
        .get("added_tokens_decoder")
        .and_then(Json::as_object);
    for (id, token) in added.into_iter().flatten() {
        let (Ok(id), Some(content)) = (
            id.parse::<usize>(),
            token.get("content").and_then(Json::as_str),
        ) else {
            return Err(bad(
                "tokenizer_config.json",
                "added_tokens_decoder maps ids to {\"content\": ...}",
            ));
        };
        if id >= n {
            continue;
        }
        let special = token
            .get("special")
            .and_then(Json::as_bool)
            .unwrap_or(false);
        if special || looks_special(content) {
            vocab.types[id] = CONTROL;
            vocab.tokens[id] = content.to_owned();
        } else {
            // User-defined tokens are matched in text before SentencePiece's spaces.
            vocab.types[id] = USER_DEFINED;
            vocab.tokens[id] = content.replace('\u{2581}', " ");
        }
        vocab.scores[id] = -1000.0;
    }
    Ok(vocab)
}

/// Whether an added token's text looks like a control token's (llama.cpp's
/// `does_token_look_special`).
fn looks_special(text: &str) -> bool {
    matches!(text, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (text.starts_with("<|") && text.ends_with("|>"))
        || (text.starts_with("<\u{ff5c}") && text.ends_with("\u{ff5c}>"))
        || (text.starts_with("<unused") && text.ends_with('>'))
}

/// The special tokens' ids that `config.json` gives, under GGUF's names.
fn special_ids(config: &Config) -> Result<Vec<(&'static str, u32)>, ConvertError> {
    let mut out = Vec::new();
    for (hf, gguf) in [
        ("bos_token_id", "bos"),
        ("eos_token_id", "eos"),
        ("unk_token_id", "unknown"),
        ("sep_token_id", "seperator"),
        ("pad_token_id", "padding"),
    ] {
        // A list (several end-of-generation ids) names none here, as in llama.cpp.
        let Some(id) = config.get(hf).and_then(Json::as_u64) else {
            continue;
        };
        let id =
            u32::try_from(id).map_err(|_| config.error(format!("{hf} {id} is out of range")))?;
        out.push((gguf, id));
    }
    Ok(out)
}

/// The chat template: `tokenizer_config.json`'s (one, or a list of named ones: the default
/// and `tokenizer.chat_template.<name>` for the others), else `chat_template.jinja`'s.
fn chat_templates(
    dir: &Path,
    tokenizer_config: &Map<String, Json>,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let template = |name: &str, text: &str| {
        let key = if name == "default" {
            "tokenizer.chat_template".to_owned()
        } else {
            format!("tokenizer.chat_template.{name}")
        };
        (key, Value::String(text.to_owned()))
    };
    match tokenizer_config.get("chat_template") {
        Some(Json::String(text)) => return Ok(vec![template("default", text)]),
        Some(Json::Array(named)) => {
            return named
                .iter()
                .map(|entry| {
                    match (
                        entry.get("name").and_then(Json::as_str),
                        entry.get("template").and_then(Json::as_str),
                    ) {
                        (Some(name), Some(text)) => Ok(template(name, text)),
                        _ => Err(bad(
                            "tokenizer_config.json",
                            "chat_template lists {\"name\", \"template\"} objects",
                        )),
                    }
                })
                .collect();
        }
        _ => {}
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        let text = std::fs::read_to_string(&jinja).map_err(|source| ConvertError::Io {
            path: jinja.clone(),
            source,
        })?;
        return Ok(vec![template("default", &text)]);
    }
    Ok(Vec::new())
}
