//! SentencePiece BPE (`tokenizer.ggml.model == "llama"`, e.g. Llama 2, Gemma): merge adjacent
//! symbols whose concatenation is a token, highest token score first (leftmost on a tie), then
//! fall back to byte tokens (`<0xAB>`) for whatever is left that is not a token. This is
//! llama.cpp's `llm_tokenizer_spm_session`. There is no pre-tokenization: the caller has already
//! replaced spaces by U+2581 and added the optional leading space.
//!
//! llama.cpp merges over the whole text at once. Here the text is first cut before each `▁` that
//! no token can join to the character before it: no merge can cross such a cut, so each word
//! merges on its own to the same result, and repeated words come from a cache.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::vocab::{byte_token_text, Vocab};

const SPACE: char = '\u{2581}';

pub(crate) struct SentencePieceBpe {
    scores: Vec<f32>,
    /// The token each byte falls back to: `<0xAB>`, else the one-character token for an ASCII
    /// byte. `None` only in vocabularies without byte fallback; such bytes become `unk`.
    byte_tokens: [Option<u32>; 256],
    unk: Option<u32>,
    /// Characters that some token has right before a `▁` (in Gemma 3 only `>`, from `>▁</`).
    joins_space: FxHashSet<char>,
}

/// One UTF-8 character or a merged run of them: `text[start..end]`.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    end: usize,
    prev: usize,
    next: usize,
    /// The token, once known: set by a merge; single characters are looked up at the end.
    id: Option<u32>,
}

const NONE: usize = usize::MAX;

/// A candidate merge of `left` and its right neighbour `right`.
#[derive(Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text when the candidate was made; a later mismatch means one
    /// side has merged with something else since.
    len: usize,
    /// The merged token.
    id: u32,
}

impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// State kept across one `encode` call: reusable buffers and the ids of the words seen so far.
#[derive(Default)]
pub(crate) struct Scratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram>,
    /// Word -> range of `cached_ids`.
    cache: FxHashMap<Box<str>, (usize, usize)>,
    cached_ids: Vec<u32>,
}

impl SentencePieceBpe {
    /// `scores` has one entry per token.
    pub(crate) fn new(vocab: &Vocab, scores: Vec<f32>, unk: Option<u32>) -> Self {
        let mut byte_tokens = [None; 256];
        for (byte, slot) in (0u8..=255).zip(byte_tokens.iter_mut()) {
            *slot = vocab.id(&byte_token_text(byte)).or_else(|| {
                byte.is_ascii()
                    .then(|| vocab.id(char::from(byte).encode_utf8(&mut [0; 4])))
                    .flatten()
            });
        }
        let mut joins_space = FxHashSet::default();
        for (_, text, _) in vocab.iter() {
            let mut prev = None;
            for c in text.chars() {
                if let (SPACE, Some(p)) = (c, prev) {
                    joins_space.insert(p);
                }
                prev = Some(c);
            }
        }
        Self {
            scores,
            byte_tokens,
            unk,
            joins_space,
        }
    }

    /// Appends the tokens of `text` to `out`.
    pub(crate) fn encode(
        &self,
        vocab: &Vocab,
        text: &str,
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        let mut word_start = 0;
        let mut prev = None;
        for (i, c) in text.char_indices() {
            if c == SPACE && prev.is_some_and(|p| !self.joins_space.contains(&p)) {
                self.encode_word(vocab, &text[word_start..i], scratch, out);
                word_start = i;
            }
            prev = Some(c);
        }
        if word_start < text.len() {
            self.encode_word(vocab, &text[word_start..], scratch, out);
        }
    }

    fn encode_word(&self, vocab: &Vocab, word: &str, scratch: &mut Scratch, out: &mut Vec<u32>) {
        if let Some(&(start, end)) = scratch.cache.get(word) {
            out.extend_from_slice(&scratch.cached_ids[start..end]);
            return;
        }
        let first = out.len();
        self.merge(vocab, word, scratch, out);
        let start = scratch.cached_ids.len();
        scratch.cached_ids.extend_from_slice(&out[first..]);
        let end = scratch.cached_ids.len();
        scratch.cache.insert(word.into(), (start, end));
    }

