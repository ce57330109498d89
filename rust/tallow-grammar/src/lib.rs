//! Constrained decoding. A [`Structured`] output (a JSON Schema, any JSON object, a regular
//! expression, a choice among strings, or a Lark grammar) is compiled by llguidance against a
//! model's own tokenizer ([`GrammarCompiler`]) into a [`Constraint`]: per request, the tokens
//! that may come next, advanced token by token as the request generates.

mod compiler;
mod constraint;
mod error;
pub mod limits;
mod structured;
mod vocabulary;

pub use compiler::GrammarCompiler;
pub use constraint::Constraint;
pub use error::GrammarError;
pub use structured::Structured;
