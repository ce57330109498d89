//! Which tokens end generation, found as llama.cpp's `llama_vocab::impl::load` finds them: the
//! ids named in the metadata, plus tokens recognised by their text (converters do not always
//! record end-of-turn markers). A token recognised this way becomes a control token, so that it
//! is matched in text only with `parse_special`, as in llama.cpp.

use crate::vocab::{TokenType, Vocab};

/// End-of-turn markers, used when `tokenizer.ggml.eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
/// Fill-in-the-middle padding / repository / file-separator markers; generation stops at them.
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Every token with one of these texts ends generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// The special token ids from the metadata that bear on the end of generation.
pub(crate) struct MarkerIds {
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) fim_pad: Option<u32>,
    pub(crate) fim_rep: Option<u32>,
    pub(crate) fim_sep: Option<u32>,
}

/// The sorted end-of-generation ids. Updates token types in `vocab` as llama.cpp does.
pub(crate) fn end_of_generation_ids(vocab: &mut Vocab, ids: MarkerIds) -> Vec<u32> {
    // llama.cpp takes whichever match its hash map yields first; this takes the lowest id.
    let mut find = |given: Option<u32>, texts: &[&str]| {
        given.or_else(|| {
            let id = texts.iter().filter_map(|text| vocab.id(text)).min()?;
            promote_to_control(vocab, id);
            Some(id)
        })
    };
    let eot = find(ids.eot, EOT_TEXTS);
    let eom = find(ids.eom, EOM_TEXTS);
    let fim_pad = find(ids.fim_pad, FIM_PAD_TEXTS);
    let fim_rep = find(ids.fim_rep, FIM_REP_TEXTS);
    let fim_sep = find(ids.fim_sep, FIM_SEP_TEXTS);

    let by_text: Vec<u32> = EOG_TEXTS.iter().filter_map(|text| vocab.id(text)).collect();
    for &id in &by_text {
        promote_to_control(vocab, id);
    }
    let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep, ids.eos, eot, eom]
        .into_iter()
        .flatten()
        .chain(by_text)
        .collect();
    eog.sort_unstable();
    eog.dedup();

    // gpt-oss and solar-open end a message with <|end|> but a turn with <|return|>/<|call|>:
    // there <|end|> is an ordinary (user-defined) token.
    let has = |text: &str| eog.iter().any(|&id| vocab.text(id) == Some(text));
    let end_is_text =
        (has("<|call|>") || has("<|calls|>")) && (has("<|return|>") || has("<|flush|>"));
    // Gemma 4 and PLaMo have an ordinary </s> token.
    let s_is_text = has("<|tool_response>") || has("<|plamo:eos|>");
    if end_is_text {
        remove(vocab, &mut eog, "<|end|>", TokenType::UserDefined);
    }
    if s_is_text {
        remove(vocab, &mut eog, "</s>", TokenType::Normal);
    }
    eog
}

fn promote_to_control(vocab: &mut Vocab, id: u32) {
    if vocab.token_type(id) != Some(TokenType::Control) {
        vocab.set_token_type(id, TokenType::Control);
    }
}

fn remove(vocab: &mut Vocab, eog: &mut Vec<u32>, text: &str, now: TokenType) {
    if let Some(pos) = eog.iter().position(|&id| vocab.text(id) == Some(text)) {
        vocab.set_token_type(eog[pos], now);
        eog.remove(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[(&str, TokenType)]) -> Vocab {
        Vocab::new(
            tokens.iter().map(|t| t.0.to_string()).collect(),
            tokens.iter().map(|t| t.1).collect(),
        )
        .unwrap()
    }

    fn none() -> MarkerIds {
        MarkerIds {
            eos: None,
            eot: None,
            eom: None,
            fim_pad: None,
            fim_rep: None,
            fim_sep: None,
        }
    }

    #[test]
    fn eos_and_known_markers_end_generation() {
        use TokenType::*;
        let mut v = vocab(&[
            ("<|endoftext|>", Control),
            ("<|im_start|>", Control),
            ("<|im_end|>", Normal),
            ("<reponame>", Control),
            ("hello", Normal),
        ]);
        let eog = end_of_generation_ids(
            &mut v,
            MarkerIds {
                eos: Some(4),
                ..none()
            },
        );
        assert_eq!(eog, [0, 2, 3, 4]);
        // A marker recognised by its text becomes a control token.
        assert_eq!(v.token_type(2), Some(Control));
        assert_eq!(v.token_type(1), Some(Control));
    }

    #[test]
    fn end_is_not_a_stop_token_next_to_return_and_call() {
        use TokenType::*;
        let mut v = vocab(&[
            ("<|end|>", Control),
            ("<|return|>", Control),
            ("<|call|>", Control),
        ]);
        let eog = end_of_generation_ids(&mut v, none());
        assert_eq!(eog, [1, 2]);
        assert_eq!(v.token_type(0), Some(UserDefined));
    }
}
