//! Pre-tokenizers: split text into the pieces ("words") that byte-level BPE merges within.
//!
//! Each one is a hand-written scanner equivalent to a regex of the GPT-2 family (no regex engine,
//! no backtracking: one pass, one code point of lookahead). The scanners follow llama.cpp's
//! `unicode_regex_split_custom_*` functions, which agree with the HF `tokenizers` regexes.
//! Pure-ASCII text never touches the Unicode tables.

use crate::unicode_class::{classify, CharClass};
use crate::TokenizerError;

/// The pre-tokenizer names (`tokenizer.ggml.pre`) this crate knows, for error messages.
pub(crate) const SUPPORTED_NAMES: &str = "gpt-2, smollm, llama-bpe, qwen2 and their aliases";

/// A pre-tokenizer selected by `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// Every `\p{N}` code point is its own piece, then [`PreTokenizer::Gpt2`] runs on the text
    /// between them (HF: `Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]`).
    Gpt2IndividualDigits,
    /// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// Qwen 2: the Llama 3 regex with `\p{N}` instead of `\p{N}{1,3}`.
    Qwen2,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value, with llama.cpp's aliases.
    ///
    /// llama.cpp's `default` (used when the key is missing) is a chain of four regexes that no
    /// current model uses; it is rejected like any unknown name rather than approximated.
    pub fn from_name(name: &str) -> Result<Self, TokenizerError> {
        Ok(match name {
            "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "exaone4" | "trillion"
            | "granite-docling" | "mellum" | "gigachat" | "a.x-4.0" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => Self::Gpt2IndividualDigits,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "dbrx" | "smaug-bpe" => Self::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" => Self::Qwen2,
            _ => return Err(TokenizerError::UnknownPreTokenizer(name.to_owned())),
        })
    }

    /// Calls `piece` with each piece of `text`, in order; the pieces concatenate to `text`.
    pub fn split<'t>(&self, text: &'t str, mut piece: impl FnMut(&'t str)) {
        let mut emit = |start: usize, end: usize| piece(&text[start..end]);
        match self {
            Self::Gpt2 => split_gpt2(text, false, &mut emit),
            Self::Gpt2IndividualDigits => split_gpt2(text, true, &mut emit),
            Self::Llama3 => split_llama3(text, 3, &mut emit),
            Self::Qwen2 => split_llama3(text, 1, &mut emit),
        }
    }
}

/// What the scanner sees at a byte offset: a code point's class, or the end of the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Look {
    Class(CharClass),
    End,
}

/// Cursor helpers over the bytes of valid UTF-8 text.
struct Scanner<'t> {
    bytes: &'t [u8],
    /// In `Gpt2IndividualDigits`, a number ends the segment the GPT-2 regex sees, exactly as if
    /// the text had been cut there first.
    numbers_end_segments: bool,
}

