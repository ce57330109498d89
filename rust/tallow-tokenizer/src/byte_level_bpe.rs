//! Byte-level BPE (`tokenizer.ggml.model == "gpt2"`): pre-tokenize, then merge the bytes of each
//! piece by merge rank.
//!
//! Merging works on token ids: a piece starts as one byte-level token per byte, and the merge
//! table maps an adjacent id pair to `(rank, merged id)`. The lowest rank merges first, the
//! leftmost pair on a tie, exactly as in llama.cpp's `llm_tokenizer_bpe_session` and HF's `BPE`.
//! (One corner differs between those two: a byte without a token in the vocabulary. llama.cpp
//! keeps it in place, so its neighbours cannot merge across it, and drops it at the end; HF
//! drops it first. This follows llama.cpp.)

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::byte_level::{self, BYTE_TO_CHAR};
use crate::pre_tokenizer::PreTokenizer;
use crate::vocab::Vocab;
use crate::TokenizerError;

/// Pieces up to this many bytes merge by linear scans, longer ones through a heap.
const SHORT_PIECE: usize = 48;

#[derive(Clone, Copy, Debug)]
struct Merge {
    rank: u32,
    merged: u32,
}

fn pair_key(left: u32, right: u32) -> u64 {
    u64::from(left) << 32 | u64::from(right)
}

pub(crate) struct ByteLevelBpe {
    pre_tokenizer: PreTokenizer,
    /// The token of each single byte; `None` only in a vocabulary that lacks it, in which case
    /// the byte is dropped from the output (as llama.cpp does).
    byte_tokens: [Option<u32>; 256],
    merges: FxHashMap<u64, Merge>,
    /// Emit a piece that is itself a token without merging (llama.cpp's `ignore_merges`, set
    /// for the Llama 3 family).
    ignore_merges: bool,
}

/// State kept across the pieces of one `encode` call: reusable merge buffers, and the ids of
/// every piece merged so far (text repeats its words, and a lookup is far cheaper than merging).
#[derive(Default)]
pub(crate) struct Scratch<'t> {
    ids: Vec<Option<u32>>,
    /// Per adjacent pair of `ids`: the merge, if any.
    pairs: Vec<Option<Merge>>,
    symbols: Vec<Symbol>,
    /// Min-heap of `(rank, left position)`.
    heap: BinaryHeap<Reverse<(u32, usize)>>,
    /// Piece -> range of `cached_ids`.
    cache: FxHashMap<&'t [u8], (usize, usize)>,
    cached_ids: Vec<u32>,
}

#[derive(Clone, Copy)]
struct Symbol {
    id: Option<u32>,
    prev: usize,
    next: usize,
    alive: bool,
}

const NONE: usize = usize::MAX;

impl ByteLevelBpe {
    /// `merges` are `"left right"` strings, rank = position. Both halves and their
    /// concatenation must be tokens. A repeated merge keeps its first rank, as in llama.cpp.
    pub(crate) fn new(
        vocab: &Vocab,
        merges: &[String],
        pre_tokenizer: PreTokenizer,
        ignore_merges: bool,
    ) -> Result<Self, TokenizerError> {
        let mut byte_tokens = [None; 256];
        for (slot, c) in byte_tokens.iter_mut().zip(BYTE_TO_CHAR) {
            *slot = vocab.id(c.encode_utf8(&mut [0; 4]));
        }
        let mut table = FxHashMap::with_capacity_and_hasher(merges.len(), Default::default());
        for (index, merge) in merges.iter().enumerate() {
            let bad = |reason| TokenizerError::BadMerge {
                index,
                merge: merge.clone(),
                reason,
            };
            // The first half may itself start with a space only in SentencePiece-style
            // vocabularies; llama.cpp searches for the separator from the second byte on.
            let split = merge
                .bytes()
                .skip(1)
                .position(|b| b == b' ')
                .map(|i| i + 1)
                .ok_or_else(|| bad("expected two tokens separated by a space"))?;
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            let left_id = vocab
                .id(left)
                .ok_or_else(|| bad("the left token is not in the vocabulary"))?;
            let right_id = vocab
                .id(right)
                .ok_or_else(|| bad("the right token is not in the vocabulary"))?;
            let merged = vocab
                .id(&format!("{left}{right}"))
                .ok_or_else(|| bad("the merged token is not in the vocabulary"))?;
            let rank = u32::try_from(index).map_err(|_| bad("too many merges"))?;
            table
                .entry(pair_key(left_id, right_id))
                .or_insert(Merge { rank, merged });
        }
        Ok(Self {
            pre_tokenizer,
            byte_tokens,
            merges: table,
            ignore_merges,
        })
    }

