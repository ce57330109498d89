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

/// What a compiler that panicked says instead: the panic's message and backtrace say nothing
/// a client can act on and may name source paths.
pub(crate) const BEYOND_THE_COMPILER: &str =
    "the constraint is too large or complex for the compiler";

/// llguidance's `message` on one line, without the parser state or the backtrace it appends
/// to some (from a `<state>` or `<backtrace>` line on): a regex parser's error spreads its
/// pointer and reason over lines. A panic inside llguidance (which it turns into an error
/// with `panic:` in its first line) becomes [`BEYOND_THE_COMPILER`].
pub(crate) fn without_state(message: &str) -> String {
    if message
        .lines()
        .next()
        .is_some_and(|line| line.contains("panic:"))
    {
        return BEYOND_THE_COMPILER.into();
    }
    let lines: Vec<&str> = message
        .lines()
        .take_while(|line| {
            let line = line.trim_start();
            !(line.starts_with("<state>") || line.starts_with("<backtrace>"))
        })
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    lines.join(" ")
}

#[cfg(test)]
mod tests {
    use super::without_state;

    #[test]
    fn messages_lose_state_backtraces_and_panics() {
        assert_eq!(
            without_state("invalid regex\n  at 3\n<state>\ntokens: [1, 2]"),
            "invalid regex at 3"
        );
        let panic = "panic: assertion failed: x < 10\n<backtrace>\n 0: /home/me/src/a.rs:1\n";
        let message = without_state(panic);
        assert!(
            !message.contains("panic") && !message.contains("a.rs"),
            "{message}"
        );
        assert!(!without_state("bad\n<backtrace>\n/src/x.rs").contains("x.rs"));
    }
}
