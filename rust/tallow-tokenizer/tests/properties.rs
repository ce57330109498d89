//! Property tests on the real SmolLM2 (byte-level BPE) and Gemma 3 (SentencePiece) vocabularies.

mod common;

use std::sync::OnceLock;

use proptest::prelude::*;
use tallow_tokenizer::{StreamDecoder, TokenType, Tokenizer, QUOTE_CLOSE, QUOTE_OPEN};

fn smollm2() -> Option<&'static Tokenizer> {
    static T: OnceLock<Option<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| common::load(common::SMOLLM2)).as_ref()
}

fn gemma3() -> Option<&'static Tokenizer> {
    static T: OnceLock<Option<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| common::load(common::GEMMA3)).as_ref()
}

/// Bytes that have a single-byte token. SmolLM2's vocabulary lacks a few (0x04, 0xF1, ...);
/// text containing them cannot round-trip (llama.cpp and HF drop them too).
fn byte_has_token(t: &Tokenizer) -> [bool; 256] {
    let mut has = [false; 256];
    for id in 0..t.vocab_size() as u32 {
        if let (Some(TokenType::Normal), Some(&[b])) = (t.token_type(id), t.token_bytes(id)) {
            has[usize::from(b)] = true;
        }
    }
    has
}

fn representable(t: &Tokenizer, s: &str) -> String {
    let has = byte_has_token(t);
    s.chars()
        .filter(|c| c.to_string().bytes().all(|b| has[usize::from(b)]))
        .collect()
}

/// Arbitrary Unicode, plus text shaped like prose and code, which exercises merges more.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-zA-Z0-9 .,;:'\"()\\n\\t_=-]{0,200}",
        "(\\PC|\\s|'s|'ll| {2,6}|\\n{2,4}){0,80}",
        "(<\\|im_end\\|>|<\\|endoftext\\|>|<start_of_turn>|<end_of_turn>|<b>|\\n| |x|é|\u{2581}){0,30}",
    ]
}

