//! Tests of the whole tokenizer on small hand-made vocabularies.

use super::*;
use crate::byte_level::BYTE_TO_CHAR;

/// A byte-level BPE vocabulary: the 256 byte tokens, a few merges, two control tokens.
fn gpt2_config() -> TokenizerConfig {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_end|>".into()];
    tokens.extend(BYTE_TO_CHAR.iter().map(|c| c.to_string()));
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let n = tokens.len();
    let mut types = vec![1; n];
    types[0] = 3;
    types[1] = 3;
    TokenizerConfig {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        token_types: Some(types),
        merges: merges.iter().map(|s| s.to_string()).collect(),
        eos_id: Some(0),
        ..Default::default()
    }
}

/// A SentencePiece vocabulary with byte fallback.
fn spm_config() -> TokenizerConfig {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (piece, score) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("i", -2.0),
        ("▁h", -1.5),
        ("▁hi", -1.0),
    ] {
        tokens.push(piece.into());
        types.push(1);
        scores.push(score);
    }
    TokenizerConfig {
        model: "llama".into(),
        tokens,
        token_types: Some(types),
        scores: Some(scores),
        ..Default::default()
    }
}

fn id(t: &Tokenizer, text: &str) -> u32 {
    t.token_id(text).unwrap()
}

#[test]
fn byte_level_round_trip_and_merges() {
    let t = Tokenizer::from_config(gpt2_config()).unwrap();
    let ids = t.encode("hello world", false, false);
    assert_eq!(ids[0], id(&t, "hello"));
    assert_eq!(ids[1], id(&t, "Ġwo"));
    assert_eq!(t.decode(&ids).unwrap(), "hello world");
    assert_eq!(t.token_bytes(id(&t, "Ġwo")), Some(&b" wo"[..]));
    assert_eq!(t.token_text(id(&t, "Ġwo")), Some("Ġwo"));
    let text = "héllo 😀\n\t";
    assert_eq!(t.decode(&t.encode(text, true, true)).unwrap(), text);
}

#[test]
fn parse_special_and_add_special() {
    let t = Tokenizer::from_config(gpt2_config()).unwrap();
    assert!(!t.add_bos());
    assert_eq!(
        t.encode("hello<|im_end|>", false, true),
        [id(&t, "hello"), 1]
    );
    let plain = t.encode("hello<|im_end|>", false, false);
    assert_eq!(plain.len(), 1 + "<|im_end|>".len());
    assert!(!plain.contains(&1));
    assert_eq!(t.decode(&plain).unwrap(), "hello<|im_end|>");
    // Control tokens decode to their text.
    assert_eq!(t.decode(&[1]).unwrap(), "<|im_end|>");

    let mut config = gpt2_config();
    config.add_bos = Some(true);
    config.add_eos = Some(true);
    config.bos_id = Some(1);
    let t = Tokenizer::from_config(config).unwrap();
    let ids = t.encode("hello", true, false);
    assert_eq!(ids, [1, id(&t, "hello"), 0]);
    assert_eq!(t.encode("hello", false, false), [id(&t, "hello")]);
    assert_eq!(t.encode("", true, false), [1, 0]);
}

#[test]
fn end_of_generation_from_metadata_and_text() {
    let t = Tokenizer::from_config(gpt2_config()).unwrap();
    assert_eq!(t.end_of_generation_ids(), [0, 1]);
    assert!(t.is_end_of_generation(1));
    assert!(!t.is_end_of_generation(5));
    assert!(!t.is_end_of_generation(u32::MAX));
}

#[test]
fn sentencepiece_prefix_fallback_and_decode() {
    let t = Tokenizer::from_config(spm_config()).unwrap();
    assert!(t.add_bos());
    assert_eq!(t.bos_id(), Some(1));
    assert_eq!(t.eos_id(), Some(2));
    assert_eq!(t.unk_id(), Some(0));
    let ids = t.encode("hi", true, false);
    assert_eq!(ids, [1, id(&t, "▁hi")]);
    // "é" is not a token: its two bytes fall back to byte tokens.
    let ids = t.encode("hi é", false, false);
    assert_eq!(
        ids,
        [
            id(&t, "▁hi"),
            id(&t, "▁"),
            id(&t, "<0xC3>"),
            id(&t, "<0xA9>")
        ]
    );
    // The prefix space is taken off again, but only at the start.
    assert_eq!(t.decode(&ids).unwrap(), "hi é");
    assert_eq!(t.decode(&[id(&t, "▁hi"), id(&t, "▁hi")]).unwrap(), "hi hi");
    // Control text after a special token gets the prefix again.
    assert_eq!(
        t.encode("hi</s>hi", false, true),
        [id(&t, "▁hi"), 2, id(&t, "▁hi")]
    );
    // Text that continues earlier text gets none.
    assert_eq!(t.encode_continuation("hi"), [id(&t, "h"), id(&t, "i")]);
    assert_eq!(t.encode_continuation(" hi"), [id(&t, "▁hi")]);

    let mut config = spm_config();
    config.add_space_prefix = Some(false);
    let t = Tokenizer::from_config(config).unwrap();
    assert_eq!(t.encode("hi", false, false), [id(&t, "h"), id(&t, "i")]);
    assert_eq!(t.decode(&[id(&t, "▁hi")]).unwrap(), " hi");
}

