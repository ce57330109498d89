//! Tokenizers built from GGUF `tokenizer.ggml.*` metadata, giving the same ids as llama.cpp
//! (and HF `tokenizers` for byte-level BPE vocabularies).
//!
//! Two models are supported:
//! - byte-level BPE (`gpt2`: GPT-2, SmolLM, Llama 3, Qwen 2...), with the pre-tokenizer named by
//!   `tokenizer.ggml.pre`;
//! - SentencePiece BPE (`llama`: Llama 2, Gemma...), with scores and byte fallback.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = tallow_gguf::GgufFile::open("model.gguf")?;
//! let tokenizer = tallow_tokenizer::Tokenizer::from_gguf(&file)?;
//! let ids = tokenizer.encode("Hello world", true, false);
//! assert_eq!(tokenizer.decode(&ids)?, "Hello world");
//! # Ok(()) }
//! ```

mod byte_level;
mod byte_level_bpe;
mod config;
mod end_of_generation;
mod error;
mod pre_tokenizer;
mod sentencepiece_bpe;
mod special_tokens;
mod stream;
mod unicode_class;
mod vocab;

use std::borrow::Cow;
use std::ops::Range;

pub use config::TokenizerConfig;
pub use error::TokenizerError;
pub use pre_tokenizer::PreTokenizer;
pub use stream::StreamDecoder;
pub use vocab::TokenType;

use byte_level_bpe::ByteLevelBpe;
use end_of_generation::MarkerIds;
use sentencepiece_bpe::SentencePieceBpe;
use special_tokens::{Fragment, SpecialTokens};
use vocab::{PieceEncoding, Vocab};

/// Opens a quoted span of a prompt (see [`Tokenizer::quote_special`]): U+FDD0, a Unicode
/// noncharacter, which no text in interchange is meant to hold.
pub const QUOTE_OPEN: char = '\u{FDD0}';
/// Closes a quoted span: U+FDD1, the next noncharacter.
pub const QUOTE_CLOSE: char = '\u{FDD1}';

/// llama.cpp pre-tokenizer names of the Llama 3 family, for which it skips merging a piece that
/// is already a token and adds BOS by default.
const LLAMA3_FAMILY: &[&str] = &[
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
];

enum Model {
    ByteLevel(ByteLevelBpe),
    SentencePiece(SentencePieceBpe),
}

