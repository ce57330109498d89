//! Constraints on a request's output, compiled against a model's vocabulary and handed to its
//! sampler.

use pyo3::prelude::*;
use tallow_model::Structured;

use crate::errors::{grammar_error, invalid_argument};

/// What a request's output must match (see `Model.constraint`), compiled. A sampler made with
/// it takes it over: each constraint serves one request.
#[pyclass(module = "tallow._core")]
pub struct Constraint {
    pub(crate) inner: Option<tallow_model::Constraint>,
}

impl Constraint {
    /// The compiled constraint, once: the sampler that takes it advances it.
    pub(crate) fn take(&mut self) -> PyResult<tallow_model::Constraint> {
        self.inner
            .take()
            .ok_or_else(|| invalid_argument("this constraint is already in use by a sampler"))
    }
}

/// The [`Structured`] output that `kind` and `spec` describe (see `Model.constraint`).
pub(crate) fn structured(kind: &str, spec: &Bound<'_, PyAny>) -> PyResult<Structured> {
    let text = || -> PyResult<String> {
        spec.extract()
            .map_err(|_| invalid_argument(format!("a {kind} constraint is given as a string")))
    };
    Ok(match kind {
        "json_schema" => {
            let schema = serde_json::from_str(&text()?)
                .map_err(|e| grammar_error(format!("the JSON schema cannot be read: {e}")))?;
            Structured::JsonSchema(schema)
        }
        "json_object" => Structured::JsonObject,
        "regex" => Structured::Regex(text()?),
        "grammar" => Structured::Lark(text()?),
        "choice" => {
            Structured::Choice(spec.extract().map_err(|_| {
                invalid_argument("a choice constraint is given as a list of strings")
            })?)
        }
        other => {
            return Err(invalid_argument(format!(
                "unknown constraint {other:?} (known: json_schema, json_object, regex, choice, \
                 grammar)"
            )))
        }
    })
}
