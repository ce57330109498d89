//! Where the test models and llama.cpp's reference outputs are, and how to read them.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::path::{Path, PathBuf};

use tallow_tokenizer::Tokenizer;

pub const SMOLLM2: (&str, &str) = ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf");
pub const GEMMA3: (&str, &str) = ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf");

/// `shared/reference`, beside the repository, or `$TALLOW_REFERENCE_DIR`.
pub fn reference_dir() -> PathBuf {
    std::env::var_os("TALLOW_REFERENCE_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference"),
        PathBuf::from,
    )
}

/// `$TALLOW_HOME/models/<name>/<file>`, `TALLOW_HOME` defaulting to `~/.cache/tallow`.
pub fn model_path((name, file): (&str, &str)) -> PathBuf {
    let home = std::env::var_os("TALLOW_HOME").map_or_else(
        || {
            let user_home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&user_home).join(".cache/tallow")
        },
        PathBuf::from,
    );
    home.join("models").join(name).join(file)
}

/// The model's tokenizer, or `None` (with a message) when the model file is not downloaded.
pub fn load(model: (&str, &str)) -> Option<Tokenizer> {
    let path = model_path(model);
    if !path.exists() {
        eprintln!("SKIPPED: model file {} is absent", path.display());
        return None;
    }
    let file = tallow_gguf::GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    Some(Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// A JSON array of non-negative integers.
pub fn read_ids(path: &Path) -> Vec<u32> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let inner = text
        .trim()
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or_else(|| panic!("{} is not a JSON array", path.display()));
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .unwrap_or_else(|e| panic!("{}: {s:?}: {e}", path.display()))
        })
        .collect()
}

/// Every `tokenizer/TEXT.<tag>.ids.json` with its text file `tokenizer/TEXT.*`.
pub fn reference_cases(tag: &str) -> Vec<(PathBuf, PathBuf)> {
    let dir = reference_dir().join("tokenizer");
    let suffix = format!(".{tag}.ids.json");
    let entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reference directory {}: {e}", dir.display()))
        .map(|entry| entry.expect("readable directory entry").path())
        .collect();
    let mut cases = Vec::new();
    for ids in &entries {
        let name = ids.file_name().unwrap().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(&suffix) else {
            continue;
        };
        let text = entries
            .iter()
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                !n.ends_with(".ids.json") && n.split_once('.').map(|(s, _)| s) == Some(stem)
            })
            .unwrap_or_else(|| panic!("no text file for {}", ids.display()));
        cases.push((text.clone(), ids.clone()));
    }
    cases.sort();
    assert!(!cases.is_empty(), "no *{suffix} files in {}", dir.display());
    cases
}

/// A reference text, read as raw bytes (no newline translation).
pub fn read_text(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    String::from_utf8(bytes).unwrap_or_else(|e| panic!("{} is not UTF-8: {e}", path.display()))
}
