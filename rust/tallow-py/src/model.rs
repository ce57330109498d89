//! Python classes over `tallow_model`: a loaded model, a sequence context, a streaming
//! detokenizer and a sampler.

use std::collections::HashMap;
use std::sync::Arc;

use numpy::{
    IntoPyArray, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use tallow_gguf::{Array, Value};
use tallow_model::{
    AnyModel, Batch, Draw, LoadOptions, Logits, ModelConfig, OutType, Output, Outputs, Reasoning,
    SamplingParams, SeqId, SingleSequence,
};

use crate::constraint::{structured, Constraint};
use crate::kv::KvCache;

use crate::errors::{convert_error, guard, model_error};

/// A GGUF model loaded for inference: weights (memory-mapped), configuration and tokenizer.
#[pyclass(module = "tallow._core", frozen)]
pub struct Model {
    inner: Arc<dyn AnyModel>,
    path: String,
    /// The device's canonical name.
    device: String,
}

impl Model {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (path, *, n_ctx = None, device = "cpu", quantize = None, scratch_dir = None))]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        n_ctx: Option<usize>,
        device: &str,
        quantize: Option<&str>,
        scratch_dir: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let device = crate::device::canonical(device)?;
        let display = path.display().to_string();
        let convert = match quantize {
            Some(name) => OutType::named(name).map_err(convert_error)?,
            None => OutType::Keep,
        };
        let options = LoadOptions {
            context: n_ctx,
            convert,
            scratch: scratch_dir,
        };
        let inner = py.detach(|| {
            guard(|| crate::device::load(&path, options, &device)?.map_err(model_error))
        })?;
        Ok(Model {
            inner,
            path: display,
            device,
        })
    }

    /// The device the model runs on: `"cpu"` or `"wgpu:N"`.
    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    /// `(name, backend)` of the device the model runs on, as its driver names it.
    #[getter]
    fn device_info(&self) -> (String, String) {
        let d = self.inner.device();
        (d.name, d.backend)
    }

    /// `(in_use, peak)` bytes the model's backend holds in device memory (weights, KV pages,
    /// step buffers; the peak since the device was opened), or None on the CPU, whose memory
    /// is the process's.
    #[getter]
    fn device_memory(&self) -> Option<(u64, u64)> {
        self.inner.device_memory().map(|m| (m.in_use, m.peak))
    }

    /// The rate, in bytes per second, at which the model's device reads `bytes` of its
    /// memory, measured on buffers made for the call (the CPU: the compute threads sum a
    /// buffer, as `read_bandwidth` does; a GPU: copies between two buffers, counting the
    /// bytes read and written, up to 1 GiB): a decode step's limit.
    fn read_rate(&self, py: Python<'_>, bytes: usize) -> PyResult<f64> {
        let model = &self.inner;
        py.detach(|| guard(|| model.read_rate(bytes).map_err(model_error)))
    }

    /// Bytes of weights a decode step reads: every tensor but the token embedding, of which
    /// a step reads one row, unless the output layer is the embedding itself; of the experts
    /// of a mixture (`*_exps` tensors), the share a token uses.
    #[getter]
    fn decode_weight_bytes(&self) -> u64 {
        let tensors = self.inner.gguf().tensors();
        let tied = !tensors.iter().any(|t| t.name == "output.weight");
        let experts = self.config().experts;
        (tensors.iter())
            .filter(|t| tied || t.name != "token_embd.weight")
            .map(|t| match experts {
                Some(e) if t.name.contains("_exps.") => t.size * e.used as u64 / e.count as u64,
                _ => t.size,
            })
            .sum()
    }

    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Bytes of the model's GGUF file (of all its parts, for a model split into several).
    #[getter]
    fn file_size(&self) -> u64 {
        self.inner.gguf().file_size()
    }

    #[getter]
    fn architecture(&self) -> &str {
        &self.config().architecture
    }

    /// What the model does differently from the plain Llama shape.
    #[getter]
    fn architecture_features(&self) -> Vec<String> {
        self.config().features()
    }

    #[getter]
    fn n_vocab(&self) -> usize {
        self.config().n_vocab
    }

    /// Width of the hidden states (the embedding length).
    #[getter]
    fn n_embd(&self) -> usize {
        self.config().n_embd
    }

    #[getter]
    fn n_ctx_train(&self) -> usize {
        self.config().n_ctx_train
    }

    #[getter]
    fn n_ctx_max(&self) -> usize {
        self.inner.max_context()
    }

    #[getter]
    fn bos_id(&self) -> Option<u32> {
        self.inner.tokenizer().bos_id()
    }

    #[getter]
    fn eos_id(&self) -> Option<u32> {
        self.inner.tokenizer().eos_id()
    }

    #[getter]
    fn add_bos(&self) -> bool {
        self.inner.tokenizer().add_bos()
    }

    #[getter]
    fn eog_ids(&self) -> Vec<u32> {
        self.inner.tokenizer().end_of_generation_ids().to_vec()
    }

    /// Every GGUF metadata key with its value (arrays become lists).
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (key, value) in self.inner.gguf().metadata() {
            dict.set_item(key, value_to_py(py, value)?)?;
        }
        Ok(dict)
    }

    /// The value of one GGUF metadata key (arrays become lists), or None where the file has
    /// no such key.
    fn metadata_value<'py>(
        &self,
        py: Python<'py>,
        key: &str,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner
            .gguf()
            .get(key)
            .map(|value| value_to_py(py, value))
            .transpose()
    }

    /// `(name, type name, dims)` of every tensor, in file order.
    fn tensors(&self) -> Vec<(String, &'static str, Vec<u64>)> {
        self.inner
            .gguf()
            .tensors()
            .iter()
            .map(|t| (t.name.clone(), t.ty.name(), t.dims.clone()))
            .collect()
    }

    #[pyo3(signature = (text, add_special, parse_special))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: &Bound<'_, PyString>,
        add_special: bool,
        parse_special: bool,
    ) -> PyResult<Vec<u32>> {
        let text = utf8(text)?;
        let model = &self.inner;
        py.detach(|| guard(|| Ok(model.tokenizer().encode(&text, add_special, parse_special))))
    }

    /// `text` with the control tokens written in it quoted, so that `tokenize_quoted` keeps
    /// them plain text (for the messages of a chat prompt).
    fn quote_special(&self, py: Python<'_>, text: &Bound<'_, PyString>) -> PyResult<String> {
        let text = utf8(text)?;
        let model = &self.inner;
        py.detach(|| {
            guard(|| match model.tokenizer().quote_special(&text) {
                Ok(quoted) => Ok(quoted.into_owned()),
                Err(e) => Err(crate::errors::invalid_argument(e.to_string())),
            })
        })
    }

    /// The ids of `text` with control tokens parsed except where `quote_special` quoted them.
    fn tokenize_quoted(
        &self,
        py: Python<'_>,
        text: &Bound<'_, PyString>,
        add_special: bool,
    ) -> PyResult<Vec<u32>> {
        let text = utf8(text)?;
        let model = &self.inner;
        py.detach(|| guard(|| Ok(model.tokenizer().encode_quoted(&text, add_special))))
    }

    fn detokenize(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<String> {
        let model = &self.inner;
        py.detach(|| {
            guard(|| {
                model
                    .tokenizer()
                    .decode(&ids)
                    .map_err(|e| model_error(e.into()))
            })
        })
    }

    fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder {
            model: self.inner.clone(),
            state: tallow_tokenizer::StreamDecoder::new(),
        }
    }

    fn new_context(&self, n_ctx: usize) -> PyResult<Context> {
        Ok(Context {
            sequence: SingleSequence::new(&*self.inner, n_ctx).map_err(model_error)?,
            model: self.inner.clone(),
        })
    }

    /// Bytes of one KV page of `page_size` positions for this model.
    #[pyo3(signature = (page_size = 16, dtype = "f16"))]
    fn kv_page_bytes(&self, page_size: usize, dtype: &str) -> PyResult<usize> {
        let c = self.config();
        let groups = self.inner.kv_groups();
        KvCache::page_bytes(groups, (c.n_head_kv, c.head_dim), page_size, dtype)
    }

    /// The most KV pages of `page_size` positions a sequence of `n_tokens` positions holds at
    /// once when it grows by at most `chunk` positions at a time (sliding-window layers keep
    /// only their window).
    #[pyo3(signature = (n_tokens, *, page_size = 16, chunk = 1))]
    fn kv_pages_to_hold(&self, n_tokens: usize, page_size: usize, chunk: usize) -> PyResult<usize> {
        if page_size == 0 {
            return Err(crate::errors::invalid_argument(
                "page_size must be at least 1",
            ));
        }
        Ok(self
            .inner
            .kv_groups()
            .pages_to_hold(n_tokens, chunk, page_size))
    }

    /// A KV pool shaped for this model (see `KvCache`).
    #[pyo3(signature = (*, page_size = 16, dtype = "f16", max_pages = None, max_bytes = None))]
    fn new_kv_cache(
        &self,
        page_size: usize,
        dtype: &str,
        max_pages: Option<usize>,
        max_bytes: Option<u64>,
    ) -> PyResult<KvCache> {
        let c = self.config();
        let (layout, budget) = KvCache::shape(
            self.inner.kv_groups(),
            (c.n_head_kv, c.head_dim),
            page_size,
            dtype,
            max_pages,
            max_bytes,
        )?;
        let cache = self
            .inner
            .new_kv_cache(layout, budget)
            .map_err(model_error)?;
        Ok(KvCache::new_with(cache))
    }

    /// Runs one ragged batch: `(seq, tokens, logits)` per sequence, where `tokens` take the last
    /// `len(tokens)` positions reserved for `seq` in `cache` and `logits` is `"none"`, `"last"`
    /// or `"all"` (or `"hidden-last"`, `"hidden-all"`: those rows give their final hidden
    /// states instead of logits); or `(seq, tokens, logits, parent)` for a branch: `seq` was
    /// forked from `parent` after `parent` reserved the positions it computes in this batch,
    /// and takes them as `parent` writes them (one forward computes a text and continuations
    /// of it). With `output="logits"`, returns float32 logits of shape `(rows, n_vocab)`,
    /// chunk by chunk; with `output="argmax"`, only each row's greedy token (uint32, shape
    /// `(rows,)`), chosen on the model's device; with `output="draw"`, each row's token drawn
    /// on the device as `draws` says for it (one `(temperature, top_k, top_p, min_p, seed)`
    /// a row, as `Sampler.next_draw` gives it; temperature 0 is greedy). With `vocab` (token
    /// ids), `output="logits"` returns only those tokens' logits, shape `(rows, len(vocab))`,
    /// and the LM head computes only their rows. With `hidden=True`, returns that and the
    /// hidden states (float32, `(rows, n_embd)`, chunk by chunk) as a pair.
    #[pyo3(
        signature = (cache, batch, output = "logits", *, hidden = false, vocab = None, draws = None)
    )]
    #[allow(clippy::too_many_arguments)]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        mut cache: PyRefMut<'_, KvCache>,
        batch: Vec<BatchEntry>,
        output: &str,
        hidden: bool,
        vocab: Option<Vec<u32>>,
        draws: Option<Vec<DrawArgs>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut flat = Batch::new();
        for entry in &batch {
            let (seq, tokens, rows, parent) = match entry {
                BatchEntry::Chunk((seq, tokens, rows)) => (SeqId(*seq), tokens, rows, None),
                BatchEntry::Branch((seq, tokens, rows, parent)) => {
                    (SeqId(*seq), tokens, rows, Some(SeqId(*parent)))
                }
            };
            let (rows, wants_hidden) = match rows.as_str() {
                "none" => (Logits::None, false),
                "last" => (Logits::Last, false),
                "all" => (Logits::All, false),
                "hidden-last" => (Logits::Last, true),
                "hidden-all" => (Logits::All, true),
                other => {
                    return Err(crate::errors::invalid_argument(format!(
                        "logits must be 'none', 'last', 'all', 'hidden-last' or 'hidden-all', \
                         got {other:?}"
                    )))
                }
            };
            match (parent, wants_hidden) {
                (Some(_), true) => {
                    return Err(crate::errors::invalid_argument(
                        "a branch produces logits, not hidden states",
                    ))
                }
                (Some(parent), false) => flat.push_branch(seq, parent, tokens, rows),
                (None, true) => flat.push_hidden(seq, tokens, rows),
                (None, false) => flat.push(seq, tokens, rows),
            };
        }
        let (n_hidden, n_embd) = (flat.n_hidden(), self.config().n_embd);
        if n_hidden > 0 && !hidden {
            return Err(crate::errors::invalid_argument(
                "the batch asks for hidden states: call forward(..., hidden=True)",
            ));
        }
        let (rows, n_vocab) = (flat.n_logits(), self.config().n_vocab);
        let model = &self.inner;
        let KvCache {
            inner: pool,
            scratch,
        } = &mut *cache;
        // Not zeroed (the forward pass writes every value, and on an error the arrays are
        // dropped unseen).
        // SAFETY: f32 has no invalid bit patterns, and no Python code sees the array before it
        // is filled.
        let states = unsafe { PyArray2::<f32>::new(py, [n_hidden, n_embd], false) };
        let mut run = |head: Output<'_>| {
            // SAFETY: the array was just created here and no Python code has seen it yet, so
            // this is the only reference to its (contiguous) data.
            let hidden = unsafe { states.as_slice_mut()? };
            py.detach(|| {
                guard(|| {
                    model
                        .forward_into(pool, &flat, scratch, Outputs { head, hidden })
                        .map_err(model_error)
                })
            })
        };
        if draws.is_some() != (output == "draw") {
            return Err(crate::errors::invalid_argument(
                "draws go with output='draw', and output='draw' needs them",
            ));
        }
        let head = match (output, vocab) {
            ("logits", Some(tokens)) => {
                // SAFETY: as `states`.
                let array = unsafe { PyArray2::<f32>::new(py, [rows, tokens.len()], false) };
                // SAFETY: as `states`.
                let logits = unsafe { array.as_slice_mut()? };
                run(Output::Selected {
                    tokens: &tokens,
                    logits,
                })?;
                array.into_any()
            }
            (_, Some(_)) => {
                return Err(crate::errors::invalid_argument(
                    "vocab chooses logits: it goes with output='logits'",
                ))
            }
            ("logits", None) => {
                // Not zeroed: a megabyte a step for a few rows of a large vocabulary.
                // SAFETY: as `states`.
                let array = unsafe { PyArray2::<f32>::new(py, [rows, n_vocab], false) };
                // SAFETY: as `states`.
                run(Output::Logits(unsafe { array.as_slice_mut()? }))?;
                array.into_any()
            }
            ("argmax" | "draw", None) => {
                let draws = match draws {
                    Some(draws) => checked_draws(draws, rows)?,
                    None => vec![Draw::GREEDY; rows],
                };
                let mut tokens = vec![0u32; rows];
                run(Output::Draw {
                    draws: &draws,
                    tokens: &mut tokens,
                })?;
                tokens.into_pyarray(py).into_any()
            }
            (other, None) => {
                return Err(crate::errors::invalid_argument(format!(
                    "output must be 'logits', 'argmax' or 'draw', got {other:?}"
                )))
            }
        };
        if hidden {
            Ok((head, states).into_pyobject(py)?.into_any())
        } else {
            Ok(head)
        }
    }

    /// Compiles a constraint on an output of this model against its vocabulary: `kind` is
    /// `"json_schema"` (`spec`: the schema as JSON text), `"json_object"` (any JSON object;
    /// `spec` unused), `"regex"` (the whole output matches it), `"choice"` (a list of strings,
    /// exactly one of them) or `"grammar"` (a Lark grammar in llguidance's dialect). Raises
    /// GrammarError where it cannot be compiled or exceeds the limits on its size and work.
    #[pyo3(signature = (kind, spec = None))]
    fn constraint(
        &self,
        py: Python<'_>,
        kind: &str,
        spec: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Constraint> {
        let spec = spec.unwrap_or_else(|| py.None().into_bound(py));
        let structured = structured(kind, &spec)?;
        let model = &self.inner;
        let inner = py.detach(|| guard(|| model.constraint(&structured).map_err(model_error)))?;
        Ok(Constraint { inner: Some(inner) })
    }

    /// Raises what `constraint` would raise for `kind` and `spec`, without making a
    /// constraint (a server checks a request's before it queues it).
    #[pyo3(signature = (kind, spec = None))]
    fn check_constraint(
        &self,
        py: Python<'_>,
        kind: &str,
        spec: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let spec = spec.unwrap_or_else(|| py.None().into_bound(py));
        let structured = structured(kind, &spec)?;
        let model = &self.inner;
        py.detach(|| guard(|| model.check_constraint(&structured).map_err(model_error)))
    }

    fn __repr__(&self) -> String {
        format!(
            "Model(path={:?}, architecture={:?})",
            self.path,
            self.config().architecture
        )
    }
}