/// A tokenizer: text to ids and back. Immutable once built, so one can be shared by threads.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    special_tokens: SpecialTokens,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// SentencePiece only: a space is put before the text (and taken off the first token when
    /// decoding).
    add_space_prefix: bool,
    end_of_generation: Vec<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer of a GGUF model.
    pub fn from_gguf(file: &tallow_gguf::GgufFile) -> Result<Self, TokenizerError> {
        Self::from_config(TokenizerConfig::from_gguf(file)?)
    }

    /// Builds a tokenizer from metadata already read.
    pub fn from_config(config: TokenizerConfig) -> Result<Self, TokenizerError> {
        let n = config.tokens.len();
        let token_types = match config.token_types {
            Some(types) if types.len() < n => {
                return Err(TokenizerError::TooFewEntries {
                    key: "tokenizer.ggml.token_type",
                    expected: n,
                    found: types.len(),
                })
            }
            Some(types) => types
                .into_iter()
                .take(n)
                .map(TokenType::from_gguf)
                .collect(),
            None => vec![TokenType::Normal; n],
        };
        let mut vocab = Vocab::new(config.tokens, token_types)?;

        let in_vocab = |key: &'static str, id: Option<u32>| match id {
            Some(id) if id as usize >= n => Err(TokenizerError::SpecialIdOutOfRange {
                key,
                id: id.into(),
                vocab_size: n,
            }),
            _ => Ok(id),
        };
        // llama.cpp's defaults for SentencePiece models without the keys; none for BPE.
        let spm_default = |id: u32| (config.model == "llama" && (id as usize) < n).then_some(id);
        let bos = in_vocab(config::BOS_ID, config.bos_id)?.or_else(|| spm_default(1));
        let eos = in_vocab(config::EOS_ID, config.eos_id)?.or_else(|| spm_default(2));
        let unk = in_vocab(config::UNK_ID, config.unk_id)?.or_else(|| spm_default(0));
        let pad = in_vocab(config::PAD_ID, config.pad_id)?;
        let markers = MarkerIds {
            eos,
            eot: in_vocab(config::EOT_ID, config.eot_id)?,
            eom: in_vocab(config::EOM_ID, config.eom_id)?,
            fim_pad: in_vocab(config::FIM_PAD_ID, config.fim_pad_id)?,
            fim_rep: in_vocab(config::FIM_REP_ID, config.fim_rep_id)?,
            fim_sep: in_vocab(config::FIM_SEP_ID, config.fim_sep_id)?,
        };

        let (model, add_bos_default, add_space_prefix) = match config.model.as_str() {
            "gpt2" => {
                let pre = config
                    .pre
                    .as_deref()
                    .ok_or(TokenizerError::MissingKey("tokenizer.ggml.pre"))?;
                let llama3_family = LLAMA3_FAMILY.contains(&pre);
                let bpe = ByteLevelBpe::new(
                    &vocab,
                    &config.merges,
                    PreTokenizer::from_name(pre)?,
                    llama3_family,
                )?;
                (Model::ByteLevel(bpe), llama3_family, false)
            }
            "llama" => {
                let scores = match config.scores {
                    Some(scores) if scores.len() < n => {
                        return Err(TokenizerError::TooFewEntries {
                            key: "tokenizer.ggml.scores",
                            expected: n,
                            found: scores.len(),
                        })
                    }
                    Some(mut scores) => {
                        scores.truncate(n);
                        scores
                    }
                    None => vec![0.0; n],
                };
                let spm = SentencePieceBpe::new(&vocab, scores, unk);
                (
                    Model::SentencePiece(spm),
                    true,
                    config.add_space_prefix.unwrap_or(true),
                )
            }
            other => return Err(TokenizerError::UnknownModel(other.to_owned())),
        };
        let add_bos = config.add_bos.unwrap_or(add_bos_default);
        let add_eos = config.add_eos.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: config::ADD_BOS,
                id_key: config::BOS_ID,
            });
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: config::ADD_EOS,
                id_key: config::EOS_ID,
            });
        }

        let end_of_generation = end_of_generation::end_of_generation_ids(&mut vocab, markers);
        vocab.build_pieces(match model {
            Model::ByteLevel(_) => PieceEncoding::ByteLevel,
            Model::SentencePiece(_) => PieceEncoding::SentencePiece,
        })?;
        let special_tokens = SpecialTokens::new(&vocab);
        Ok(Self {
            vocab,
            model,
            special_tokens,
            bos,
            eos,
            unk,
            pad,
            add_bos,
            add_eos,
            add_space_prefix,
            end_of_generation,
        })
    }

    /// The ids of `text`. With `add_special`, BOS / EOS are added as the model asks
    /// ([`Tokenizer::add_bos`], [`Tokenizer::add_eos`]). With `parse_special`, control tokens
    /// written in the text (`<|im_end|>`) become their ids; without it they are tokenized as
    /// plain text. User-defined tokens are always matched.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_with_literals(text, add_special, parse_special, &[], true)
    }

    /// The ids of `text` as it is tokenized where it follows earlier text: no BOS, no
    /// SentencePiece space prefix, control tokens as plain text.
    pub fn encode_continuation(&self, text: &str) -> Vec<u32> {
        self.encode_with_literals(text, false, false, &[], false)
    }

    /// `text` with every control token written in it put between [`QUOTE_OPEN`] and
    /// [`QUOTE_CLOSE`], so that [`Tokenizer::encode_quoted`] keeps it plain text. Chat prompts
    /// quote each message this way before the template renders them: control tokens then come
    /// only from the template, never from what a user wrote. Errors if `text` itself holds a
    /// quote mark (Unicode noncharacters, reserved for this).
    pub fn quote_special<'t>(&self, text: &'t str) -> Result<Cow<'t, str>, TokenizerError> {
        if let Some(mark) = text.chars().find(|&c| c == QUOTE_OPEN || c == QUOTE_CLOSE) {
            return Err(TokenizerError::ReservedCharacter(mark));
        }
        let mut quoted = String::new();
        let mut copied = 0;
        let mut offset = 0;
        self.special_tokens
            .partition(text, true, &[], |fragment| match fragment {
                Fragment::Text(piece) => offset += piece.len(),
                Fragment::Token(id) => {
                    let token = self.vocab.text(id).unwrap_or_default();
                    if self.special_tokens.is_control(id) {
                        quoted.push_str(&text[copied..offset]);
                        quoted.push(QUOTE_OPEN);
                        quoted.push_str(token);
                        quoted.push(QUOTE_CLOSE);
                        copied = offset + token.len();
                    }
                    offset += token.len();
                }
            });
        if copied == 0 {
            return Ok(Cow::Borrowed(text));
        }
        quoted.push_str(&text[copied..]);
        Ok(Cow::Owned(quoted))
    }

    /// The ids of `text` with control tokens parsed, except between [`QUOTE_OPEN`] and
    /// [`QUOTE_CLOSE`] (see [`Tokenizer::quote_special`]); the quote marks themselves are not
    /// part of the text. An unclosed quote runs to the end; a stray closing mark is dropped.
    pub fn encode_quoted(&self, text: &str, add_special: bool) -> Vec<u32> {
        if !text.contains([QUOTE_OPEN, QUOTE_CLOSE]) {
            return self.encode(text, add_special, true);
        }
        let mut plain = String::with_capacity(text.len());
        let mut literal: Vec<Range<usize>> = Vec::new();
        let mut open: Option<usize> = None;
        for c in text.chars() {
            match c {
                QUOTE_OPEN if open.is_none() => open = Some(plain.len()),
                QUOTE_CLOSE => {
                    if let Some(start) = open.take() {
                        literal.push(start..plain.len());
                    }
                }
                QUOTE_OPEN => {}
                c => plain.push(c),
            }
        }
        if let Some(start) = open {
            literal.push(start..plain.len());
        }
        self.encode_with_literals(&plain, add_special, true, &literal, true)
    }

    fn encode_with_literals(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        literal: &[Range<usize>],
        starts_text: bool,
    ) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::ByteLevel(bpe) => {
                let mut scratch = byte_level_bpe::Scratch::default();
                self.special_tokens
                    .partition(text, parse_special, literal, |fragment| match fragment {
                        Fragment::Text(text) => {
                            bpe.encode(&self.vocab, text, &mut scratch, &mut out)
                        }
                        Fragment::Token(id) => out.push(id),
                    });
            }
            Model::SentencePiece(spm) => {
                let mut scratch = sentencepiece_bpe::Scratch::default();
                let mut escaped = String::new();
                // As llama.cpp: every text fragment that follows a special token (or starts
                // the input, unless it continues earlier text) gets the space prefix.
                let mut after_special = starts_text;
                self.special_tokens
                    .partition(text, parse_special, literal, |fragment| match fragment {
                        Fragment::Text(text) => {
                            escaped.clear();
                            if self.add_space_prefix && after_special {
                                escaped.push('\u{2581}');
                            }
                            escaped.extend(
                                text.chars().map(|c| if c == ' ' { '\u{2581}' } else { c }),
                            );
                            spm.encode(&self.vocab, &escaped, &mut scratch, &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    });
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The text of `ids`: the concatenated bytes of their tokens (control tokens as their text,
    /// as llama.cpp's `llama_token_to_piece(special = true)`), invalid UTF-8 replaced by U+FFFD.
    /// For SentencePiece models with a space prefix, the first token loses its leading space.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            bytes.extend_from_slice(self.piece(id, i == 0)?);
        }
        Ok(match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The bytes a token adds to decoded text: [`Tokenizer::token_bytes`], less the leading
    /// space of the first token where the model adds a space prefix.
    pub(crate) fn piece(&self, id: u32, first: bool) -> Result<&[u8], TokenizerError> {
        let piece = self.token_bytes(id).ok_or(TokenizerError::IdOutOfRange {
            id,
            vocab_size: self.vocab_size(),
        })?;
        Ok(match piece {
            [b' ', rest @ ..] if first && self.add_space_prefix => rest,
            _ => piece,
        })
    }

    /// The raw bytes a token stands for (see [`Tokenizer::decode`]).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.vocab.piece(id)
    }

    /// The token's string in the vocabulary (byte-level or `▁`-escaped).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.text(id)
    }

    /// The id of a vocabulary string, e.g. `<|im_end|>`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.token_type(id)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether generation stops at this token (EOS, end of turn, ...).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn end_of_generation_ids(&self) -> &[u32] {
        &self.end_of_generation
    }
}

#[cfg(test)]
mod tests;
