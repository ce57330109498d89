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
    /// and the grammar): its first line.
    pub(crate) fn matcher(error: impl std::fmt::Display) -> Self {
        GrammarError::Matcher(first_line(&error.to_string()))
    }
}

pub(crate) fn first_line(message: &str) -> String {
    message
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}