/// The text of a Python string, which must be valid Unicode (no lone surrogates).
/// One entry of `Model.forward`'s batch.
#[derive(FromPyObject)]
enum BatchEntry {
    Chunk((u64, Vec<u32>, String)),
    Branch((u64, Vec<u32>, String, u64)),
}

fn utf8(text: &Bound<'_, PyString>) -> PyResult<String> {
    match text.to_str() {
        Ok(text) => Ok(text.to_owned()),
        Err(_) => Err(crate::errors::invalid_argument(
            "the text is not valid Unicode: it holds a lone surrogate (U+D800..U+DFFF)",
        )),
    }
}

fn value_to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::U8(v) => v.into_pyobject(py)?.into_any(),
        Value::I8(v) => v.into_pyobject(py)?.into_any(),
        Value::U16(v) => v.into_pyobject(py)?.into_any(),
        Value::I16(v) => v.into_pyobject(py)?.into_any(),
        Value::U32(v) => v.into_pyobject(py)?.into_any(),
        Value::I32(v) => v.into_pyobject(py)?.into_any(),
        Value::U64(v) => v.into_pyobject(py)?.into_any(),
        Value::I64(v) => v.into_pyobject(py)?.into_any(),
        Value::F32(v) => v.into_pyobject(py)?.into_any(),
        Value::F64(v) => v.into_pyobject(py)?.into_any(),
        Value::Bool(v) => v.into_pyobject(py)?.to_owned().into_any(),
        Value::String(v) => v.into_pyobject(py)?.into_any(),
        Value::Array(items) => array_to_py(py, items)?,
    })
}

