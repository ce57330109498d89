//! The vocabulary's metadata, as llama.cpp's converter writes it: tokens, scores and types from
//! SentencePiece's `tokenizer.model`, the tokens `tokenizer_config.json` adds, the special
//! tokens' ids, whether BOS and EOS are added, and the chat template.

use std::path::Path;

use serde_json::{Map, Value as Json};
use tallow_gguf::{Array, Strings, Value};

use crate::config::{read_json, Config};
use crate::sentencepiece::{self, PieceType};
use crate::ConvertError;
use tallow_tokenizer::TokenType;

/// GGUF's token types, as `tokenizer.ggml.token_type` holds them.
const NORMAL: i32 = TokenType::Normal as i32;
const UNKNOWN: i32 = TokenType::Unknown as i32;
const CONTROL: i32 = TokenType::Control as i32;
const USER_DEFINED: i32 = TokenType::UserDefined as i32;
const UNUSED: i32 = TokenType::Unused as i32;
const BYTE: i32 = TokenType::Byte as i32;

/// The tokenizer metadata of the checkpoint in `dir`: its vocabulary from `tokenizer.model`
/// (SentencePiece) where the folder has one, else from `tokenizer.json` (byte-level BPE);
/// `space_prefix` false writes `add_space_prefix` false (Gemma's vocabulary).
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
    let tokenizer_json = match dir.join("tokenizer.json") {
        path if path.exists() => Some(read_json(&path)?),
        _ => None,
    };
    let added = tokenizer_json
        .as_ref()
        .map(added_tokens)
        .transpose()?
        .unwrap_or_default();
    let model = dir.join("tokenizer.model");
    let (mut out, n_vocab) = if model.exists() {
        let vocab = sentencepiece_vocab(&model, config, &tokenizer_config)?;
        let n = vocab.tokens.len();
        let mut out = vec![
            key("model", Value::String("llama".into())),
            key("pre", Value::String("default".into())),
            key("tokens", strings(&vocab.tokens)),
            key("scores", Value::Array(Array::F32(vocab.scores))),
            key("token_type", Value::Array(Array::I32(vocab.types))),
        ];
        if !space_prefix {
            out.push(key("add_space_prefix", Value::Bool(false)));
        }
        (out, n)
    } else if let Some(json) = &tokenizer_json {
        let bpe = bpe_vocab(json, config, &added)?;
        let n = bpe.vocab.tokens.len();
        let out = vec![
            key("model", Value::String("gpt2".into())),
            key("pre", Value::String(bpe.pre.into())),
            key("tokens", strings(&bpe.vocab.tokens)),
            key("token_type", Value::Array(Array::I32(bpe.vocab.types))),
            key("merges", strings(&bpe.merges)),
        ];
        (out, n)
    } else {
        return Err(bad(
            "tokenizer.model",
            "the folder has neither tokenizer.model nor tokenizer.json",
        ));
    };
    out.extend(special_tokens(config, &tokenizer_config, &added, n_vocab)?);
    out.extend(chat_templates(dir, &tokenizer_config)?);
    Ok(out)
}

fn strings(list: &[String]) -> Value {
    let mut out = Strings::with_capacity(list.len());
    for s in list {
        out.push(s);
    }
    Value::Array(Array::String(out))
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

/// The special tokens, as llama.cpp's `SpecialVocab` reads them: each type's id from
/// `tokenizer_config.json`'s `<type>_token` found among `tokenizer.json`'s added tokens, else
/// from `config.json`'s `<type>_token_id` (an id past the vocabulary, or a list of ids, names
/// none), and `add_<type>_token` where `tokenizer_config.json` says.
fn special_tokens(
    config: &Config,
    tokenizer_config: &Map<String, Json>,
    added: &[Added],
    n_vocab: usize,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let mut ids = Vec::new();
    let mut flags = Vec::new();
    for (hf, gguf) in [
        ("bos", "bos"),
        ("eos", "eos"),
        ("unk", "unknown"),
        ("sep", "seperator"),
        ("pad", "padding"),
        ("cls", "cls"),
        ("mask", "mask"),
    ] {
        if let Some(flag) = tokenizer_config
            .get(&format!("add_{hf}_token"))
            .and_then(Json::as_bool)
        {
            flags.push(key(&format!("add_{hf}_token"), Value::Bool(flag)));
        }
        let content = match tokenizer_config.get(&format!("{hf}_token")) {
            Some(Json::String(text)) => Some(text.as_str()),
            Some(Json::Object(entry)) => entry.get("content").and_then(Json::as_str),
            _ => None,
        };
        let by_content = content.and_then(|c| added.iter().find(|a| a.content == c).map(|a| a.id));
        let by_config = config
            .get(&format!("{hf}_token_id"))
            .and_then(Json::as_u64)
            .filter(|&id| id < n_vocab as u64);
        if let Some(id) = by_content.or(by_config) {
            let id = u32::try_from(id)
                .map_err(|_| config.error(format!("{hf} id {id} is out of range")))?;
            ids.push(key(&format!("{gguf}_token_id"), Value::U32(id)));
        }
    }
    ids.extend(flags);
    Ok(ids)
}

/// One of `tokenizer.json`'s added tokens.
#[derive(Debug, Clone)]
struct Added {
    id: u64,
    content: String,
    special: bool,
}

fn added_tokens(json: &Json) -> Result<Vec<Added>, ConvertError> {
    let Some(list) = json.get("added_tokens") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| bad("tokenizer.json", "added_tokens is not a list"))?;
    list.iter()
        .map(|t| {
            match (
                t.get("id").and_then(Json::as_u64),
                t.get("content").and_then(Json::as_str),
            ) {
                (Some(id), Some(content)) => Ok(Added {
                    id,
                    content: content.to_owned(),
                    special: t.get("special").and_then(Json::as_bool).unwrap_or(false),
                }),
                _ => Err(bad(
                    "tokenizer.json",
                    "an added token without its id and content",
                )),
            }
        })
        .collect()
}

