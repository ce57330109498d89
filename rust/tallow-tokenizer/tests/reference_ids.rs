//! Ids must equal llama.cpp's (`llama-tokenize --ids --no-bos --no-parse-special`) on every
//! reference text in `shared/reference/tokenizer`.

mod common;

use tallow_tokenizer::Tokenizer;

fn check_all(tokenizer: &Tokenizer, tag: &str) {
    for (text_path, ids_path) in common::reference_cases(tag) {
        let text = common::read_text(&text_path);
        let expected = common::read_ids(&ids_path);
        let ids = tokenizer.encode(&text, false, false);
        if let Some(i) = ids.iter().zip(&expected).position(|(a, b)| a != b) {
            let lo = i.saturating_sub(3);
            panic!(
                "{}: first difference at id #{i}: tallow {:?} vs llama.cpp {:?} (tokens {:?} vs {:?})",
                text_path.display(),
                &ids[lo..(i + 4).min(ids.len())],
                &expected[lo..(i + 4).min(expected.len())],
                ids[lo..(i + 4).min(ids.len())].iter().map(|&id| tokenizer.token_text(id)).collect::<Vec<_>>(),
                expected[lo..(i + 4).min(expected.len())].iter().map(|&id| tokenizer.token_text(id)).collect::<Vec<_>>(),
            );
        }
        assert_eq!(
            ids.len(),
            expected.len(),
            "{}: token count",
            text_path.display()
        );
        // Decoding gives the text back.
        assert_eq!(
            tokenizer.decode(&ids).unwrap(),
            text,
            "{}",
            text_path.display()
        );
    }
}

#[test]
fn smollm2_matches_llama_cpp() {
    let Some(tokenizer) = common::load(common::SMOLLM2) else {
        return;
    };
    check_all(&tokenizer, "smollm2");
}

#[test]
fn gemma3_matches_llama_cpp() {
    let Some(tokenizer) = common::load(common::GEMMA3) else {
        return;
    };
    check_all(&tokenizer, "gemma3");
}