fn array_to_py<'py>(py: Python<'py>, array: &Array) -> PyResult<Bound<'py, PyAny>> {
    Ok(match array {
        Array::String(strings) => PyList::new(py, strings.iter())?.into_any(),
        Array::Array(arrays) => {
            let list = PyList::empty(py);
            for item in arrays {
                list.append(array_to_py(py, item)?)?;
            }
            list.into_any()
        }
        _ => {
            let list = PyList::empty(py);
            for item in array.values() {
                list.append(value_to_py(py, &item)?)?;
            }
            list.into_any()
        }
    })
}

/// One sequence: its KV cache and the positions evaluated so far.
#[pyclass(module = "tallow._core")]
pub struct Context {
    model: Arc<dyn AnyModel>,
    sequence: SingleSequence,
}

#[pymethods]
impl Context {
    #[getter]
    fn n_ctx(&self) -> usize {
        self.sequence.n_ctx()
    }

    #[getter]
    fn n_past(&self) -> usize {
        self.sequence.len()
    }

    /// Evaluates `tokens` at the next positions and returns float32 logits: shape `(n_vocab,)`
    /// for the last token, or `(len(tokens), n_vocab)` with `all_logits`.
    #[pyo3(signature = (tokens, all_logits = false))]
    fn eval<'py>(
        &mut self,
        py: Python<'py>,
        tokens: Vec<u32>,
        all_logits: bool,
    ) -> PyResult<Bound<'py, PyUntypedArray>> {
        let mode = if all_logits {
            Logits::All
        } else {
            Logits::Last
        };
        let (model, sequence) = (&self.model, &mut self.sequence);
        let logits =
            py.detach(|| guard(|| sequence.eval(&**model, &tokens, mode).map_err(model_error)))?;
        let array = logits.into_pyarray(py);
        if all_logits {
            let shape = [tokens.len(), self.model.config().n_vocab];
            Ok(array.reshape(shape)?.as_untyped().clone())
        } else {
            Ok(array.as_untyped().clone())
        }
    }

    /// Forgets every position.
    fn reset(&mut self) {
        self.sequence.reset();
    }

    /// Keeps the first `n` positions.
    fn truncate(&mut self, n: usize) {
        self.sequence.truncate(n);
    }
}

