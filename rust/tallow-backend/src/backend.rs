//! The [`Backend`] trait: what the forward pass asks of a device.

use std::sync::Arc;

use tallow_gguf::{GgufFile, TensorInfo};
use tallow_kv::{KvLayout, LayerGroups, PageStore, PagedKvCache};

use crate::batch::Batch;
use crate::capabilities::Capabilities;
use crate::draw::Draw;
use crate::error::BackendError;
use crate::ops::{Activation, Heads, Moe, Scores};
use crate::output::{Output, OutputRows};
use crate::plan::StepPlan;
use crate::rope::Rope;

/// A device the model runs on, as `tallow info --devices` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// What the driver calls it.
    pub name: String,
    /// The backend that drives it (`"cpu"`, `"wgpu"`, ...) and, for GPUs, through what
    /// (`"wgpu (Vulkan)"`).
    pub backend: String,
    /// Memory it has, in bytes, where the driver says.
    pub memory: Option<u64>,
}

/// Bytes a backend holds in its device's memory: weights, KV pages and step buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// In buffers now.
    pub in_use: u64,
    /// The most at any time since the device was opened.
    pub peak: u64,
}

/// How the forward pass reads a weight matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixUse {
    /// In products with the activations.
    Product,
    /// One row at a time: the token embedding.
    Rows,
    /// Both: a token embedding that is also the LM head.
    RowsAndProduct,
}

/// A weight matrix of `rows` output features by `cols` input features, stored row-major in
/// the GGML block format of `tensor` (a fused tensor's part is a run of its rows).
#[derive(Debug, Clone)]
pub struct MatrixSpec {
    pub tensor: TensorInfo,
    pub rows: usize,
    pub cols: usize,
    pub usage: MatrixUse,
}

impl MatrixSpec {
    /// Rows `first..first + rows` of the matrix (or stack of matrices) in `whole`, rows of
    /// `cols` values, as a matrix of its own over the same bytes.
    pub fn row_run(whole: &TensorInfo, first: usize, rows: usize, cols: usize) -> MatrixSpec {
        let row_bytes = whole
            .ty
            .bytes_for(cols as u64)
            .expect("rows of whole blocks");
        let mut tensor = whole.clone();
        tensor.offset += first as u64 * row_bytes;
        tensor.size = rows as u64 * row_bytes;
        tensor.dims = vec![cols as u64, rows as u64];
        MatrixSpec {
            tensor,
            rows,
            cols,
            usage: MatrixUse::Product,
        }
    }

    /// Whether this matrix's bytes start where `prev`'s end, in the same tensor and with rows of
    /// the same format and length: the experts of a stack, the parts of a fused tensor. A
    /// backend may keep such matrices in one buffer.
    pub fn follows(&self, prev: &MatrixSpec) -> bool {
        let (t, p) = (&self.tensor, &prev.tensor);
        t.name == p.name
            && t.part == p.part
            && t.ty == p.ty
            && self.cols == prev.cols
            && t.offset == p.offset + p.size
    }
}

/// The experts of a mixture-of-experts layer: expert `e` is the gated feed-forward
/// `down[e](act(gate[e] · x) * (up[e] · x))`, each product plus its bias where there are
/// biases (gpt-oss).
pub struct Experts<B: Backend> {
    pub gate: Vec<B::Matrix>,
    pub up: Vec<B::Matrix>,
    pub down: Vec<B::Matrix>,
    /// The gate, up and down biases of every expert, each kind in one vector: expert `e`'s
    /// run of `width` values starts at `e * width`.
    pub biases: Option<[B::Vector; 3]>,
}

impl<B: Backend> Experts<B> {
    pub fn len(&self) -> usize {
        self.gate.len()
    }

    pub fn is_empty(&self) -> bool {
        self.gate.is_empty()
    }
}

