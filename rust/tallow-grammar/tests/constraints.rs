//! Constraints on smollm2-135m's, gemma3-270m's and a SentencePiece vocabulary: outputs decoded under random logits (any token
//! the constraint allows may win) always parse as asked, and bad inputs are clear errors.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};
use tallow_grammar::{limits, GrammarCompiler, GrammarError, Structured};
use tallow_tokenizer::Tokenizer;

const SMOLLM2: &str = "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA3: &str = "gemma3-270m/gemma-3-270m-q4_k_m.gguf";
/// A tiny random model's SentencePiece vocabulary of 512 tokens, with the space prefix: text
/// that continues an output must not get one.
const MISTRAL_SPM: &str = "arch/mistral/mistral-q8_0.gguf";

/// The tokenizer of `model`: under `$TALLOW_HOME/models` (`~/.cache/tallow` by default), or
/// for `arch/...` under the shared reference directory (`$TALLOW_REFERENCE_DIR`).
fn tokenizer(model: &str) -> Arc<Tokenizer> {
    let path = match model.strip_prefix("arch/") {
        Some(arch) => std::env::var_os("TALLOW_REFERENCE_DIR")
            .map_or_else(
                || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference"),
                PathBuf::from,
            )
            .join("arch")
            .join(arch),
        None => std::env::var_os("TALLOW_HOME")
            .map_or_else(
                || {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/tallow")
                },
                PathBuf::from,
            )
            .join("models")
            .join(model),
    };
    let file = tallow_gguf::GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("{e} (run `tallow pull` first)"));
    Arc::new(Tokenizer::from_gguf(&file).unwrap())
}

/// A small xorshift generator: logits that differ at every step and every seed.
struct Noise(u64);

impl Noise {
    fn logits(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 8.0
            })
            .collect()
    }
}

/// The text generated greedily from random logits under `structured`, to the end of
/// generation (which must come within `max_tokens`).
fn generate(
    compiler: &GrammarCompiler,
    tokenizer: &Tokenizer,
    structured: &Structured,
    seed: u64,
    max_tokens: usize,
) -> String {
    let mut constraint = compiler.compile(structured).unwrap();
    let mut noise = Noise(seed | 1);
    let mut tokens = Vec::new();
    for _ in 0..max_tokens {
        let mut logits = noise.logits(tokenizer.vocab_size());
        // End-of-generation tokens as likely as any, so outputs end where they may.
        for &t in tokenizer.end_of_generation_ids() {
            logits[t as usize] = 7.0;
        }
        constraint.mask(&mut logits).unwrap();
        let token = tallow_pick(&logits);
        constraint.accept(token).unwrap();
        if tokenizer.is_end_of_generation(token) {
            assert!(
                constraint.is_complete(),
                "ended before the output was complete"
            );
            return tokenizer.decode(&tokens).unwrap();
        }
        tokens.push(token);
    }
    panic!(
        "no end after {max_tokens} tokens: {:?}",
        tokenizer.decode(&tokens).unwrap()
    );
}

/// The first largest logit.
fn tallow_pick(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    assert!(
        logits[best] > f32::NEG_INFINITY,
        "the constraint allowed nothing"
    );
    best as u32
}

#[test]
fn json_follows_the_schema() {
    for model in [SMOLLM2, GEMMA3, MISTRAL_SPM] {
        json_follows_the_schema_with(model);
    }
}