/// Turns token ids into text one at a time, emitting only complete UTF-8 characters.
#[pyclass(module = "tallow._core")]
pub struct StreamDecoder {
    model: Arc<dyn AnyModel>,
    state: tallow_tokenizer::StreamDecoder,
}

#[pymethods]
impl StreamDecoder {
    fn push(&mut self, token_id: u32) -> PyResult<String> {
        self.state
            .push(self.model.tokenizer(), token_id)
            .map_err(|e| model_error(e.into()))
    }

    fn finish(&mut self) -> String {
        self.state.finish()
    }
}

/// `Sampler(..., reasoning=(start, end, close, budget, opened))`: see [`Reasoning`].
type ReasoningArgs = (u32, Vec<u32>, Vec<u32>, Option<usize>, bool);

/// Chooses tokens from logits for one request: penalties and logit bias, then greedy
/// (temperature 0) or seeded sampling with top-k, top-p and min-p.
#[pyclass(module = "tallow._core")]
pub struct Sampler {
    inner: tallow_model::Sampler,
}

#[pymethods]
impl Sampler {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        temperature, top_k, top_p, seed = None, *, min_p = 0.0, repetition_penalty = 1.0,
        frequency_penalty = 0.0, presence_penalty = 0.0, logit_bias = None, top_logprobs = 0,
        logprobs = false, constraint = None, reasoning = None
    ))]
    fn new(
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: Option<u64>,
        min_p: f32,
        repetition_penalty: f32,
        frequency_penalty: f32,
        presence_penalty: f32,
        logit_bias: Option<HashMap<u32, f32>>,
        top_logprobs: usize,
        logprobs: bool,
        constraint: Option<PyRefMut<'_, Constraint>>,
        reasoning: Option<ReasoningArgs>,
    ) -> PyResult<Self> {
        let mut logit_bias: Vec<(u32, f32)> = logit_bias.unwrap_or_default().into_iter().collect();
        logit_bias.sort_by_key(|&(token, _)| token);
        let params = SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            frequency_penalty,
            presence_penalty,
            logit_bias,
            seed: seed.unwrap_or_else(random_seed),
            logprobs,
            top_logprobs,
        };
        let mut inner = tallow_model::Sampler::new(params).map_err(model_error)?;
        if let Some(mut constraint) = constraint {
            inner = inner.with_constraint(constraint.take()?);
        }
        if let Some((start, end, close, budget, opened)) = reasoning {
            inner = inner.with_reasoning(Reasoning {
                start,
                end,
                close,
                budget,
                opened,
            });
        }
        Ok(Sampler { inner })
    }

    /// Whether the output is inside its reasoning block (or may still open one).
    #[getter]
    fn is_reasoning(&self) -> bool {
        self.inner.is_reasoning()
    }

    /// Picks a token from one row of logits (and remembers it for the penalties).
    fn sample(&mut self, logits: PyReadonlyArray1<'_, f32>) -> PyResult<u32> {
        let logits = logits.as_slice()?;
        guard(|| Ok(self.inner.sample(logits).map_err(model_error)?.token))
    }

    /// Remembers tokens for the penalties without sampling (e.g. the prompt).
    fn accept(&mut self, tokens: Vec<u32>) {
        self.inner.accept(&tokens);
    }

    /// Speculative verification: `logits` has `len(draft) + 1` rows (row `i` predicts the
    /// token after the first `i` draft tokens); `draft_probs` the distribution each draft
    /// token was drawn from (`len(draft)` rows), or None for proposals made with certainty.
    /// Returns `(token, logprob, top_logprobs)` for the accepted draft tokens and one more.
    #[pyo3(signature = (logits, draft, draft_probs = None))]
    fn verify(
        &mut self,
        py: Python<'_>,
        logits: PyReadonlyArray2<'_, f32>,
        draft: Vec<u32>,
        draft_probs: Option<PyReadonlyArray2<'_, f32>>,
    ) -> PyResult<Vec<SampledRow>> {
        let n_vocab = logits.shape()[1];
        let rows = logits.as_slice()?;
        let q = match &draft_probs {
            Some(q) => Some(q.as_slice()?),
            None => None,
        };
        let inner = &mut self.inner;
        let sampled =
            py.detach(|| guard(|| inner.verify(rows, n_vocab, &draft, q).map_err(model_error)))?;
        Ok(sampled
            .into_iter()
            .map(|s| (s.token, s.logprob, s.top))
            .collect())
    }

    /// Whether the sampler's choice is a row's argmax and nothing more (greedy, no penalties,
    /// bias or log probabilities), so that `Model.forward(..., output="argmax")` serves it.
    #[getter]
    fn is_plain_greedy(&self) -> bool {
        self.inner.is_plain_greedy()
    }

    /// Whether the sampler's choice is drawn from the raw logits and nothing more (no
    /// penalties, bias, constraint or log probabilities), so that the model's device can
    /// draw it: `Model.forward(..., output="draw", draws=[sampler.next_draw()])`.
    #[getter]
    fn draws_on_device(&self) -> bool {
        self.inner.draws_on_device()
    }

    /// How the next token is drawn, `(temperature, top_k, top_p, min_p, seed)`, its seed
    /// taken from the sampler's random state as `sample` takes it.
    fn next_draw(&mut self) -> DrawArgs {
        let d = self.inner.next_draw();
        (d.temperature, d.top_k, d.top_p, d.min_p, d.seed)
    }

    /// `verify` (or, with no draft, `sample`) given only the tokens the device drew from
    /// each row (`Model.forward(..., output="argmax")` or `"draw"`): `len(draft) + 1` of them
    /// (a draft only for a greedy sampler). Returns `(token, nan, [])` for the accepted draft
    /// tokens and one more.
    fn take_drawn(&mut self, drawn: Vec<u32>, draft: Vec<u32>) -> PyResult<Vec<SampledRow>> {
        let sampled = self.inner.take_drawn(&drawn, &draft).map_err(model_error)?;
        Ok(sampled
            .into_iter()
            .map(|s| (s.token, s.logprob, s.top))
            .collect())
    }

    /// Draws a token to propose from a draft model's logits row, without remembering it;
    /// returns it with the distribution it was drawn from.
    fn draft<'py>(
        &mut self,
        py: Python<'py>,
        logits: PyReadonlyArray1<'_, f32>,
    ) -> PyResult<(u32, Bound<'py, PyUntypedArray>)> {
        let logits = logits.as_slice()?;
        let (token, q) = guard(|| self.inner.draft(logits).map_err(model_error))?;
        Ok((token, q.into_pyarray(py).as_untyped().clone()))
    }
}