impl Scanner<'_> {
    /// The class of the code point starting at `pos` and its length in bytes.
    #[inline]
    fn class_at(&self, pos: usize) -> (CharClass, usize) {
        let b0 = self.bytes[pos];
        if b0 < 0x80 {
            return (classify(char::from(b0)), 1);
        }
        let (cp, len) = if b0 < 0xE0 {
            (
                u32::from(b0 & 0x1F) << 6 | u32::from(self.bytes[pos + 1] & 0x3F),
                2,
            )
        } else if b0 < 0xF0 {
            (
                u32::from(b0 & 0x0F) << 12
                    | u32::from(self.bytes[pos + 1] & 0x3F) << 6
                    | u32::from(self.bytes[pos + 2] & 0x3F),
                3,
            )
        } else {
            (
                u32::from(b0 & 0x07) << 18
                    | u32::from(self.bytes[pos + 1] & 0x3F) << 12
                    | u32::from(self.bytes[pos + 2] & 0x3F) << 6
                    | u32::from(self.bytes[pos + 3] & 0x3F),
                4,
            )
        };
        // The input is a `&str`, so the decoded value is always a valid scalar value.
        let class = char::from_u32(cp).map_or(CharClass::Other, classify);
        (class, len)
    }

    /// Lookahead: the class at `pos`, or `End` past the text (or at a segment-ending number).
    #[inline]
    fn look(&self, pos: usize) -> (Look, usize) {
        if pos >= self.bytes.len() {
            return (Look::End, 0);
        }
        match self.class_at(pos) {
            (CharClass::Number, len) if self.numbers_end_segments => (Look::End, len),
            (class, len) => (Look::Class(class), len),
        }
    }

    /// End of the run of code points of `class` starting at `pos`.
    #[inline]
    fn run_end(&self, mut pos: usize, class: CharClass) -> usize {
        loop {
            match self.look(pos) {
                (Look::Class(c), len) if c == class => pos += len,
                _ => return pos,
            }
        }
    }

    /// Length of an English contraction (`'s 't 're 've 'm 'll 'd`) starting at the apostrophe
    /// at `pos`, if there is one. `any_case` accepts upper-case letters too (Llama 3).
    fn contraction_len(&self, pos: usize, any_case: bool) -> Option<usize> {
        let at = |i: usize| {
            self.bytes
                .get(pos + i)
                .map(|&b| if any_case { b.to_ascii_lowercase() } else { b })
        };
        match (at(1)?, at(2)) {
            (b's' | b't' | b'm' | b'd', _) => Some(2),
            (b'r', Some(b'e')) | (b'v', Some(b'e')) | (b'l', Some(b'l')) => Some(3),
            _ => None,
        }
    }

    /// A whitespace run starting at `pos`: `(end of the run, start of its last code point,
    /// number of code points, end of its last '\r' or '\n' if any)`.
    fn whitespace_run(&self, pos: usize) -> (usize, usize, usize, Option<usize>) {
        let (mut end, mut last_start, mut count, mut newline_end) = (pos, pos, 0, None);
        while let (Look::Class(CharClass::Whitespace), len) = self.look(end) {
            if matches!(self.bytes[end], b'\r' | b'\n') {
                newline_end = Some(end + 1);
            }
            last_start = end;
            end += len;
            count += 1;
        }
        (end, last_start, count, newline_end)
    }

    /// `\s+(?!\S)|\s+` for the whitespace run `whitespace_run` found: the end of the match.
    /// A run followed by a non-space keeps its last code point for the next piece (` word`).
    fn whitespace_piece(&self, end: usize, last_start: usize, count: usize) -> usize {
        if count > 1 && self.look(end).0 != Look::End {
            last_start
        } else {
            end
        }
    }
}

fn split_gpt2(text: &str, individual_digits: bool, emit: &mut impl FnMut(usize, usize)) {
    let s = Scanner {
        bytes: text.as_bytes(),
        numbers_end_segments: individual_digits,
    };
    let n = s.bytes.len();
    let mut pos = 0;
    while pos < n {
        let (class, len) = s.class_at(pos);
        let end = if individual_digits && class == CharClass::Number {
            pos + len
        } else if let Some(len) = (s.bytes[pos] == b'\'')
            .then(|| s.contraction_len(pos, false))
            .flatten()
        {
            pos + len
        } else {
            // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: an optional leading space, then a run.
            let (body, body_class) = if s.bytes[pos] == b' ' {
                (pos + 1, s.look(pos + 1).0)
            } else {
                (pos, Look::Class(class))
            };
            match body_class {
                Look::Class(c @ (CharClass::Letter | CharClass::Number | CharClass::Other)) => {
                    s.run_end(body, c)
                }
                _ => {
                    let (end, last_start, count, _) = s.whitespace_run(pos);
                    s.whitespace_piece(end, last_start, count)
                }
            }
        };
        emit(pos, end);
        pos = end;
    }
}