fn json_follows_the_schema_with(model: &str) {
    let tokenizer = tokenizer(model);
    let compiler = GrammarCompiler::new(Arc::clone(&tokenizer)).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "size": {"enum": ["small", "large"]},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
            "inner": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["x"],
                "additionalProperties": false
            }
        },
        "required": ["name", "size", "ok", "tags", "inner"],
        "additionalProperties": false
    });
    for seed in 0..8 {
        let text = generate(
            &compiler,
            &tokenizer,
            &Structured::JsonSchema(schema.clone()),
            seed,
            300,
        );
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(
            value["name"]
                .as_str()
                .is_some_and(|s| s.chars().count() <= 8),
            "{text}"
        );
        assert!(
            ["small", "large"].contains(&value["size"].as_str().unwrap()),
            "{text}"
        );
        assert!(value["ok"].is_boolean(), "{text}");
        let tags = value["tags"].as_array().unwrap();
        assert!(
            tags.len() <= 2
                && tags
                    .iter()
                    .all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 4))
        );
        assert!(
            value["inner"]["x"].as_u64().is_some_and(|x| x <= 99),
            "{text}"
        );
        assert_eq!(value.as_object().unwrap().len(), 5, "{text}");
    }
    if model != MISTRAL_SPM {
        // Any object, unbounded: random logits over a vocabulary of 512 short pieces do not
        // close one within the budget.
        let text = generate(&compiler, &tokenizer, &Structured::JsonObject, 3, 300);
        assert!(
            serde_json::from_str::<Value>(&text).unwrap().is_object(),
            "{text}"
        );
    }
}

#[test]
fn choices_and_regular_expressions_match_whole() {
    for model in [SMOLLM2, GEMMA3, MISTRAL_SPM] {
        choices_and_regular_expressions_match_whole_with(model);
    }
}

fn choices_and_regular_expressions_match_whole_with(model: &str) {
    let tokenizer = tokenizer(model);
    let compiler = GrammarCompiler::new(Arc::clone(&tokenizer)).unwrap();
    let choices = vec!["yes".to_string(), "no (maybe)".into(), "a|b.*".into()];
    let mut seen = std::collections::HashSet::new();
    for seed in 0..12 {
        let text = generate(
            &compiler,
            &tokenizer,
            &Structured::Choice(choices.clone()),
            seed,
            20,
        );
        assert!(choices.contains(&text), "{text:?}");
        seen.insert(text);
    }
    assert!(
        seen.len() >= 2,
        "random logits pick different choices: {seen:?}"
    );
    let pattern = Structured::Regex("[0-9]{3}-[a-z]{2,4}".into());
    for seed in 0..6 {
        let text = generate(&compiler, &tokenizer, &pattern, seed, 20);
        let (digits, letters) = text.split_once('-').unwrap();
        assert!(
            digits.len() == 3 && digits.chars().all(|c| c.is_ascii_digit()),
            "{text}"
        );
        assert!((2..=4).contains(&letters.len()), "{text}");
        assert!(letters.chars().all(|c| c.is_ascii_lowercase()), "{text}");
    }
    let lark = Structured::Lark("start: \"(\" NUM (\"+\" NUM)* \")\"\nNUM: /[1-9]/".into());
    let text = generate(&compiler, &tokenizer, &lark, 5, 40);
    assert!(text.starts_with('(') && text.ends_with(')'), "{text}");
}

#[test]
fn bad_constraints_are_compile_errors() {
    let compiler = GrammarCompiler::new(tokenizer(SMOLLM2)).unwrap();
    let bad = [
        (Structured::Regex("(unclosed".into()), "regular expression"),
        (Structured::JsonSchema(json!({"type": 5})), "JSON schema"),
        (Structured::JsonSchema(json!([1, 2])), "JSON schema"),
        (Structured::Lark("start: undefined_rule".into()), "grammar"),
        (Structured::Choice(Vec::new()), "choice"),
        // A lexer larger than the limits allow: refused, not built.
        (
            Structured::Choice((0..200_000).map(|i| format!("word{i}")).collect()),
            "choice",
        ),
    ];
    for (structured, kind) in bad {
        // A check gives the error that compiling does, and makes no constraint.
        let checked = compiler.check(&structured).unwrap_err().to_string();
        match compiler.compile(&structured) {
            Err(GrammarError::Compile { kind: k, message }) => {
                assert_eq!(k, kind);
                assert!(!message.is_empty());
                assert!(checked.contains(&message), "{checked} / {message}");
            }
            Err(e) => panic!("{structured:?}: {e}"),
            Ok(_) => panic!("{structured:?} compiled"),
        }
    }
    compiler.check(&Structured::Regex("[a-z]+".into())).unwrap();
}