/// `(token, logprob, [(token, logprob) of the most likely tokens])`.
type SampledRow = (u32, f32, Vec<(u32, f32)>);

/// How a row's token is drawn: `(temperature, top_k, top_p, min_p, seed)`.
type DrawArgs = (f32, u32, f32, f32, u64);

/// Samples row `i` of `logits` with `samplers[i]`, all rows in parallel. Returns
/// `(token, logprob, top_logprobs)` per row, or for a row that could not be sampled (its
/// constraint failed) the exception, unraised.
#[pyfunction]
pub fn sample_batch(
    py: Python<'_>,
    samplers: Vec<PyRefMut<'_, Sampler>>,
    logits: PyReadonlyArray2<'_, f32>,
) -> PyResult<Vec<Py<PyAny>>> {
    let n_vocab = logits.shape()[1];
    let logits = logits.as_slice()?;
    let mut samplers = samplers;
    let mut inner: Vec<&mut tallow_model::Sampler> =
        samplers.iter_mut().map(|s| &mut s.inner).collect();
    let sampled = py.detach(|| {
        guard(|| tallow_model::sample_batch(&mut inner, logits, n_vocab).map_err(model_error))
    })?;
    sampled
        .into_iter()
        .map(|row| match row {
            Ok(s) => Ok((s.token, s.logprob, s.top)
                .into_pyobject(py)?
                .into_any()
                .unbind()),
            Err(e) => Ok(model_error(e).into_value(py).into_any()),
        })
        .collect()
}

/// The draws of `rows` rows, checked.
fn checked_draws(draws: Vec<DrawArgs>, rows: usize) -> PyResult<Vec<Draw>> {
    if draws.len() != rows {
        return Err(crate::errors::invalid_argument(format!(
            "{} draws for {rows} rows of logits",
            draws.len()
        )));
    }
    (draws.into_iter())
        .map(|(temperature, top_k, top_p, min_p, seed)| {
            let d = Draw {
                temperature,
                top_k,
                top_p,
                min_p,
                seed,
            };
            d.check().map_err(crate::errors::invalid_argument)?;
            Ok(d)
        })
        .collect()
}

/// A seed for requests that give none: different for every sampler.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