    /// Appends the tokens of `text` (one fragment between special tokens) to `out`.
    pub(crate) fn encode<'t>(
        &self,
        vocab: &Vocab,
        text: &'t str,
        scratch: &mut Scratch<'t>,
        out: &mut Vec<u32>,
    ) {
        self.pre_tokenizer.split(text, |piece| {
            let piece = piece.as_bytes();
            if let [byte] = piece {
                out.extend(self.byte_tokens[usize::from(*byte)]);
            } else if let Some(&(start, end)) = scratch.cache.get(piece) {
                out.extend_from_slice(&scratch.cached_ids[start..end]);
            } else {
                let first = out.len();
                self.encode_piece(vocab, piece, scratch, out);
                let start = scratch.cached_ids.len();
                scratch.cached_ids.extend_from_slice(&out[first..]);
                let end = scratch.cached_ids.len();
                scratch.cache.insert(piece, (start, end));
            }
        });
    }

    fn encode_piece(&self, vocab: &Vocab, piece: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(id) = vocab.id(&byte_level::encode(piece)) {
                out.push(id);
                return;
            }
        }
        if piece.len() <= SHORT_PIECE {
            self.merge_short(piece, scratch, out);
        } else {
            self.merge_long(piece, scratch, out);
        }
    }

    fn lookup(&self, left: Option<u32>, right: Option<u32>) -> Option<Merge> {
        self.merges.get(&pair_key(left?, right?)).copied()
    }

    /// Quadratic in the worst case but allocation-free and cache-friendly: the merge of every
    /// adjacent pair is kept in `pairs`, and each step applies the first one of minimal rank.
    fn merge_short(&self, piece: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        let Scratch { ids, pairs, .. } = scratch;
        ids.clear();
        ids.extend(piece.iter().map(|&b| self.byte_tokens[usize::from(b)]));
        pairs.clear();
        pairs.extend(ids.windows(2).map(|w| self.lookup(w[0], w[1])));
        loop {
            let mut best: Option<(usize, Merge)> = None;
            for (i, pair) in pairs.iter().enumerate() {
                match (*pair, best) {
                    (Some(m), Some((_, b))) if m.rank >= b.rank => {}
                    (Some(m), _) => best = Some((i, m)),
                    (None, _) => {}
                }
            }
            let Some((i, merge)) = best else {
                break;
            };
            ids[i] = Some(merge.merged);
            ids.remove(i + 1);
            pairs.remove(i);
            if i > 0 {
                pairs[i - 1] = self.lookup(ids[i - 1], ids[i]);
            }
            if i + 1 < ids.len() {
                pairs[i] = self.lookup(ids[i], ids[i + 1]);
            }
        }
        out.extend(ids.iter().flatten());
    }

    /// O(n log n): a min-heap of `(rank, position)` over a linked list of symbols. Entries go
    /// stale when a neighbour merges; a popped entry is valid iff its pair still has that rank
    /// (a rank names exactly one pair).
    fn merge_long(&self, piece: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        let Scratch { symbols, heap, .. } = scratch;
        symbols.clear();
        heap.clear();
        let n = piece.len();
        symbols.extend(piece.iter().enumerate().map(|(i, &b)| Symbol {
            id: self.byte_tokens[usize::from(b)],
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
            alive: true,
        }));
        for i in 0..n.saturating_sub(1) {
            if let Some(m) = self.lookup(symbols[i].id, symbols[i + 1].id) {
                heap.push(Reverse((m.rank, i)));
            }
        }
        while let Some(Reverse((rank, left))) = heap.pop() {
            let right = symbols[left].next;
            if !symbols[left].alive || right == NONE {
                continue;
            }
            let Some(merge) = self.lookup(symbols[left].id, symbols[right].id) else {
                continue;
            };
            if merge.rank != rank {
                continue;
            }
            let after = symbols[right].next;
            symbols[left].id = Some(merge.merged);
            symbols[left].next = after;
            symbols[right].alive = false;
            if after != NONE {
                symbols[after].prev = left;
            }
            let before = symbols[left].prev;
            if before != NONE {
                if let Some(m) = self.lookup(symbols[before].id, symbols[left].id) {
                    heap.push(Reverse((m.rank, before)));
                }
            }
            if after != NONE {
                if let Some(m) = self.lookup(symbols[left].id, symbols[after].id) {
                    heap.push(Reverse((m.rank, left)));
                }
            }
        }
        let mut i = if symbols.is_empty() { NONE } else { 0 };
        while i != NONE {
            out.extend(symbols[i].id);
            i = symbols[i].next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::TokenType;
    use proptest::prelude::*;

    /// A toy vocabulary over the letters a..d: all bytes, plus merges chosen to create ties,
    /// overlaps and chains.
    fn toy() -> (Vocab, ByteLevelBpe) {
        let merges = [
            "a a", "b c", "aa a", "c d", "a b", "bc d", "aa aa", "ab cd", "d d", "aaa a",
        ];
        let mut tokens: Vec<String> = BYTE_TO_CHAR.iter().map(|c| c.to_string()).collect();
        for m in merges {
            let merged = m.replace(' ', "");
            if !tokens.contains(&merged) {
                tokens.push(merged);
            }
        }
        let types = vec![TokenType::Normal; tokens.len()];
        let vocab = Vocab::new(tokens, types).unwrap();
        let merges: Vec<String> = merges.iter().map(|s| s.to_string()).collect();
        let bpe = ByteLevelBpe::new(&vocab, &merges, PreTokenizer::Gpt2, false).unwrap();
        (vocab, bpe)
    }

    fn texts(vocab: &Vocab, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .map(|&id| vocab.text(id).unwrap().to_owned())
            .collect()
    }

    #[test]
    fn merges_by_rank_then_leftmost() {
        let (vocab, bpe) = toy();
        let mut scratch = Scratch::default();
        let mut run = |word: &str| {
            let mut out = Vec::new();
            bpe.merge_short(word.as_bytes(), &mut scratch, &mut out);
            texts(&vocab, &out)
        };
        // "a a" (rank 0) merges leftmost first: aa|a|a|a -> aa|aa|a; then "aa a" (rank 2)
        // beats "aa aa" (rank 6): aa|aaa.
        assert_eq!(run("aaaaa"), ["aa", "aaa"]);
        // "b c" (rank 1) beats "a b" (rank 4), and then "bc d" (rank 5) applies.
        assert_eq!(run("abcd"), ["a", "bcd"]);
        assert_eq!(run("abd"), ["ab", "d"]);
        assert_eq!(run("x"), ["x"]);
    }

    proptest! {
        #[test]
        fn short_and_long_merging_agree(word in "[abcd]{0,80}") {
            let (_, bpe) = toy();
            let mut scratch = Scratch::default();
            let (mut short, mut long) = (Vec::new(), Vec::new());
            bpe.merge_short(word.as_bytes(), &mut scratch, &mut short);
            bpe.merge_long(word.as_bytes(), &mut scratch, &mut long);
            prop_assert_eq!(short, long);
        }
    }

    #[test]
    fn bad_merges_are_errors() {
        let tokens: Vec<String> = ["a", "b", "ab"].iter().map(|s| s.to_string()).collect();
        let vocab = Vocab::new(tokens, vec![TokenType::Normal; 3]).unwrap();
        let build = |m: &str| ByteLevelBpe::new(&vocab, &[m.to_owned()], PreTokenizer::Gpt2, false);
        assert!(build("a b").is_ok());
        for (merge, reason) in [
            ("ab", "expected two tokens separated by a space"),
            ("a c", "the right token is not in the vocabulary"),
            ("c b", "the left token is not in the vocabulary"),
            ("b a", "the merged token is not in the vocabulary"),
        ] {
            let err = build(merge).err().unwrap();
            assert_eq!(
                err,
                TokenizerError::BadMerge {
                    index: 0,
                    merge: merge.into(),
                    reason
                },
            );
        }
    }
}
