//! Splitting special tokens out of the text before the model tokenizes it (llama.cpp's
//! `tokenizer_st_partition`).
//!
//! Control and unknown tokens are matched only when the caller asks to parse special tokens;
//! user-defined tokens always are (as in llama.cpp and HF `tokenizers`' added tokens). The
//! matching order is llama.cpp's: tokens are taken longest first, and each claims its leftmost
//! non-overlapping occurrences in the text that earlier tokens left unclaimed. A byte trie finds
//! which tokens occur at all, so text without special tokens costs one cheap scan. (llama.cpp's
//! per-model lstrip/rstrip attributes, set by model name for Phi-3 and some Jina models, are not
//! applied.)

use std::ops::Range;

use crate::vocab::{TokenType, Vocab};

/// A piece of the input: raw text for the model, or a special token matched verbatim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

struct SpecialToken {
    id: u32,
    text: Box<str>,
    /// User-defined: matched even when special tokens are not parsed.
    always: bool,
}

#[derive(Default)]
struct TrieNode {
    children: Vec<(u8, usize)>,
    /// Index into `SpecialTokens::tokens` of the token spelled by the path to this node.
    token: Option<usize>,
}

pub(crate) struct SpecialTokens {
    /// In matching priority: longer first, then lower id.
    tokens: Vec<SpecialToken>,
    trie: Vec<TrieNode>,
    /// Bytes that start some special token / some always-matched token.
    starts_any: [bool; 256],
    starts_always: [bool; 256],
}

impl SpecialTokens {
    pub(crate) fn new(vocab: &Vocab) -> Self {
        let mut tokens: Vec<SpecialToken> = vocab
            .iter()
            .filter(|&(_, _, ty)| ty.is_special())
            .map(|(id, text, ty)| SpecialToken {
                id,
                text: text.into(),
                always: ty == TokenType::UserDefined,
            })
            .collect();
        tokens.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));

        let mut trie = vec![TrieNode::default()];
        let mut starts_any = [false; 256];
        let mut starts_always = [false; 256];
        for (index, token) in tokens.iter().enumerate() {
            let bytes = token.text.as_bytes();
            starts_any[usize::from(bytes[0])] = true;
            starts_always[usize::from(bytes[0])] |= token.always;
            let mut node = 0;
            for &b in bytes {
                node = match trie[node].children.iter().find(|&&(c, _)| c == b) {
                    Some(&(_, child)) => child,
                    None => {
                        trie.push(TrieNode::default());
                        let child = trie.len() - 1;
                        trie[node].children.push((b, child));
                        child
                    }
                };
            }
            trie[node].token = Some(index);
        }
        Self {
            tokens,
            trie,
            starts_any,
            starts_always,
        }
    }

    /// Calls `fragment` with the pieces of `text` in order. Text fragments are never empty.
    /// No control token is matched where it would overlap a range of `literal` (sorted byte
    /// ranges that are plain text whatever `parse_special` says).
    pub(crate) fn partition<'t>(
        &self,
        text: &'t str,
        parse_special: bool,
        literal: &[Range<usize>],
        mut fragment: impl FnMut(Fragment<'t>),
    ) {
        let present = self.tokens_present(text, parse_special);
        if present.is_empty() {
            if !text.is_empty() {
                fragment(Fragment::Text(text));
            }
            return;
        }

        let bytes = text.as_bytes();
        let mut claimed = vec![false; bytes.len()];
        // `(offset, index into self.tokens)` of every match.
        let mut claims: Vec<(usize, usize)> = Vec::new();
        // Offsets of each byte that starts a present token, found once per byte value.
        let mut offsets_of: Vec<(u8, Vec<usize>)> = Vec::new();
        for index in present {
            let token = self.tokens[index].text.as_bytes();
            let first = token[0];
            let offsets = match offsets_of.iter().position(|(b, _)| *b == first) {
                Some(i) => &offsets_of[i].1,
                None => {
                    let found = (0..bytes.len()).filter(|&i| bytes[i] == first).collect();
                    offsets_of.push((first, found));
                    &offsets_of[offsets_of.len() - 1].1
                }
            };
            // Leftmost first, not overlapping this token's earlier matches (`next`) nor what
            // longer tokens claimed. A UTF-8 token matches only on char boundaries.
            let mut next = 0;
            for &start in offsets {
                let end = start + token.len();
                if start < next
                    || bytes.get(start..end) != Some(token)
                    || claimed[start..end].contains(&true)
                    || (!self.tokens[index].always && overlaps(literal, start..end))
                {
                    continue;
                }
                claimed[start..end].fill(true);
                claims.push((start, index));
                next = end;
            }
        }
        claims.sort_unstable();

        let mut pos = 0;
        for (start, index) in claims {
            if pos < start {
                fragment(Fragment::Text(&text[pos..start]));
            }
            let token = &self.tokens[index];
            fragment(Fragment::Token(token.id));
            pos = start + token.text.len();
        }
        if pos < bytes.len() {
            fragment(Fragment::Text(&text[pos..]));
        }
    }

    /// Whether `id` is matched only when special tokens are parsed (a control or unknown
    /// token, not a user-defined one).
    pub(crate) fn is_control(&self, id: u32) -> bool {
        self.tokens.iter().any(|t| t.id == id && !t.always)
    }

    /// Indices (in priority order) of the tokens that occur somewhere in `text`.
    fn tokens_present(&self, text: &str, parse_special: bool) -> Vec<usize> {
        let starts = if parse_special {
            &self.starts_any
        } else {
            &self.starts_always
        };
        let bytes = text.as_bytes();
        let mut present = Vec::new();
        let mut seen = Vec::new();
        for start in 0..bytes.len() {
            if !starts[usize::from(bytes[start])] {
                continue;
            }
            let mut node = 0;
            for &b in &bytes[start..] {
                match self.trie[node].children.iter().find(|&&(c, _)| c == b) {
                    Some(&(_, child)) => node = child,
                    None => break,
                }
                if let Some(index) = self.trie[node].token {
                    if parse_special || self.tokens[index].always {
                        if seen.is_empty() {
                            seen = vec![false; self.tokens.len()];
                        }
                        if !seen[index] {
                            seen[index] = true;
                            present.push(index);
                        }
                    }
                }
            }
        }
        present.sort_unstable();
        present
    }
}