#[test]
fn an_exploding_grammar_fails_within_its_limits_instead_of_slowing_down() {
    let tokenizer = tokenizer(SMOLLM2);
    let compiler = GrammarCompiler::new(Arc::clone(&tokenizer)).unwrap();
    // Ambiguous: the parser's items grow with every token.
    let lark = Structured::Lark("start: a\na: a a | \"x\" | a a a".into());
    let mut constraint = compiler.compile(&lark).unwrap();
    let x = tokenizer.encode("x", false, false)[0];
    let mut logits = vec![0.0; tokenizer.vocab_size()];
    let failed_at = (0..1000).find_map(|i| {
        let step = constraint
            .mask(&mut logits)
            .and_then(|()| constraint.accept(x));
        step.err().map(|e| (i, e))
    });
    let (i, error) = failed_at.expect("the parser's limits stop it");
    assert!(i < 200, "{i} tokens");
    let GrammarError::Matcher(message) = error else {
        panic!("{error}")
    };
    assert!(
        message.contains("max is") && !message.contains('\n'),
        "{message}"
    );
}

#[test]
fn a_constraint_compiled_again_starts_from_the_beginning() {
    let tokenizer = tokenizer(SMOLLM2);
    let compiler = GrammarCompiler::new(Arc::clone(&tokenizer)).unwrap();
    let choice = Structured::Choice(vec!["alpha".into(), "beta".into()]);
    let allowed = |constraint: &mut tallow_grammar::Constraint| {
        let mut logits = vec![0.0; tokenizer.vocab_size()];
        constraint.mask(&mut logits).unwrap();
        logits.iter().filter(|l| l.is_finite()).count()
    };
    let mut first = compiler.compile(&choice).unwrap();
    let at_start = allowed(&mut first);
    for token in tokenizer.encode("alpha", false, false) {
        allowed(&mut first);
        first.accept(token).unwrap();
    }
    assert!(first.is_complete());
    // The same choice again (from the compiler's cache) is unstarted; another is not mixed up
    // with it.
    let mut again = compiler.compile(&choice).unwrap();
    assert!(!again.is_complete());
    assert_eq!(allowed(&mut again), at_start);
    let mut other = compiler
        .compile(&Structured::Choice(vec!["alpha\0beta".into()]))
        .unwrap();
    assert!(allowed(&mut other) < at_start);
}

/// A JSON schema whose root refers to `d0`, each `d{i}` an array of `d{i+1}`, the last an
/// integer.
fn reference_chain(n: usize) -> Structured {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("d{i}"),
            json!({"type": "array", "items": {"$ref": format!("#/$defs/d{}", i + 1)}}),
        );
    }
    defs.insert(format!("d{n}"), json!({"type": "integer"}));
    Structured::JsonSchema(json!({"$ref": "#/$defs/d0", "$defs": defs}))
}

/// A Lark grammar of `n` rules, each the next one, the last "x".
fn rule_chain(n: usize) -> Structured {
    let rules: String = (0..n).map(|i| format!("r{i}: r{}\n", i + 1)).collect();
    Structured::Lark(format!("start: r0\n{rules}r{n}: \"x\"\n"))
}

/// The text greedily generated under `structured` when every allowed token is as likely.
fn first_allowed_text(compiler: &GrammarCompiler, tokenizer: &Tokenizer, s: &Structured) -> String {
    let mut constraint = compiler.compile(s).unwrap();
    let mut tokens = Vec::new();
    for _ in 0..64 {
        let mut logits = vec![0.0; tokenizer.vocab_size()];
        constraint.mask(&mut logits).unwrap();
        let token = tallow_pick(&logits);
        if tokenizer.end_of_generation_ids().contains(&token) {
            break;
        }
        constraint.accept(token).unwrap();
        tokens.push(token);
    }
    tokenizer.decode(&tokens).unwrap()
}