#[test]
fn some_bytes_have_no_token_in_smollm2() {
    let Some(t) = smollm2() else { return };
    let has = byte_has_token(t);
    assert!(has[usize::from(b'a')] && has[0x0A] && has[0xC3]);
    assert!(
        !has[0x04] && !has[0xF1],
        "the filter above would be vacuous"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn smollm2_decode_inverts_encode(s in text(), parse_special: bool) {
        let Some(t) = smollm2() else { return Ok(()) };
        let s = representable(t, &s);
        let ids = t.encode(&s, false, parse_special);
        prop_assert_eq!(t.decode(&ids).unwrap(), s);
    }

    #[test]
    fn gemma3_decode_inverts_encode(s in text(), parse_special: bool) {
        let Some(t) = gemma3() else { return Ok(()) };
        let ids = t.encode(&s, false, parse_special);
        // SentencePiece writes spaces as U+2581 and reads that back as a space: a U+2581 of
        // the text comes back as a space (as with HF tokenizers and llama.cpp).
        prop_assert_eq!(t.decode(&ids).unwrap(), s.replace('\u{2581}', " "));
    }

    /// Arbitrary ids make arbitrary bytes, invalid UTF-8 included.
    #[test]
    fn stream_pieces_concatenate_to_decode(raw in prop::collection::vec(any::<u32>(), 0..60), s in text()) {
        for t in [smollm2(), gemma3()].into_iter().flatten() {
            let n = t.vocab_size() as u32;
            let random: Vec<u32> = raw.iter().map(|id| id % n).collect();
            for ids in [random, t.encode(&s, true, true)] {
                let mut stream = StreamDecoder::new();
                let mut text = String::new();
                for &id in &ids {
                    text.push_str(&stream.push(t, id).unwrap());
                }
                text.push_str(&stream.finish());
                prop_assert_eq!(text, t.decode(&ids).unwrap());
            }
        }
    }

    #[test]
    fn special_tokens_are_parsed_only_when_asked(a in text(), b in text()) {
        for (t, marker) in [(smollm2(), "<|im_end|>"), (gemma3(), "<end_of_turn>")] {
            let Some(t) = t else { continue };
            let id = t.token_id(marker).unwrap();
            let text = format!("{a}{marker}{b}");
            // Parsed: the marker is one id, and the text on each side is tokenized on its own.
            let parsed = t.encode(&text, false, true);
            let mut expected = t.encode(&a, false, true);
            expected.push(id);
            expected.extend(t.encode(&b, false, true));
            prop_assert_eq!(&parsed, &expected);
            // Not parsed: no control token comes out at all.
            let plain = t.encode(&text, false, false);
            prop_assert!(plain.iter().all(|&i| t.token_type(i) != Some(TokenType::Control)));
            prop_assert_eq!(t.decode(&plain).unwrap(), t.decode(&parsed).unwrap());
        }
    }

    /// A chat message quoted as chat prompts quote them is tokenized exactly as plain text,
    /// whatever control tokens it spells; the template's own control tokens around it are.
    #[test]
    fn quoted_text_is_plain_text(s in text(), before in text()) {
        for (t, marker) in [(smollm2(), "<|im_start|>"), (gemma3(), "<start_of_turn>")] {
            let Some(t) = t else { continue };
            let keep = |c: &char| *c != QUOTE_OPEN && *c != QUOTE_CLOSE;
            let s: String = s.chars().filter(keep).collect();
            let quoted = t.quote_special(&s).unwrap();
            prop_assert_eq!(t.encode_quoted(&quoted, false), t.encode(&s, false, false));
            let before: String = before.chars().filter(keep).collect();
            let prompt = format!("{before}{marker}{quoted}");
            let mut expected = t.encode(&before, false, true);
            expected.push(t.token_id(marker).unwrap());
            expected.extend(t.encode_quoted(&quoted, false));
            prop_assert_eq!(t.encode_quoted(&prompt, false), expected);
        }
    }

    #[test]
    fn add_special_adds_bos_as_the_model_asks(s in text()) {
        if let Some(t) = smollm2() {
            prop_assert!(!t.add_bos() && !t.add_eos());
            prop_assert_eq!(t.encode(&s, true, false), t.encode(&s, false, false));
        }
        if let Some(t) = gemma3() {
            prop_assert!(t.add_bos() && !t.add_eos());
            let mut expected = vec![t.bos_id().unwrap()];
            expected.extend(t.encode(&s, false, false));
            prop_assert_eq!(t.encode(&s, true, false), expected);
        }
    }
}

#[test]
fn model_metadata() {
    if let Some(t) = smollm2() {
        assert_eq!(t.vocab_size(), 49152);
        assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(2)));
        // <|endoftext|>, <|im_end|>, and <reponame> (a fill-in-the-middle repository marker).
        assert_eq!(t.end_of_generation_ids(), [0, 2, 4]);
        assert_eq!(t.token_text(2), Some("<|im_end|>"));
        assert_eq!(
            t.encode("<|im_start|>user\nHi<|im_end|>", false, true)[..2],
            [1, 4093]
        );
    }
    if let Some(t) = gemma3() {
        assert_eq!(t.vocab_size(), 262144);
        assert_eq!((t.bos_id(), t.eos_id()), (Some(2), Some(1)));
        // <eos>, <end_of_turn>, and </s>: llama.cpp stops at any token spelled "</s>", even
        // Gemma 3's HTML strikethrough tag.
        assert_eq!(t.end_of_generation_ids(), [1, 106, 212]);
        assert_eq!(t.token_text(106), Some("<end_of_turn>"));
        let ids = t.encode("Hello world", true, false);
        assert_eq!(ids[0], 2);
        assert_eq!(t.decode(&ids).unwrap(), "<bos>Hello world");
    }
}
