//! Bounds on what a constraint's source may ask of the compiler.
//!
//! llguidance compiles a JSON schema's `$ref`s and a Lark grammar's rules by recursion: each
//! reference to a definition not yet compiled goes one level deeper, so a chain of a few
//! thousand definitions overflows a thread's stack, and that ends the process. The compiler
//! runs on a thread of its own with [`COMPILE_STACK`] bytes of stack, and a source is refused
//! before it gets there when its [`nesting`] (an upper bound on that recursion, counted from
//! the source's text) is over [`MAX_NESTING`]. Together with [`MAX_SOURCE_BYTES`], this also
//! bounds the compiler's time: the largest grammar within the limits compiles in a fraction
//! of a second.

use serde_json::Value;

use crate::structured::Structured;

/// Most bytes of a constraint's source: a schema's JSON text, a regular expression, a Lark
/// grammar, or a choice's strings together.
pub const MAX_SOURCE_BYTES: usize = 128 << 10;

/// Most levels of nesting (see [`nesting`]) a constraint may have.
pub const MAX_NESTING: usize = 10_000;

/// The stack of the thread that compiles a constraint: room for [`MAX_NESTING`] levels of
/// llguidance's recursion (a few KiB each) several times over. Only the part used is ever
/// backed by memory.
pub(crate) const COMPILE_STACK: usize = 256 << 20;

/// Why `structured`, whose source is `source_bytes` long, may not be compiled, or `None`
/// where it is within the limits.
pub(crate) fn exceeded(structured: &Structured, source_bytes: usize) -> Option<String> {
    if source_bytes > MAX_SOURCE_BYTES {
        return Some(format!(
            "it is {source_bytes} bytes long, over the limit of {MAX_SOURCE_BYTES}"
        ));
    }
    let depth = nesting(structured);
    (depth > MAX_NESTING).then(|| {
        format!(
            "it nests {depth} levels deep (definitions and references counted), over the limit \
             of {MAX_NESTING}"
        )
    })
}

/// An upper bound on how deep the compiler recurses for `structured`.
///
/// - A JSON schema without `$ref` recurses as deep as its values nest. With `$ref`, a chain
///   of references may lead through every subschema once, so the bound is the number of
///   objects and arrays in the schema.
/// - A Lark grammar recurses through its definitions (a rule referring to the next) and its
///   groups, and through the JSON of its `%json` schemas: the bound is the number of
///   definitions plus the number of opening brackets outside strings, regular expressions
///   and comments.
/// - A regular expression nests no deeper than its parser allows (a few hundred groups), and
///   a choice not at all.
pub fn nesting(structured: &Structured) -> usize {
    match structured {
        Structured::JsonSchema(schema) => schema_nesting(schema),
        Structured::Lark(grammar) => lark_nesting(grammar),
        Structured::JsonObject | Structured::Regex(_) | Structured::Choice(_) => 1,
    }
}

fn schema_nesting(schema: &Value) -> usize {
    let mut containers = 0;
    let mut deepest = 0;
    let mut refers = false;
    let mut todo = vec![(schema, 1)];
    while let Some((value, depth)) = todo.pop() {
        match value {
            Value::Object(map) => {
                refers |= map.contains_key("$ref");
                todo.extend(map.values().map(|v| (v, depth + 1)));
            }
            Value::Array(items) => todo.extend(items.iter().map(|v| (v, depth + 1))),
            _ => continue,
        }
        containers += 1;
        deepest = deepest.max(depth);
    }
    if refers {
        containers
    } else {
        deepest
    }
}

fn lark_nesting(grammar: &str) -> usize {
    let definitions = grammar.lines().filter(|line| defines(line)).count();
    definitions + lark_brackets(grammar)
}

/// Whether a line of Lark starts a definition: `name:`, `?name:`, `!name:`, `NAME.2:`,
/// `name{param}:`.
fn defines(line: &str) -> bool {
    let rest = line.trim_start().trim_start_matches(['?', '!']);
    let name_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    if name_end == 0 || rest.as_bytes()[0].is_ascii_digit() {
        return false;
    }
    let after = rest[name_end..].trim_start();
    let after = match after.strip_prefix('{') {
        Some(params) => params.find('}').map_or("", |end| &params[end + 1..]),
        None => after,
    };
    let after = match after.strip_prefix('.') {
        Some(priority) => priority.trim_start_matches(|c: char| c == '-' || c.is_ascii_digit()),
        None => after,
    };
    after.trim_start().starts_with(':')
}

/// Opening brackets of a Lark grammar outside its strings (`"..."`), regular expressions
/// (`/.../`) and comments (`//` to the end of the line).
fn lark_brackets(grammar: &str) -> usize {
    let mut count = 0;
    let mut chars = grammar.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '(' | '[' | '{' => count += 1,
            '"' => skip_quoted(&mut chars, '"'),
            '/' if chars.peek() == Some(&'/') => {
                chars.by_ref().find(|&c| c == '\n');
            }
            '/' => skip_quoted(&mut chars, '/'),
            _ => {}
        }
    }
    count
}

/// Moves past the closing `end` of a quoted text (`\` escapes the next character); a text
/// left open ends at the end of its line.
fn skip_quoted(chars: &mut impl Iterator<Item = char>, end: char) {
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '\n' => return,
            c if c == end => return,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_without_references_nests_as_deep_as_its_values() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "array", "items": {}}}});
        // The root, its properties, a, a's items.
        assert_eq!(nesting(&Structured::JsonSchema(schema)), 4);
    }

    #[test]
    fn a_schema_with_references_counts_every_object_and_array() {
        let schema = json!({
            "$ref": "#/$defs/a",
            "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"}}, "b": {}},
            "required": ["x", "y"],
        });
        // The root, $defs, a, a's items, b and the required list.
        assert_eq!(nesting(&Structured::JsonSchema(schema)), 6);
    }

    #[test]
    fn a_grammar_counts_definitions_and_brackets_outside_literals() {
        let grammar = r#"
start: greeting (", " name)* // a comment with ( and [
?greeting: "hello (" | /[a-z(]+\/(/
NAME.2: /[A-Z]+/
list{item}: "[" item ("," item)* "]"
item: %json { "type": "array", "items": {} }
"#;
        // Five definitions; ( in start, ( in list, { of list's parameter, { { of the %json.
        assert_eq!(nesting(&Structured::Lark(grammar.into())), 5 + 5);
    }

    #[test]
    fn lines_that_continue_a_rule_are_not_definitions() {
        assert!(defines("  ?expr: term"));
        assert!(defines("DIGIT.-1 : /[0-9]/"));
        assert!(!defines("    | \"a\": b"));
        assert!(!defines("%ignore WS"));
        assert!(!defines("1abc: x"));
    }
}
