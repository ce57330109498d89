//! The model's vocabulary as llguidance sees it: each token's bytes in a trie, with control
//! tokens marked (a 0xFF byte before their text) so that no grammar produces one by spelling
//! it out.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use tallow_tokenizer::{TokenType, Tokenizer};

struct Vocabulary {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(bytes) {
            // The bytes continue the output: no SentencePiece space prefix.
            Ok(text) => self.tokenizer.encode_continuation(text),
            // Not text (a grammar's lexeme may end inside a character): the longest tokens
            // that spell the bytes.
            Err(_) => self.trie.greedy_tokenize(bytes),
        }
    }
}

/// `tokenizer`'s vocabulary for llguidance, with the model's end-of-generation tokens (or its
/// EOS) as the tokens that end a grammar.
pub(crate) fn token_env(tokenizer: Arc<Tokenizer>) -> Result<TokEnv, String> {
    let n = tokenizer.vocab_size();
    let mut ends = tokenizer.end_of_generation_ids().to_vec();
    if ends.is_empty() {
        ends.extend(tokenizer.eos_id());
    }
    let Some(&eos) = ends.first() else {
        return Err("the model's tokenizer has no end-of-generation token".into());
    };
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| match tokenizer.token_type(id) {
            Some(TokenType::Control | TokenType::Unknown | TokenType::Unused) => {
                let text = tokenizer.token_text(id).unwrap_or_default();
                [&[TokTrie::SPECIAL_TOKEN_MARKER], text.as_bytes()].concat()
            }
            _ => tokenizer.token_bytes(id).unwrap_or_default().to_vec(),
        })
        .collect();
    let info = TokRxInfo {
        tok_bos: tokenizer.bos_id(),
        tok_pad: tokenizer.pad_id(),
        tok_unk: tokenizer.unk_id(),
        ..TokRxInfo::new(n as u32, eos)
    };
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
    Ok(Arc::new(Vocabulary { tokenizer, trie }))
}