    /// Merges the characters of `text` into tokens (llama.cpp's algorithm, on one word).
    fn merge(&self, vocab: &Vocab, text: &str, scratch: &mut Scratch, out: &mut Vec<u32>) {
        let Scratch { symbols, heap, .. } = scratch;
        symbols.clear();
        heap.clear();
        let mut chars = text.char_indices().peekable();
        while let Some((start, _)) = chars.next() {
            let end = chars.peek().map_or(text.len(), |&(next, _)| next);
            let index = symbols.len();
            symbols.push(Symbol {
                start,
                end,
                prev: if index == 0 { NONE } else { index - 1 },
                next: if end == text.len() { NONE } else { index + 1 },
                id: None,
            });
        }

        let candidate = |symbols: &[Symbol], left: usize, right: usize| -> Option<Bigram> {
            if left == NONE || right == NONE {
                return None;
            }
            let merged = &text[symbols[left].start..symbols[right].end];
            let id = vocab.id(merged)?;
            Some(Bigram {
                score: self.scores[id as usize],
                left,
                right,
                len: merged.len(),
                id,
            })
        };

        for right in 1..symbols.len() {
            heap.extend(candidate(symbols, right - 1, right));
        }
        while let Some(bigram) = heap.pop() {
            let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
            let left_len = left.end - left.start;
            let right_len = right.end - right.start;
            if left_len == 0 || right_len == 0 || left_len + right_len != bigram.len {
                continue;
            }
            // Merge the right symbol into the left one and unlink it.
            symbols[bigram.left].end = right.end;
            symbols[bigram.left].id = Some(bigram.id);
            symbols[bigram.right].end = symbols[bigram.right].start;
            symbols[bigram.left].next = right.next;
            if right.next != NONE {
                symbols[right.next].prev = bigram.left;
            }
            heap.extend(candidate(symbols, left.prev, bigram.left));
            heap.extend(candidate(symbols, bigram.left, right.next));
        }

        let mut i = if symbols.is_empty() { NONE } else { 0 };
        while i != NONE {
            let symbol = symbols[i];
            let piece = &text[symbol.start..symbol.end];
            match symbol.id.or_else(|| vocab.id(piece)) {
                Some(id) => out.push(id),
                None => out.extend(
                    piece
                        .bytes()
                        .filter_map(|b| self.byte_tokens[usize::from(b)].or(self.unk)),
                ),
            }
            i = symbol.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::TokenType;

    fn toy(pieces: &[(&str, f32)]) -> (Vocab, SentencePieceBpe) {
        let mut tokens = vec!["<unk>".to_string()];
        let mut scores = vec![0.0];
        for b in 0..=255u8 {
            tokens.push(byte_token_text(b));
            scores.push(0.0);
        }
        for &(p, s) in pieces {
            tokens.push(p.to_string());
            scores.push(s);
        }
        let n = tokens.len();
        let vocab = Vocab::new(tokens, vec![TokenType::Normal; n]).unwrap();
        let spm = SentencePieceBpe::new(&vocab, scores, Some(0));
        (vocab, spm)
    }

    fn encode(vocab: &Vocab, spm: &SentencePieceBpe, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        spm.encode(vocab, text, &mut Scratch::default(), &mut out);
        out.iter()
            .map(|&id| vocab.text(id).unwrap().to_owned())
            .collect()
    }

    #[test]
    fn highest_score_merges_first() {
        let (v, spm) = toy(&[
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -3.0),
            ("bc", -2.0),
            ("abc", -5.0),
        ]);
        // "bc" (-2) merges before "ab" (-3); then "a" + "bc" is the token "abc".
        assert_eq!(encode(&v, &spm, "abc"), ["abc"]);
        assert_eq!(encode(&v, &spm, "ab"), ["ab"]);
        assert_eq!(encode(&v, &spm, "cab"), ["c", "ab"]);
    }

    #[test]
    fn ties_merge_leftmost_first() {
        let (v, spm) = toy(&[("a", -1.0), ("aa", -2.0)]);
        assert_eq!(encode(&v, &spm, "aaa"), ["aa", "a"]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let (v, spm) = toy(&[("a", -1.0)]);
        assert_eq!(encode(&v, &spm, "aé"), ["a", "<0xC3>", "<0xA9>"]);
        assert_eq!(encode(&v, &spm, ""), Vec::<String>::new());
    }

    #[test]
    fn words_are_cut_only_where_no_token_crosses() {
        // "x▁y" is a token, so "x" and "▁y" must merge across the space; "a▁b" is not cut
        // differently from whole-text merging either way.
        let (v, spm) = toy(&[
            ("x", -1.0),
            ("▁y", -1.0),
            ("x▁y", -0.5),
            ("a", -1.0),
            ("▁b", -1.0),
        ]);
        assert!(spm.joins_space.contains(&'x'));
        assert!(!spm.joins_space.contains(&'a'));
        assert_eq!(encode(&v, &spm, "x▁y▁y"), ["x▁y", "▁y"]);
        assert_eq!(encode(&v, &spm, "a▁b▁b"), ["a", "▁b", "▁b"]);
    }

    #[test]
    fn without_byte_tokens_unknown_characters_become_unk() {
        let tokens: Vec<String> = ["<unk>", "a"].iter().map(|s| s.to_string()).collect();
        let vocab = Vocab::new(tokens, vec![TokenType::Normal; 2]).unwrap();
        let spm = SentencePieceBpe::new(&vocab, vec![0.0, -1.0], Some(0));
        assert_eq!(encode(&vocab, &spm, "aé"), ["a", "<unk>", "<unk>"]);
    }
}