/// What a step runs on: the batch, its plan (where its tokens' keys and values go, what their
/// attention reads), and the model's RoPEs (see [`Backend::upload_ropes`]).
pub struct StepInput<'a, B: Backend> {
    pub batch: &'a Batch,
    pub plan: &'a StepPlan,
    pub heads: Heads,
    /// Positions per KV page.
    pub page_size: usize,
    pub ropes: &'a B::Ropes,
    /// Where the step ends by drawing the tokens of its rows of logits ([`Output::Draw`]),
    /// their draws, known ahead: a GPU backend sends them with the plan.
    pub draws: Option<&'a [Draw]>,
}

/// A device the forward pass runs on. The forward is written once against this trait: weights
/// are uploaded once in their GGUF block formats, KV pages live in the backend's
/// [`PageStore`] (the page tables stay in [`PagedKvCache`], on the host, and each step's
/// [`StepPlan`] says what it needs of them), and a step is a sequence of a transformer's
/// operations ([`Step`]) over the tokens of a ragged batch. How a backend lays out weights or
/// KV pages, picks kernels or records the operations is its own.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A weight matrix on the device.
    type Matrix: Send + Sync;
    /// A vector of f32 on the device (norm gains, biases).
    type Vector: Send + Sync;
    /// A model's RoPEs, as the device applies them.
    type Ropes: Send + Sync;
    /// The KV pages.
    type Pages: PageStore;
    /// Memory that a step takes and the next one reuses; one per KV cache. Empty when made,
    /// sized by the first steps.
    type Scratch: Send + Sync + Default;
    /// One step's operations.
    type Step<'s>: Step<Self>
    where
        Self: 's;

    /// The device.
    fn device(&self) -> DeviceInfo;

    /// What the backend holds in device memory; None where it computes in host memory (the
    /// CPU: the process's resident memory tells).
    fn memory(&self) -> Option<DeviceMemory>;

    /// What the backend's kernels take: checked when a model loads and a KV cache is made.
    fn capabilities(&self) -> Capabilities;

    /// The rate, in bytes per second, at which the device reads `bytes` of its memory,
    /// measured on buffers made for the call: the limit of a decode step, which reads every
    /// weight once.
    fn read_rate(&self, bytes: usize) -> Result<f64, BackendError>;

    /// Uploads the matrices of `file` that `specs` describe, all at once (so that a backend
    /// can give back the file's pages as it goes).
    fn upload_matrices(
        &self,
        file: &Arc<GgufFile>,
        specs: &[MatrixSpec],
    ) -> Result<Vec<Self::Matrix>, BackendError>;

    fn upload_vector(&self, values: &[f32]) -> Result<Self::Vector, BackendError>;

    /// The distinct RoPEs of a model; a step's [`Step::rope`] names one by its index here.
    fn upload_ropes(&self, ropes: Vec<Rope>) -> Result<Self::Ropes, BackendError>;

    /// A pool of `n_pages` zeroed pages of `layout`, each holding the layers of one of `groups`.
    fn new_pages(
        &self,
        layout: KvLayout,
        groups: &LayerGroups,
        n_pages: usize,
    ) -> Result<Self::Pages, BackendError>;

    /// Runs `f` over a step of `input`, taking its memory from `scratch`.
    fn run_step<F>(
        &self,
        scratch: &mut Self::Scratch,
        input: &StepInput<'_, Self>,
        f: F,
    ) -> Result<(), BackendError>
    where
        F: for<'s> FnOnce(&mut Self::Step<'s>) -> Result<(), BackendError>;
}

/// The operations of one step, over [`Step::Rows`]: activations of the step's tokens (or of
/// the rows that produce logits), `width` floats a row, in the device's memory. A backend may
/// run each operation as it comes or record them and run them when the result is read
/// ([`Step::logits`]).
pub trait Step<B: Backend> {
    type Rows;

    /// `n` rows of `width` floats, each written before it is read.
    fn rows(&mut self, n: usize, width: usize) -> Result<Self::Rows, BackendError>;

    /// Rows holding `values`, `width` floats a row.
    fn upload(&mut self, values: &[f32], width: usize) -> Result<Self::Rows, BackendError>;

    /// Copies `x` to `out` in host memory (`out.len()` floats from the first).
    fn read(&mut self, x: &Self::Rows, out: &mut [f32]) -> Result<(), BackendError>;

