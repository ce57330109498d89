//! The Python exception hierarchy under `tallow.TallowError`, and the one mapping from the core
//! crates' errors (and panics) onto it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyException, PyFileNotFoundError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use tallow_convert::ConvertError;
use tallow_gguf::GgufError;
use tallow_kv::KvError;
use tallow_model::ModelError;
use tallow_quant::QuantError;

/// The exception classes, created once when the module is imported.
pub struct Exceptions {
    pub tallow: Py<PyType>,
    pub gguf: Py<PyType>,
    pub not_found: Py<PyType>,
    pub unsupported: Py<PyType>,
    pub tokenizer: Py<PyType>,
    pub model: Py<PyType>,
    pub invalid_argument: Py<PyType>,
    pub grammar: Py<PyType>,
}

static EXCEPTIONS: PyOnceLock<Exceptions> = PyOnceLock::new();

/// (name, doc) of each class; the bases are set in [`create`].
const DOCS: [(&str, &str); 8] = [
    ("TallowError", "Base class of every error raised by tallow."),
    (
        "GgufError",
        "The GGUF file is malformed: bad magic, truncated, offsets out of range.",
    ),
    ("ModelNotFoundError", "The model file does not exist."),
    (
        "UnsupportedError",
        "The model uses an architecture or tensor type tallow cannot run.",
    ),
    (
        "TokenizerError",
        "The tokenizer metadata is invalid or a token id is unknown.",
    ),
    (
        "ModelError",
        "The model is inconsistent, or a request does not fit it (context, ids).",
    ),
    (
        "InvalidArgumentError",
        "An argument is out of range or of the wrong kind.",
    ),
    (
        "GrammarError",
        "A constraint on the output (JSON schema, regular expression, choice, grammar) cannot \
         be compiled, is beyond the limits on its size and work, or failed while generating.",
    ),
];

fn new_class<'py>(
    py: Python<'py>,
    index: usize,
    bases: &[Bound<'py, PyType>],
) -> PyResult<Bound<'py, PyType>> {
    let (name, doc) = DOCS[index];
    let dict = PyDict::new(py);
    dict.set_item("__doc__", doc)?;
    dict.set_item("__module__", "tallow")?;
    let bases = PyTuple::new(py, bases)?;
    let class = py.get_type::<PyType>().call1((name, bases, dict))?;
    Ok(class.cast_into::<PyType>()?)
}

/// Creates the classes and adds them to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let tallow = new_class(py, 0, &[py.get_type::<PyException>()])?;
    let child = |i: usize| new_class(py, i, std::slice::from_ref(&tallow));
    let invalid_argument = new_class(py, 6, &[tallow.clone(), py.get_type::<PyValueError>()])?;
    let exceptions = Exceptions {
        gguf: child(1)?.unbind(),
        not_found: new_class(
            py,
            2,
            &[tallow.clone(), py.get_type::<PyFileNotFoundError>()],
        )?
        .unbind(),
        unsupported: child(3)?.unbind(),
        tokenizer: child(4)?.unbind(),
        model: child(5)?.unbind(),
        grammar: new_class(py, 7, std::slice::from_ref(&invalid_argument))?.unbind(),
        invalid_argument: invalid_argument.unbind(),
        tallow: tallow.unbind(),
    };
    for (class, (name, _)) in [
        &exceptions.tallow,
        &exceptions.gguf,
        &exceptions.not_found,
        &exceptions.unsupported,
        &exceptions.tokenizer,
        &exceptions.model,
        &exceptions.invalid_argument,
        &exceptions.grammar,
    ]
    .into_iter()
    .zip(DOCS)
    {
        module.add(name, class.clone_ref(py))?;
    }
    let _ = EXCEPTIONS.set(py, exceptions);
    Ok(())
}

pub(crate) fn raise(class: impl Fn(&Exceptions) -> &Py<PyType>, message: String) -> PyErr {
    Python::attach(|py| {
        let exceptions = EXCEPTIONS
            .get(py)
            .expect("exceptions are registered at import");
        PyErr::from_type(class(exceptions).bind(py).clone(), message)
    })
}

pub fn invalid_argument(message: impl Into<String>) -> PyErr {
    raise(|e| &e.invalid_argument, message.into())
}

/// A constraint on the output that cannot be read or compiled.
pub fn grammar_error(message: impl Into<String>) -> PyErr {
    raise(|e| &e.grammar, message.into())
}

pub fn gguf_error(err: GgufError) -> PyErr {
    let message = err.to_string();
    match err {
        GgufError::NotFound { .. } | GgufError::MissingSplitPart { .. } => {
            raise(|e| &e.not_found, message)
        }
        GgufError::UnsupportedTensorType { .. } => raise(|e| &e.unsupported, message),
        GgufError::Io { .. } => raise(|e| &e.tallow, message),
        _ => raise(|e| &e.gguf, message),
    }
}

pub fn quant_error(err: QuantError) -> PyErr {
    match err {
        QuantError::Unsupported { .. } => raise(|e| &e.unsupported, err.to_string()),
        _ => raise(|e| &e.invalid_argument, err.to_string()),
    }
}

/// Running out of pages is a state of the model's cache (`ModelError`); every other KV error
/// is a caller's bad argument.
pub fn kv_error(err: KvError) -> PyErr {
    match err {
        KvError::OutOfPages { .. } | KvError::Device(_) => raise(|e| &e.model, err.to_string()),
        _ => raise(|e| &e.invalid_argument, err.to_string()),
    }
}

/// A checkpoint folder that cannot be converted: a format it cannot be rounded to is the
/// caller's argument, an architecture it cannot take unsupported, a missing file not found,
/// anything else a damaged model.
pub fn convert_error(err: ConvertError) -> PyErr {
    let message = err.to_string();
    match err {
        ConvertError::OutType(_) => raise(|e| &e.invalid_argument, message),
        ConvertError::UnknownArchitecture(_) => raise(|e| &e.unsupported, message),
        ConvertError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            raise(|e| &e.not_found, message)
        }
        ConvertError::Io { .. } | ConvertError::Write(_) => raise(|e| &e.tallow, message),
        _ => raise(|e| &e.model, message),
    }
}

pub fn model_error(err: ModelError) -> PyErr {
    let message = err.to_string();
    match err {
        ModelError::Gguf(err) => gguf_error(err),
        ModelError::Convert(err) => convert_error(err),
        ModelError::Quant(err) => quant_error(err),
        ModelError::Kv(err) => kv_error(err),
        ModelError::Tokenizer(_) => raise(|e| &e.tokenizer, message),
        ModelError::UnknownArchitecture(_) | ModelError::Unsupported(_) => {
            raise(|e| &e.unsupported, message)
        }
        ModelError::InvalidArgument(_) => raise(|e| &e.invalid_argument, message),
        ModelError::Grammar(_) => raise(|e| &e.grammar, message),
        _ => raise(|e| &e.model, message),
    }
}

/// Runs `f`, turning a panic into a `TallowError` instead of letting it unwind into Python.
pub fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let detail = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(raise(|e| &e.tallow, format!("internal error: {detail}")))
    })
}
