use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GrammarError {
    /// The grammar, schema or expression cannot be compiled (the compiler's message), or is
    /// larger or slower to build than the limits allow.
    #[error("cannot compile the {kind}: {message}")]
    Compile { kind: &'static str, message: String },
    /// The constraint failed while generating (a token it did not allow was given to it, or
    /// computing the next mask ran out of its budget).
    #[error("constrained decoding failed: {0}")]
    Matcher(String),
}

impl GrammarError {
    /// llguidance's error without the parser state it appends (the tokens so far, counters
    /// and the grammar).
    pub(crate) fn matcher(error: impl std::fmt::Display) -> Self {
        GrammarError::Matcher(without_state(&error.to_string()))
    }
}

/// llguidance's `message` on one line, without the parser state it appends to some (from a
/// `<state>` line on): a regex parser's error spreads its pointer and reason over lines.
pub(crate) fn without_state(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .take_while(|line| !line.trim_start().starts_with("<state>"))
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    lines.join(" ")
}