/// A byte-level BPE vocabulary, its merges, and the pre-tokenizer's GGUF name.
struct Bpe {
    vocab: Vocab,
    merges: Vec<String>,
    pre: &'static str,
}

/// `tokenizer.json`'s byte-level BPE: the tokens by id (ids no token has are `[PADn]`,
/// unused), added tokens as control tokens (special, or looking it) or user-defined ones.
fn bpe_vocab(json: &Json, config: &Config, added: &[Added]) -> Result<Bpe, ConvertError> {
    let model = json
        .get("model")
        .ok_or_else(|| bad("tokenizer.json", "no model"))?;
    if model.get("type").and_then(Json::as_str) != Some("BPE") {
        return Err(bad(
            "tokenizer.json",
            "the model is not BPE (only byte-level BPE vocabularies are converted)",
        ));
    }
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or_else(|| bad("tokenizer.json", "no vocab"))?;
    let mut by_id: Vec<Option<(&str, i32)>> = Vec::new();
    fn put<'a>(
        by_id: &mut Vec<Option<(&'a str, i32)>>,
        id: u64,
        token: &'a str,
        kind: i32,
    ) -> Result<(), ConvertError> {
        let id = usize::try_from(id)
            .ok()
            .filter(|&id| id < 1 << 24)
            .ok_or_else(|| bad("tokenizer.json", "a token id past 16M"))?;
        if by_id.len() <= id {
            by_id.resize(id + 1, None);
        }
        by_id[id] = Some((token, kind));
        Ok(())
    }
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad("tokenizer.json", "a vocab id that is not a whole number"))?;
        put(&mut by_id, id, token, NORMAL)?;
    }
    for a in added {
        let kind = if a.special || looks_special(&a.content) {
            CONTROL
        } else {
            USER_DEFINED
        };
        put(&mut by_id, a.id, &a.content, kind)?;
    }
    let n = config
        .uint(&["vocab_size"])?
        .map_or(by_id.len(), |n| n as usize);
    let mut out = Vocab {
        tokens: Vec::with_capacity(n),
        scores: Vec::new(),
        types: Vec::with_capacity(n),
    };
    for id in 0..n {
        match by_id.get(id).copied().flatten() {
            Some((token, USER_DEFINED)) => {
                out.tokens.push(token.replace('\u{2581}', " "));
                out.types.push(USER_DEFINED);
            }
            Some((token, kind)) => {
                out.tokens.push(token.to_owned());
                out.types.push(kind);
            }
            None => {
                out.tokens.push(format!("[PAD{id}]"));
                out.types.push(UNUSED);
            }
        }
    }
    let merges = model
        .get("merges")
        .and_then(Json::as_array)
        .ok_or_else(|| bad("tokenizer.json", "no merges"))?
        .iter()
        .map(merge)
        .collect::<Result<Vec<_>, _>>()?;
    let pre = pre_tokenizer(json.get("pre_tokenizer").unwrap_or(&Json::Null))?;
    Ok(Bpe {
        vocab: out,
        merges,
        pre,
    })
}