    /// Row `t` of `out` is row `tokens[t]` of `table`, times `scale`.
    fn embed(
        &mut self,
        table: &B::Matrix,
        scale: f32,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError>;

    /// `out = x / rms(x) * gain`, row by row.
    fn rms_norm(
        &mut self,
        x: &Self::Rows,
        gain: &B::Vector,
        eps: f32,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError>;

    /// [`Step::rms_norm`] in place, over runs of `gain.len()` values (one per head when
    /// `gain` is a head long).
    fn rms_norm_in_place(
        &mut self,
        x: &mut Self::Rows,
        gain: &B::Vector,
        eps: f32,
    ) -> Result<(), BackendError>;

    /// `outs[i] = input · matrices[i]ᵀ`.
    fn matmul<const N: usize>(
        &mut self,
        input: &Self::Rows,
        matrices: [&B::Matrix; N],
        outs: [&mut Self::Rows; N],
    ) -> Result<(), BackendError>;

    /// Adds `bias` to every row.
    fn add_bias(&mut self, x: &mut Self::Rows, bias: &B::Vector) -> Result<(), BackendError>;

    /// Rotates every head of each token's row by RoPE `rope` at the token's position.
    fn rope(&mut self, rope: usize, x: &mut Self::Rows) -> Result<(), BackendError>;

    /// Writes each token's keys and values of `layer` to its slot in `cache`'s pages (the
    /// plan's), then copies the positions the plan's branches share with their parents. The
    /// backend may leave `k` and `v` changed (in the form its pages hold them).
    fn write_kv(
        &mut self,
        cache: &mut PagedKvCache,
        layer: usize,
        k: &mut Self::Rows,
        v: &mut Self::Rows,
    ) -> Result<(), BackendError>;

    /// Causal attention of each token's queries over its sequence's keys and values of
    /// `layer` up to its own position. Where there are `sinks` (one logit per query head,
    /// gpt-oss), each head's sink joins its softmax's denominator and adds no value. The
    /// backend may leave `q` changed.
    fn attention(
        &mut self,
        cache: &PagedKvCache,
        layer: usize,
        scores: Scores,
        sinks: Option<&B::Vector>,
        q: &mut Self::Rows,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError>;

    /// `gate = act(gate) * up`.
    fn gated(
        &mut self,
        activation: Activation,
        gate: &mut Self::Rows,
        up: &Self::Rows,
    ) -> Result<(), BackendError>;

    /// A mixture-of-experts block: each token's `router` logits (a row of one per expert)
    /// choose its `moe.top_k` experts and their weights ([`crate::Routing::route`]), and its
    /// row of `out` is the weighted sum of those experts of its row of `x`. Only the chosen
    /// experts' weights are read: the tokens that chose an expert are multiplied by it
    /// together.
    fn experts(
        &mut self,
        x: &Self::Rows,
        router: &Self::Rows,
        experts: &Experts<B>,
        moe: Moe,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError>;

    /// Multiplies row `t` of `x` by `sigmoid(gates[t])` (`gates`: one value a row).
    fn scale_by_sigmoid(
        &mut self,
        x: &mut Self::Rows,
        gates: &Self::Rows,
    ) -> Result<(), BackendError>;

    /// `x += y`.
    fn add(&mut self, x: &mut Self::Rows, y: &Self::Rows) -> Result<(), BackendError>;

    /// Copies the rows of `x` whose tokens produce logits or hidden states (the plan's
    /// `logit_rows` or `hidden_rows`, as `which` says), in order, to `out`.
    fn output_rows(
        &mut self,
        x: &Self::Rows,
        which: OutputRows,
        out: &mut Self::Rows,
    ) -> Result<(), BackendError>;

    /// The logits `softcap(x · mᵀ)` (`cap * tanh(v / cap)` when `softcap` is set) to host
    /// memory, or only each row's [`crate::argmax`] of them.
    fn logits(
        &mut self,
        x: &Self::Rows,
        m: &B::Matrix,
        softcap: Option<f32>,
        out: Output<'_>,
    ) -> Result<(), BackendError>;
}