fn split_llama3(text: &str, max_digits: usize, emit: &mut impl FnMut(usize, usize)) {
    let s = Scanner {
        bytes: text.as_bytes(),
        numbers_end_segments: false,
    };
    let n = s.bytes.len();
    let mut pos = 0;
    while pos < n {
        let (class, len) = s.class_at(pos);
        let byte = s.bytes[pos];
        let is_newline = matches!(byte, b'\r' | b'\n');
        let end = if let Some(len) = (byte == b'\'')
            .then(|| s.contraction_len(pos, true))
            .flatten()
        {
            pos + len
        } else if !is_newline
            && class != CharClass::Number
            && (class == CharClass::Letter || s.look(pos + len).0 == Look::Class(CharClass::Letter))
        {
            // `[^\r\n\p{L}\p{N}]?\p{L}+`
            s.run_end(pos + len, CharClass::Letter)
        } else if class == CharClass::Number {
            // `\p{N}{1,max_digits}`
            let mut end = pos;
            for _ in 0..max_digits {
                match s.look(end) {
                    (Look::Class(CharClass::Number), len) => end += len,
                    _ => break,
                }
            }
            end
        } else {
            let (body, body_class) = if byte == b' ' {
                (pos + 1, s.look(pos + 1).0)
            } else {
                (pos, Look::Class(class))
            };
            if body_class == Look::Class(CharClass::Other) {
                // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
                let mut end = s.run_end(body, CharClass::Other);
                while end < n && matches!(s.bytes[end], b'\r' | b'\n') {
                    end += 1;
                }
                end
            } else {
                // `\s*[\r\n]+|\s+(?!\S)|\s+`
                let (end, last_start, count, newline_end) = s.whitespace_run(pos);
                newline_end.unwrap_or_else(|| s.whitespace_piece(end, last_start, count))
            }
        };
        emit(pos, end);
        pos = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        pre.split(text, |p| out.push(p));
        out
    }

    #[test]
    fn gpt2_hand_checked_splits() {
        let p = |t| pieces(PreTokenizer::Gpt2, t);
        assert_eq!(p("Hello world"), ["Hello", " world"]);
        assert_eq!(p("Hello  world"), ["Hello", " ", " world"]);
        assert_eq!(p("a   b"), ["a", "  ", " b"]);
        assert_eq!(p("a \n b"), ["a", " \n", " b"]);
        assert_eq!(p("trailing   "), ["trailing", "   "]);
        assert_eq!(p("x\n\ny"), ["x", "\n", "\n", "y"]);
        assert_eq!(
            p("I'm you're it's"),
            ["I", "'m", " you", "'re", " it", "'s"]
        );
        assert_eq!(p("DON'T"), ["DON", "'", "T"]);
        assert_eq!(p("x 123abc"), ["x", " 123", "abc"]);
        assert_eq!(p("f(x) = 4;"), ["f", "(", "x", ")", " =", " 4", ";"]);
        assert_eq!(p("  def"), [" ", " def"]);
        assert_eq!(p("héllo wörld"), ["héllo", " wörld"]);
        assert_eq!(p("中文 字"), ["中文", " 字"]);
        assert_eq!(p("a\u{a0}b"), ["a", "\u{a0}", "b"]);
        assert_eq!(p("🙂🙂 ok"), ["🙂🙂", " ok"]);
        assert_eq!(p("..."), ["..."]);
        assert_eq!(p(" "), [" "]);
        assert_eq!(p(""), Vec::<&str>::new());
    }

    #[test]
    fn individual_digits_hand_checked_splits() {
        let p = |t| pieces(PreTokenizer::Gpt2IndividualDigits, t);
        assert_eq!(p("x 123abc"), ["x", " ", "1", "2", "3", "abc"]);
        assert_eq!(p("a  12"), ["a", "  ", "1", "2"]);
        assert_eq!(p("v2.0"), ["v", "2", ".", "0"]);
        assert_eq!(p("٣٤"), ["٣", "٤"]);
        assert_eq!(p("x½y"), ["x", "½", "y"]);
        assert_eq!(p("it's 5'll"), ["it", "'s", " ", "5", "'ll"]);
        assert_eq!(p("Hello  world"), ["Hello", " ", " world"]);
    }

    #[test]
    fn llama3_hand_checked_splits() {
        let p = |t| pieces(PreTokenizer::Llama3, t);
        assert_eq!(p("Hello world"), ["Hello", " world"]);
        assert_eq!(p("DON'T"), ["DON", "'T"]);
        assert_eq!(p("12345"), ["123", "45"]);
        assert_eq!(p("(word)"), ["(word", ")"]);
        assert_eq!(p("a\n\n  b"), ["a", "\n\n", " ", " b"]);
        assert_eq!(p("x ..\n\ny"), ["x", " ..\n\n", "y"]);
        assert_eq!(p("a \t b"), ["a", " \t", " b"]);
        assert_eq!(p("end  "), ["end", "  "]);
        assert_eq!(p("\tfoo"), ["\tfoo"]);
        assert_eq!(p("x 42"), ["x", " ", "42"]);
    }

    #[test]
    fn qwen2_splits_every_digit() {
        assert_eq!(
            pieces(PreTokenizer::Qwen2, "x 2024"),
            ["x", " ", "2", "0", "2", "4"]
        );
    }

    #[test]
    fn names_and_aliases() {
        assert_eq!(
            PreTokenizer::from_name("smollm").unwrap(),
            PreTokenizer::Gpt2IndividualDigits
        );
        assert_eq!(
            PreTokenizer::from_name("gpt-2").unwrap(),
            PreTokenizer::Gpt2
        );
        assert_eq!(
            PreTokenizer::from_name("llama-bpe").unwrap(),
            PreTokenizer::Llama3
        );
        assert_eq!(
            PreTokenizer::from_name("qwen2").unwrap(),
            PreTokenizer::Qwen2
        );
        let err = PreTokenizer::from_name("default").unwrap_err();
        assert_eq!(err, TokenizerError::UnknownPreTokenizer("default".into()));
        assert!(err.to_string().contains("`default`"), "{err}");
    }
}