/// A merge as GGUF writes it, `"a b"`: from the same string, or from a pair (whose spaces, if
/// a token had any, become GPT-2's `Ġ` as llama.cpp writes them).
fn merge(entry: &Json) -> Result<String, ConvertError> {
    match entry {
        Json::String(text) => Ok(text.clone()),
        Json::Array(pair) if pair.len() == 2 => {
            let parts: Option<Vec<String>> = pair
                .iter()
                .map(|p| p.as_str().map(|s| s.replace(' ', "\u{120}")))
                .collect();
            parts
                .map(|p| p.join(" "))
                .ok_or_else(|| bad("tokenizer.json", "a merge that is not two strings"))
        }
        _ => Err(bad(
            "tokenizer.json",
            "a merge that is neither \"a b\" nor [a, b]",
        )),
    }
}

/// The Llama 3 and Qwen 2 splitting regexes, as `tokenizer.json` spells them.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The GGUF name (`tokenizer.ggml.pre`) of a `tokenizer.json` pre-tokenizer that tallow's
/// tokenizer runs: GPT-2's byte-level split, SmolLM's (digits apart first), Llama 3's and
/// Qwen 2's regexes. llama.cpp names them by hashing what HF `tokenizers` makes of a text;
/// these are the names it gives these four.
fn pre_tokenizer(json: &Json) -> Result<&'static str, ConvertError> {
    let kind = |j: &Json| {
        j.get("type")
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let byte_level = |j: &Json, regex: bool| {
        kind(j) == "ByteLevel"
            && j.get("use_regex").and_then(Json::as_bool).unwrap_or(true) == regex
    };
    if byte_level(json, true) {
        return Ok("gpt-2");
    }
    let steps = match json.get("pretokenizers").and_then(Json::as_array) {
        Some(steps) if kind(json) == "Sequence" => steps.as_slice(),
        _ => &[],
    };
    if let [first, second] = steps {
        if kind(first) == "Digits"
            && first.get("individual_digits").and_then(Json::as_bool) == Some(true)
            && byte_level(second, true)
        {
            return Ok("smollm");
        }
        let regex = first
            .get("pattern")
            .and_then(|p| p.get("Regex"))
            .and_then(Json::as_str);
        if kind(first) == "Split" && byte_level(second, false) {
            match regex {
                Some(LLAMA3_REGEX) => return Ok("llama-bpe"),
                Some(QWEN2_REGEX) => return Ok("qwen2"),
                _ => {}
            }
        }
    }
    Err(bad(
        "tokenizer.json",
        "its pre-tokenizer is not one tallow runs (GPT-2's, SmolLM's, Llama 3's or Qwen 2's)",
    ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use tallow_gguf::GgufFile;

    #[test]
    fn tokenizer_json_vocabularies_equal_llama_cpp_s() {
        let shared = std::env::var_os("TALLOW_SHARED_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
        for arch in ["qwen2moe", "qwen3moe", "gpt-oss"] {
            let dir = shared.join("reference/arch").join(arch);
            let config = Config::read(&dir.join("hf/config.json")).unwrap();
            let ours = metadata(&dir.join("hf"), &config, true).unwrap();
            let theirs = GgufFile::open(dir.join(format!("{arch}-f32.gguf"))).unwrap();
            let tokenizer: Vec<_> = theirs
                .metadata()
                .iter()
                .filter(|(k, _)| k.starts_with("tokenizer."))
                .collect();
            assert!(tokenizer.len() >= 6, "{arch}");
            for (key, value) in tokenizer {
                let got = ours.iter().find(|(k, _)| k == key).map(|(_, v)| v);
                assert_eq!(got, Some(value), "{arch}: {key}");
            }
            assert_eq!(
                ours.len(),
                theirs
                    .metadata()
                    .iter()
                    .filter(|(k, _)| k.starts_with("tokenizer."))
                    .count(),
                "{arch}"
            );
        }
    }

    #[test]
    fn pre_tokenizers_are_named_as_llama_cpp_names_them() {
        let split = |regex: &str| {
            serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated"},
                {"type": "ByteLevel", "use_regex": false}]})
        };
        assert_eq!(pre_tokenizer(&split(LLAMA3_REGEX)).unwrap(), "llama-bpe");
        assert_eq!(pre_tokenizer(&split(QWEN2_REGEX)).unwrap(), "qwen2");
        let gpt2 = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false});
        assert_eq!(pre_tokenizer(&gpt2).unwrap(), "gpt-2");
        let smollm = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, {"type": "ByteLevel", "use_regex": true}]});
        assert_eq!(pre_tokenizer(&smollm).unwrap(), "smollm");
        assert!(pre_tokenizer(&split("\\p{L}+")).is_err());
        assert_eq!(
            merge(&serde_json::json!(["a b", "c"])).unwrap(),
            "a\u{120}b c"
        );
    }
}
