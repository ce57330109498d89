//! The vocabulary: token strings, their types, the string -> id map, and each token's bytes.

use std::hash::Hasher;

use rustc_hash::FxHasher;

use crate::{byte_level, TokenizerError};

/// `tokenizer.ggml.token_type` of a token (llama.cpp's `llama_token_type`): the GGUF value is
/// the discriminant (`TokenType::Control as i32` is 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum TokenType {
    /// Any value this crate does not know.
    Undefined = 0,
    /// An ordinary piece of text.
    Normal = 1,
    /// The unknown token.
    Unknown = 2,
    /// A control token (`<|im_end|>`, `<bos>`...): matched in text only with `parse_special`.
    Control = 3,
    /// A user-defined token: always matched in text before the model sees it.
    UserDefined = 4,
    /// An unused slot.
    Unused = 5,
    /// A SentencePiece byte-fallback token `<0xAB>`.
    Byte = 6,
}

impl TokenType {
    const ALL: [TokenType; 7] = [
        Self::Undefined,
        Self::Normal,
        Self::Unknown,
        Self::Control,
        Self::UserDefined,
        Self::Unused,
        Self::Byte,
    ];

    pub(crate) fn from_gguf(value: i64) -> Self {
        Self::ALL
            .into_iter()
            .find(|&t| i64::from(t as i32) == value)
            .unwrap_or(Self::Undefined)
    }

    /// Tokens that are split out of the text before the model tokenizes it.
    pub(crate) fn is_special(self) -> bool {
        matches!(self, Self::Control | Self::UserDefined | Self::Unknown)
    }
}

/// How a token's string maps to the bytes it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PieceEncoding {
    /// GPT-2 byte-level code points.
    ByteLevel,
    /// SentencePiece: U+2581 stands for a space.
    SentencePiece,
}

/// `<0xAB>` -> `0xAB`.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The `<0xAB>` spelling of a byte-fallback token.
pub(crate) fn byte_token_text(byte: u8) -> String {
    format!("<0x{byte:02X}>")
}

/// The string -> id map: open addressing over `(hash tag, id)` slots, comparing strings in the
/// vocabulary's own storage. Tokenizers look up mostly strings that are *not* tokens (candidate
/// merges); those are usually rejected by the tag alone, touching one cache line.
struct TokenIndex {
    slots: Vec<Slot>,
    mask: usize,
}

#[derive(Clone, Copy)]
struct Slot {
    tag: u32,
    id: u32,
}

const EMPTY: u32 = u32::MAX;

fn hash(text: &str) -> u64 {
    let mut h = FxHasher::default();
    h.write(text.as_bytes());
    h.finish()
}

impl TokenIndex {
    fn with_capacity(n: usize) -> Self {
        let size = (n * 2).next_power_of_two().max(2);
        Self {
            slots: vec![Slot { tag: 0, id: EMPTY }; size],
            mask: size - 1,
        }
    }