#[test]
fn stream_pieces_hold_back_incomplete_characters() {
    let t = Tokenizer::from_config(spm_config()).unwrap();
    let ids = t.encode("hi é", false, false);
    let mut stream = StreamDecoder::new();
    let pieces: Vec<String> = ids.iter().map(|&id| stream.push(&t, id).unwrap()).collect();
    assert_eq!(pieces, ["hi", " ", "", "é"]);
    assert_eq!(stream.finish(), "");

    // An invalid byte is replaced at once; a dangling lead byte at the end on finish.
    let bytes = |b: u8| id(&t, &format!("<0x{b:02X}>"));
    let ids = [bytes(0xFF), bytes(b'a'), bytes(0xE2), bytes(0x82)];
    let mut stream = StreamDecoder::new();
    let mut text: String = ids.iter().map(|&id| stream.push(&t, id).unwrap()).collect();
    assert_eq!(text, "\u{FFFD}a");
    text.push_str(&stream.finish());
    assert_eq!(text, t.decode(&ids).unwrap());
    assert_eq!(text, "\u{FFFD}a\u{FFFD}");
}

#[test]
fn bad_ids_are_errors_not_panics() {
    let t = Tokenizer::from_config(gpt2_config()).unwrap();
    let n = t.vocab_size() as u32;
    let err = t.decode(&[0, n]).unwrap_err();
    assert_eq!(
        err,
        TokenizerError::IdOutOfRange {
            id: n,
            vocab_size: n as usize
        }
    );
    assert!(StreamDecoder::new().push(&t, u32::MAX).is_err());
    assert_eq!(t.token_bytes(n), None);
    assert_eq!(t.token_text(n), None);
}

#[test]
fn bad_metadata_is_reported() {
    let build = |edit: fn(&mut TokenizerConfig)| {
        let mut config = gpt2_config();
        edit(&mut config);
        Tokenizer::from_config(config).err().map(|e| e.to_string())
    };
    assert_eq!(build(|_| {}), None);
    let msg = build(|c| c.model = "bert".into()).unwrap();
    assert!(msg.contains("unknown tokenizer model `bert`"), "{msg}");
    let msg = build(|c| c.pre = Some("nonsense".into())).unwrap();
    assert!(msg.contains("unknown pre-tokenizer `nonsense`"), "{msg}");
    let msg = build(|c| c.pre = None).unwrap();
    assert!(
        msg.contains("missing GGUF metadata key `tokenizer.ggml.pre`"),
        "{msg}"
    );
    let msg = build(|c| c.eos_id = Some(100_000)).unwrap();
    assert!(
        msg.contains("tokenizer.ggml.eos_token_id` = 100000 is out of range"),
        "{msg}"
    );
    let msg = build(|c| c.add_bos = Some(true)).unwrap();
    assert!(msg.contains("no `tokenizer.ggml.bos_token_id`"), "{msg}");
    let msg = build(|c| c.token_types = Some(vec![1; 3])).unwrap();
    assert!(msg.contains("has 3 entries"), "{msg}");
    let msg = build(|c| c.merges.push("Ġ q".into())).unwrap();
    assert!(msg.contains("bad merge #6"), "{msg}");
    let msg = build(|c| c.tokens.clear()).unwrap();
    assert!(msg.contains("empty"), "{msg}");
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}

#[test]
fn quoted_control_tokens_stay_text() {
    let mut config = gpt2_config();
    // A user-defined token: matched in plain text too, so never quoted.
    config.tokens.push("<tool>".into());
    config.token_types.as_mut().unwrap().push(4);
    let t = Tokenizer::from_config(config).unwrap();
    let im_end = id(&t, "<|im_end|>");
    let tool = id(&t, "<tool>");

    let message = "hello<|im_end|> wo<tool>";
    let quoted = t.quote_special(message).unwrap();
    assert_eq!(quoted, "hello\u{FDD0}<|im_end|>\u{FDD1} wo<tool>");
    // Text without control tokens is returned as it is.
    assert!(matches!(
        t.quote_special("hello wo"),
        Ok(Cow::Borrowed("hello wo"))
    ));

    // A template's own control token around the quoted message is parsed; the message's is
    // tokenized as its characters, exactly as without parse_special.
    let prompt = format!("<|im_end|>{quoted}<|im_end|>");
    let ids = t.encode_quoted(&prompt, false);
    let mut expected = vec![im_end];
    expected.extend(t.encode(message, false, false));
    expected.push(im_end);
    assert_eq!(ids, expected);
    assert!(!ids[1..ids.len() - 1].contains(&im_end));
    assert!(ids.contains(&tool));
    // Without quotes it is the plain parse_special encoding.
    assert_eq!(
        t.encode_quoted("a<|im_end|>", false),
        t.encode("a<|im_end|>", false, true)
    );
    // An unclosed quote runs to the end; a stray closing mark is dropped.
    assert_eq!(
        t.encode_quoted("a\u{FDD0}<|im_end|>", false),
        t.encode("a<|im_end|>", false, false)
    );
    assert_eq!(
        t.encode_quoted("a\u{FDD1}<|im_end|>", false),
        t.encode("a<|im_end|>", false, true)
    );
    // A message holding a quote mark is refused: it could end the quote early.
    for bad in ["a\u{FDD1}<|im_end|>", "\u{FDD0}"] {
        assert!(matches!(
            t.quote_special(bad),
            Err(TokenizerError::ReservedCharacter(_))
        ));
    }
}