/// Whether `range` overlaps one of the sorted, disjoint `ranges`.
fn overlaps(ranges: &[Range<usize>], range: Range<usize>) -> bool {
    let first_ending_after = ranges.partition_point(|r| r.end <= range.start);
    ranges
        .get(first_ending_after)
        .is_some_and(|r| r.start < range.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specials(tokens: &[(&str, TokenType)]) -> (Vocab, SpecialTokens) {
        let vocab = Vocab::new(
            tokens.iter().map(|t| t.0.to_string()).collect(),
            tokens.iter().map(|t| t.1).collect(),
        )
        .unwrap();
        let specials = SpecialTokens::new(&vocab);
        (vocab, specials)
    }

    fn parts(s: &SpecialTokens, text: &str, parse_special: bool) -> Vec<Fragment<'static>> {
        let mut out = Vec::new();
        s.partition(text, parse_special, &[], |f| {
            out.push(match f {
                Fragment::Text(t) => Fragment::Text(Box::leak(t.to_owned().into_boxed_str())),
                Fragment::Token(id) => Fragment::Token(id),
            })
        });
        out
    }

    use Fragment::{Text, Token};
    use TokenType::*;

    #[test]
    fn control_tokens_only_with_parse_special() {
        let (_, s) = specials(&[("<|end|>", Control), ("x", Normal), ("<b>", UserDefined)]);
        assert_eq!(
            parts(&s, "a<|end|>b<b>", true),
            [Text("a"), Token(0), Text("b"), Token(2)]
        );
        assert_eq!(
            parts(&s, "a<|end|>b<b>", false),
            [Text("a<|end|>b"), Token(2)]
        );
        assert_eq!(parts(&s, "<|end|><|end|>", true), [Token(0), Token(0)]);
        assert_eq!(parts(&s, "", true), []);
        assert_eq!(parts(&s, "plain", true), [Text("plain")]);
    }

    #[test]
    fn longer_tokens_claim_first_then_leftmost_non_overlapping() {
        let (_, s) = specials(&[
            ("ab", Control),
            ("bcd", Control),
            ("  ", UserDefined),
            ("   ", UserDefined),
        ]);
        // "bcd" is longer, so it wins over the earlier-starting "ab".
        assert_eq!(parts(&s, "abcd", true), [Text("a"), Token(1)]);
        // Seven spaces: "   " twice (leftmost first), then nothing is left for "  " but one space.
        assert_eq!(
            parts(&s, "x       y", false),
            [Text("x"), Token(3), Token(3), Text(" y")]
        );
        assert_eq!(
            parts(&s, "x    y", false),
            [Text("x"), Token(3), Text(" y")]
        );
        assert_eq!(parts(&s, "x  y", false), [Text("x"), Token(2), Text("y")]);
    }
}