#[test]
fn chains_of_definitions_compile_on_the_compilers_own_stack() {
    // These overflowed an 8 MiB stack and ended the process; a test thread has 2 MiB. The
    // deepest chains within the size limit compile too, and their masks need no deep stack.
    let tokenizer = tokenizer(SMOLLM2);
    let compiler = GrammarCompiler::new(Arc::clone(&tokenizer)).unwrap();
    let deepest = |make: fn(usize) -> Structured| {
        let fits = |n| {
            let structured = make(n);
            structured.source_bytes() <= limits::MAX_SOURCE_BYTES
                && limits::nesting(&structured) <= limits::MAX_NESTING
        };
        let mut n = 1000;
        while fits(n + 100) {
            n += 100;
        }
        n
    };
    for (make, short) in [
        (reference_chain as fn(usize) -> Structured, 2000),
        (rule_chain, 5000),
    ] {
        for n in [short, deepest(make)] {
            let structured = make(n);
            assert!(limits::nesting(&structured) <= limits::MAX_NESTING, "{n}");
            let text = first_allowed_text(&compiler, &tokenizer, &structured);
            assert!(!text.is_empty(), "{n}: {text:?}");
        }
    }
}

#[test]
fn sources_beyond_the_limits_are_refused_before_compiling() {
    let compiler = GrammarCompiler::new(tokenizer(SMOLLM2)).unwrap();
    let too_deep = Structured::JsonSchema(json!({
        "$ref": "#/$defs/a",
        "$defs": {"a": {"anyOf": (0..limits::MAX_NESTING).map(|_| json!({})).collect::<Vec<_>>()}},
    }));
    let alternatives = (0..100_000)
        .map(|i| format!("\"w{i}\""))
        .collect::<Vec<_>>();
    let cases = [
        (too_deep, "levels deep"),
        (rule_chain(20_000), "bytes long"),
        (
            Structured::Lark(format!("start: {}\n", alternatives.join(" | "))),
            "bytes long",
        ),
        (
            Structured::Regex("a".repeat(limits::MAX_SOURCE_BYTES + 1)),
            "bytes long",
        ),
    ];
    for (structured, reason) in cases {
        match compiler.compile(&structured) {
            Err(GrammarError::Compile { message, .. }) => {
                assert!(message.contains(reason), "{message}")
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn a_lexer_beyond_its_limits_fails_its_request_with_a_plain_message() {
    // Exactly 10^9 letters: the first mask is computed when compiled (it took seconds inside
    // a step), and the lexer's budget runs out on the first token.
    let tokenizer = tokenizer(SMOLLM2);
    let compiler = GrammarCompiler::new(Arc::clone(&tokenizer)).unwrap();
    let structured = Structured::Regex("((a{1000}){1000}){1000}".into());
    let mut constraint = compiler.compile(&structured).unwrap();
    let error = (0..100)
        .find_map(|_| {
            let mut logits = vec![0.0; tokenizer.vocab_size()];
            let step = constraint
                .mask(&mut logits)
                .and_then(|()| constraint.accept(tallow_pick(&logits)));
            step.err()
        })
        .expect("the lexer's budget runs out");
    let GrammarError::Matcher(message) = error else {
        panic!("{error}")
    };
    assert!(
        !message.contains('\n') && !message.contains("<state>"),
        "{message}"
    );
}

#[test]
fn the_schema_false_is_an_error_not_free_text() {
    let compiler = GrammarCompiler::new(tokenizer(SMOLLM2)).unwrap();
    let error = compiler
        .compile(&Structured::JsonSchema(json!(false)))
        .unwrap_err();
    assert!(error.to_string().contains("false"), "{error}");
    compiler
        .compile(&Structured::JsonSchema(json!(true)))
        .unwrap();
}