    /// The slot of `key`: where it is, or the empty slot where it would go.
    fn find<'a>(&self, key: &str, text_of: impl Fn(u32) -> &'a [u8]) -> usize {
        let h = hash(key);
        let tag = (h >> 32) as u32;
        let mut i = h as usize & self.mask;
        loop {
            let slot = self.slots[i];
            if slot.id == EMPTY || (slot.tag == tag && short_eq(text_of(slot.id), key.as_bytes())) {
                return i;
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// Byte equality inlined: tokens are short, and a call into `memcmp` costs more than the
/// comparison.
#[inline]
fn short_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

pub(crate) struct Vocab {
    /// All token strings, concatenated; token `i` is `text[text_ends[i-1]..text_ends[i]]`.
    text: String,
    text_ends: Vec<usize>,
    types: Vec<TokenType>,
    index: TokenIndex,
    /// What each token decodes to, concatenated like `text`; built by [`Vocab::build_pieces`].
    pieces: Vec<u8>,
    piece_ends: Vec<usize>,
}

impl Vocab {
    /// `types` has one entry per token. An empty token string is renamed `[EMPTY_<id>]` as in
    /// llama.cpp; a string that appears twice is an error.
    pub(crate) fn new(tokens: Vec<String>, types: Vec<TokenType>) -> Result<Self, TokenizerError> {
        if tokens.is_empty() {
            return Err(TokenizerError::EmptyVocabulary);
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(TokenizerError::VocabularyTooLarge(tokens.len()));
        }
        debug_assert_eq!(tokens.len(), types.len());
        let mut vocab = Self {
            text: String::with_capacity(tokens.iter().map(String::len).sum()),
            text_ends: Vec::with_capacity(tokens.len()),
            types,
            index: TokenIndex::with_capacity(tokens.len()),
            pieces: Vec::new(),
            piece_ends: Vec::new(),
        };
        for (id, token) in (0u32..).zip(tokens) {
            let token = if token.is_empty() {
                format!("[EMPTY_{id}]")
            } else {
                token
            };
            let slot = vocab.index.find(&token, |id| vocab.text_bytes(id));
            let existing = vocab.index.slots[slot].id;
            if existing != EMPTY {
                return Err(TokenizerError::DuplicateToken {
                    text: token,
                    first: existing,
                    second: id,
                });
            }
            vocab.text.push_str(&token);
            vocab.text_ends.push(vocab.text.len());
            vocab.index.slots[slot] = Slot {
                tag: (hash(&token) >> 32) as u32,
                id,
            };
        }
        Ok(vocab)
    }

    pub(crate) fn len(&self) -> usize {
        self.text_ends.len()
    }

    pub(crate) fn text(&self, id: u32) -> Option<&str> {
        let i = usize::try_from(id).ok()?;
        let end = *self.text_ends.get(i)?;
        let start = if i == 0 { 0 } else { self.text_ends[i - 1] };
        Some(&self.text[start..end])
    }

    /// The bytes of a token's string (empty for an id out of range).
    fn text_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        let end = self.text_ends.get(i).copied().unwrap_or_default();
        let start = if i == 0 { 0 } else { self.text_ends[i - 1] };
        self.text.as_bytes().get(start..end).unwrap_or_default()
    }

    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        let slot = self.index.slots[self.index.find(text, |id| self.text_bytes(id))];
        (slot.id != EMPTY).then_some(slot.id)
    }

    pub(crate) fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(usize::try_from(id).ok()?).copied()
    }

    pub(crate) fn set_token_type(&mut self, id: u32, ty: TokenType) {
        if let Some(slot) = usize::try_from(id).ok().and_then(|i| self.types.get_mut(i)) {
            *slot = ty;
        }
    }

    /// Ids of all tokens, with their strings and types.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &str, TokenType)> + '_ {
        (0u32..).zip(self.types.iter()).map(|(id, &ty)| {
            // Every id below `len()` has a string.
            (id, self.text(id).unwrap_or_default(), ty)
        })
    }

    /// Precomputes what every token decodes to, as llama.cpp's `token_to_piece(special = true)`:
    /// control, user-defined and unknown tokens render as their string, normal tokens as the bytes
    /// they encode, byte tokens as their byte, unused and undefined tokens as nothing.
    pub(crate) fn build_pieces(&mut self, encoding: PieceEncoding) -> Result<(), TokenizerError> {
        let mut pieces = Vec::with_capacity(self.text.len());
        let mut piece_ends = Vec::with_capacity(self.len());
        for id in 0..self.len() as u32 {
            let text = self.text(id).unwrap_or_default();
            match self.types[id as usize] {
                TokenType::Control | TokenType::UserDefined | TokenType::Unknown => {
                    pieces.extend_from_slice(text.as_bytes())
                }
                TokenType::Normal => match encoding {
                    PieceEncoding::ByteLevel => pieces.extend(byte_level::decode(text)),
                    PieceEncoding::SentencePiece => {
                        pieces.extend_from_slice(text.replace('\u{2581}', " ").as_bytes())
                    }
                },
                TokenType::Byte => {
                    let byte =
                        parse_byte_token(text).ok_or_else(|| TokenizerError::BadByteToken {
                            id,
                            text: text.to_owned(),
                        })?;
                    pieces.push(byte);
                }
                TokenType::Unused | TokenType::Undefined => {}
            }
            piece_ends.push(pieces.len());
        }
        self.pieces = pieces;
        self.piece_ends = piece_ends;
        Ok(())
    }

    pub(crate) fn piece(&self, id: u32) -> Option<&[u8]> {
        let i = usize::try_from(id).ok()?;
        let end = *self.piece_ends.get(i)?;
        let start = if i == 0 { 0 } else { self.piece_ends[i - 1] };
        Some(&self.pieces[start..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[&str], types: &[TokenType]) -> Result<Vocab, TokenizerError> {
        Vocab::new(
            tokens.iter().map(|s| s.to_string()).collect(),
            types.to_vec(),
        )
    }

    #[test]
    fn lookups_and_pieces() {
        use TokenType::*;
        let mut v = vocab(
            &["<s>", "ĠhiĊ", "\u{2581}a\u{2581}b", "<0x0A>", "", "<x>"],
            &[Control, Normal, Normal, Byte, Undefined, Unused],
        )
        .unwrap();
        assert_eq!(v.len(), 6);
        assert_eq!(v.id("ĠhiĊ"), Some(1));
        assert_eq!(v.id("nope"), None);
        assert_eq!(v.text(4), Some("[EMPTY_4]"));
        assert_eq!(v.text(6), None);
        v.build_pieces(PieceEncoding::ByteLevel).unwrap();
        assert_eq!(v.piece(0), Some(&b"<s>"[..]));
        assert_eq!(v.piece(1), Some(&b" hi\n"[..]));
        assert_eq!(v.piece(3), Some(&b"\n"[..]));
        assert_eq!(v.piece(5), Some(&b""[..]));
        assert_eq!(v.piece(6), None);
        v.build_pieces(PieceEncoding::SentencePiece).unwrap();
        assert_eq!(v.piece(2), Some(&b" a b"[..]));
    }

    #[test]
    fn duplicate_and_bad_byte_tokens_are_errors() {
        use TokenType::*;
        let err = vocab(&["a", "b", "a"], &[Normal; 3]).err().unwrap();
        assert_eq!(
            err,
            TokenizerError::DuplicateToken {
                text: "a".into(),
                first: 0,
                second: 2
            }
        );
        let mut v = vocab(&["<0xZZ>"], &[Byte]).unwrap();
        assert!(matches!(
            v.build_pieces(PieceEncoding::SentencePiece),
            Err(TokenizerError::BadByteToken { id: 0, .. })
        ));
        assert_eq!(vocab(&[], &[]).err(), Some(TokenizerError::EmptyVocabulary));
    }

    #[test]
    fn byte_token_spelling() {
        assert_eq!(parse_byte_token("<0xAB>"), Some(0xAB));
        assert_eq!(parse_byte_token("<0xab>"), Some(0xAB));
        assert_eq!(parse_byte_token("<0xABC>"), None);
        assert_eq!(parse_byte_token("0xAB"), None);
        assert_eq!(byte_token_text(0x0A), "<0x0A>");
    }
}
