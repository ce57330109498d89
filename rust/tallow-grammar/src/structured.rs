//! What a request's output must match, and its grammar in llguidance's terms.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

/// The shape a request's output must take.
#[derive(Debug, Clone, PartialEq)]
pub enum Structured {
    /// JSON that validates against this JSON Schema.
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// Text that matches this regular expression, whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text in the language of this Lark grammar (llguidance's dialect).
    Lark(String),
}

impl Structured {
    /// What it is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Structured::JsonSchema(_) => "JSON schema",
            Structured::JsonObject => "JSON object",
            Structured::Regex(_) => "regular expression",
            Structured::Choice(_) => "choice",
            Structured::Lark(_) => "grammar",
        }
    }

    /// A text that names this output exactly (for caching what it compiles to).
    pub(crate) fn key(&self) -> String {
        match self {
            Structured::JsonSchema(schema) => format!("json_schema\0{schema}"),
            Structured::JsonObject => "json_object".into(),
            Structured::Regex(pattern) => format!("regex\0{pattern}"),
            Structured::Choice(choices) => format!("choice\0{}", json!(choices)),
            Structured::Lark(grammar) => format!("lark\0{grammar}"),
        }
    }

    /// The length of the source of this output: a schema's JSON text, the expression, the
    /// grammar, the choice's strings as a JSON list.
    pub fn source_bytes(&self) -> usize {
        source_bytes_of(&self.key())
    }

    pub(crate) fn grammar(&self) -> Result<TopLevelGrammar, String> {
        Ok(match self {
            Structured::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err("a JSON schema is an object (or true/false)".into());
                }
                if schema == &Value::Bool(false) {
                    return Err("the schema `false` allows no output at all".into());
                }
                TopLevelGrammar::from_json_schema(with_layout(schema.clone()))
            }
            Structured::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(json!({"type": "object"})))
            }
            Structured::Regex(pattern) => TopLevelGrammar::from_regex(pattern),
            Structured::Choice(choices) => {
                if choices.is_empty() {
                    return Err("a choice needs at least one string".into());
                }
                let alternatives: Vec<String> =
                    choices.iter().map(|c| regex_syntax::escape(c)).collect();
                TopLevelGrammar::from_regex(&format!("({})", alternatives.join("|")))
            }
            Structured::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
        })
    }
}

/// `schema` with llguidance's JSON options set, unless it sets them itself: one space after
/// each `,` and `:` and no other whitespace between tokens (a model left free to add
/// whitespace may add it forever), and `oneOf` read as `anyOf` (as most engines do).
fn with_layout(mut schema: Value) -> Value {
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(|| {
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
                "coerce_one_of": true,
            })
        });
    }
    schema
}

/// [`Structured::source_bytes`] from the output's [`Structured::key`]: the text after the
/// kind.
pub(crate) fn source_bytes_of(key: &str) -> usize {
    key.len() - key.find('\0').map_or(0, |kind_end| kind_end + 1)
}
