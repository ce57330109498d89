//! What every native GPU backend shares: weights uploaded once in their GGUF block formats,
//! KV pages in device memory, and each operation of a step a kernel launched by name, with its
//! arguments in order, on a [`Gpu`]. A GPU API (CUDA, Metal) implements that small trait and
//! writes the kernels (`kernels-cuda/`, `kernels-metal/`), each with the name, parameters and
//! launch shape this crate gives it; the emulation (tallow-gpu-emulation) runs either set of
//! kernels on the CPU.

mod gpu;
pub mod kernels;
mod pages;
mod replay;
mod step;

use std::sync::Arc;

use tallow_backend::{
    Backend, BackendError, Capabilities, DeviceInfo, DeviceMemory, MatrixSpec, Rope, StepInput,
};
use tallow_gguf::GgufFile;
use tallow_kv::{KvDtype, KvLayout, LayerGroups};
use tallow_quant::GgmlType;

pub use gpu::{Arg, Args, DevicePtr, Gpu};
pub use kernels::{AttentionTile, Product, PRODUCT_TOKENS};
pub use pages::Pages;
pub use replay::{Launch, Replay, ReplayCounts, Replayed};
pub use step::GpuStep;

use gpu::{bytes_of, Buffer, Device};

/// The weight formats the kernels read (formats.h; kernels-wgsl/formats/): every format the
/// CPU runs.
pub const WEIGHT_FORMATS: [GgmlType; 25] = GgmlType::WEIGHTS;

/// Most dimensions of an attention head (the attention kernels').
pub const MAX_HEAD_DIM: usize = 256;

/// Most bytes [`Backend::read_rate`] copies: far more than a GPU's caches hold.
const MOST_PROBE_BYTES: usize = 1 << 30;

/// The backend on the device `G` drives.
pub struct GpuBackend<G: Gpu> {
    device: Arc<Device<G>>,
    /// About how many positions a block of a split attention takes (see
    /// [`kernels::ATTENTION_SPAN`]).
    attention_span: usize,
}

impl<G: Gpu> Clone for GpuBackend<G> {
    fn clone(&self) -> Self {
        GpuBackend {
            device: Arc::clone(&self.device),
            attention_span: self.attention_span,
        }
    }
}

impl<G: Gpu> GpuBackend<G> {
    /// The backend on `gpu`.
    pub fn new(gpu: G) -> Self {
        GpuBackend {
            device: Arc::new(Device::new(gpu)),
            attention_span: kernels::ATTENTION_SPAN,
        }
    }

    /// This backend with splits of attention over about `positions` positions each
    /// ([`kernels::ATTENTION_SPAN`] by default; at least one).
    pub fn with_attention_span(self, positions: usize) -> Self {
        GpuBackend {
            attention_span: positions.max(1),
            ..self
        }
    }

    /// About how many positions a block of a split attention takes.
    pub fn attention_span(&self) -> usize {
        self.attention_span
    }

    /// The device.
    pub fn gpu(&self) -> &G {
        &self.device.gpu
    }

    /// The bound of the rounding error of the products of `ty` weights, relative to their
    /// magnitude `Σ|w·x|` (the conformance suite's `products_bound`). Float products sum f32
    /// values of the decoded weights (a row's runs of 32 in f32). Integer products take the
    /// activations quantized to bytes a run of 32, each rounded by up to max|x| / 254, which a
    /// run with one large value makes large for the others: the CPU backend's bound, as its
    /// products round the activations alike. The emulation's kernel tests check those products
    /// exactly against the rounded activations.
    pub fn products_bound(&self, ty: GgmlType) -> f64 {
        let integer = |n| self.device.gpu.product(ty, n).is_integer();
        if integer(1) || integer(usize::MAX) {
            1.0 / 32.0
        } else {
            1e-5
        }
    }
}

/// Whether `ty` is one of the quantized formats of [`WEIGHT_FORMATS`], which have integer
/// products (formats.h's FOR_EACH_QUANTIZED_FORMAT); the others are floats.
pub fn is_quantized(ty: GgmlType) -> bool {
    WEIGHT_FORMATS.contains(&ty) && !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// A weight matrix in its GGUF block format, row after row: in one part, or in parts of
/// consecutive rows where it is larger than one of the device's buffers may be
/// ([`Gpu::max_part`]).
pub struct Matrix<G: Gpu> {
    parts: Vec<Part<G>>,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

/// Where a part's blocks are, at an offset from the start of what holds them: a copy on the
/// device (a buffer of its stack), or the model file's mapping of its stack used in place (a
/// device that shares the host's memory).
enum Weights<G: Gpu> {
    Copied(Arc<Buffer<G>>, usize),
    InPlace(DevicePtr, usize),
}

/// Rows `first_row..first_row + rows` of a matrix.
struct Part<G: Gpu> {
    weights: Weights<G>,
    first_row: usize,
    rows: usize,
}

impl<G: Gpu> Part<G> {
    fn ptr(&self) -> DevicePtr {
        let (base, offset) = self.place();
        base.offset(offset)
    }

    /// The start of the buffer (or of the mapping of the stack) it lies in, which the
    /// experts' offsets are taken from, and its offset from there.
    fn place(&self) -> (DevicePtr, usize) {
        match &self.weights {
            Weights::Copied(buffer, offset) => (buffer.ptr(), *offset),
            Weights::InPlace(base, offset) => (*base, *offset),
        }
    }
}

/// A vector of f32.
pub struct Vector<G: Gpu> {
    buffer: Buffer<G>,
    len: usize,
}

/// Nothing is kept between steps: each step's buffers are its own.
#[derive(Debug, Default)]
pub struct Scratch;

impl<G: Gpu> Backend for GpuBackend<G> {
    type Matrix = Matrix<G>;
    type Vector = Vector<G>;
    type Ropes = Vec<Rope>;
    type Pages = Pages<G>;
    type Scratch = Scratch;
    type Step<'s> = GpuStep<'s, G>;

    fn device(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.device.gpu.name(),
            backend: self.device.gpu.api().into(),
            memory: self.device.gpu.total_memory(),
        }
    }

    fn memory(&self) -> Option<DeviceMemory> {
        let (in_use, peak) = self.device.usage.now();
        Some(DeviceMemory { in_use, peak })
    }

    /// The best of three copies of `bytes` (at most [`MOST_PROBE_BYTES`], and what one of the
    /// device's buffers may hold) from one buffer to another, counting the bytes read and
    /// those written: a GPU's copy engines and kernels move memory about as fast either way.
    fn read_rate(&self, bytes: usize) -> Result<f64, BackendError> {
        let most = self.device.gpu.max_part().unwrap_or(usize::MAX);
        let bytes = bytes.clamp(4, MOST_PROBE_BYTES.min(most)) / 4 * 4;
        let from = Buffer::zeroed(&self.device, bytes)?;
        let to = Buffer::zeroed(&self.device, bytes)?;
        let gpu = &self.device.gpu;
        let mut done = [0u8; 4];
        // Once untimed: the first touch of fresh memory may cost the device more.
        gpu.copy(from.ptr(), to.ptr(), bytes)?;
        gpu.read(to.ptr(), &mut done)?;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let start = std::time::Instant::now();
            gpu.copy(from.ptr(), to.ptr(), bytes)?;
            gpu.read(to.ptr(), &mut done)?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok(2.0 * bytes as f64 / best)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: self.device.gpu.api(),
            weight_formats: WEIGHT_FORMATS.to_vec(),
            kv_dtypes: vec![KvDtype::F16, KvDtype::Q8_0],
            max_head_dim: MAX_HEAD_DIM,
            head_dim_multiple: 1,
            experts: true,
        }
    }

    fn upload_matrices(
        &self,
        file: &Arc<GgufFile>,
        specs: &[MatrixSpec],
    ) -> Result<Vec<Matrix<G>>, BackendError> {
        let mut matrices = Vec::with_capacity(specs.len());
        let mut start = 0;
        while start < specs.len() {
            let len = 1
                + (specs[start + 1..].iter().zip(&specs[start..]))
                    .take_while(|(spec, prev)| spec.follows(prev))
                    .count();
            matrices.extend(self.upload_stack(file, &specs[start..start + len])?);
            start += len;
        }
        // Reading a stack maps the file's pages around it too, some of them a neighbour's
        // already released: a last sweep gives back the pages of every copied matrix.
        for (spec, matrix) in specs.iter().zip(&matrices) {
            if let Weights::Copied(..) = matrix.parts[0].weights {
                file.release(&spec.tensor, 0..spec.tensor.size as usize);
            }
        }
        Ok(matrices)
    }

    fn upload_vector(&self, values: &[f32]) -> Result<Vector<G>, BackendError> {
        Ok(Vector {
            buffer: Buffer::with(&self.device, &bytes_of(values))?,
            len: values.len(),
        })
    }

    fn upload_ropes(&self, ropes: Vec<Rope>) -> Result<Vec<Rope>, BackendError> {
        Ok(ropes)
    }

    fn new_pages(
        &self,
        layout: KvLayout,
        groups: &LayerGroups,
        n_pages: usize,
    ) -> Result<Pages<G>, BackendError> {
        let capabilities = self.capabilities();
        capabilities.check_kv(layout.dtype)?;
        capabilities.check_head_dim(layout.head_dim)?;
        Pages::new(&self.device, layout, groups, n_pages)
    }

    fn run_step<F>(
        &self,
        _: &mut Scratch,
        input: &StepInput<'_, Self>,
        f: F,
    ) -> Result<(), BackendError>
    where
        F: for<'s> FnOnce(&mut GpuStep<'s, G>) -> Result<(), BackendError>,
    {
        let mut step = GpuStep::new(&self.device, input, self.attention_span)?;
        f(&mut step)
    }
}

impl<G: Gpu> GpuBackend<G> {
    /// The matrices of `specs`, which lie back to back in one tensor (see
    /// [`MatrixSpec::follows`]: the experts of a stack, the parts of a fused tensor), in one
    /// allocation, so that a mixture's products find every expert from the first one's
    /// address (the experts kernels take each expert's offset from it); in several where
    /// the stack is larger than the device's parts may be, cut by rows.
    fn upload_stack(
        &self,
        file: &Arc<GgufFile>,
        specs: &[MatrixSpec],
    ) -> Result<Vec<Matrix<G>>, BackendError> {
        let first = &specs[0];
        let ty = first.tensor.ty;
        // The kernels take rows a run of 32 values at a time.
        if !WEIGHT_FORMATS.contains(&ty) || !first.cols.is_multiple_of(ty.block_len().max(32)) {
            return Err(BackendError::Unsupported(format!(
                "{} ({} weights, rows of {}) on {}",
                first.tensor.name,
                ty.name(),
                first.cols,
                self.device.gpu.api()
            )));
        }
        let mut whole = first.tensor.clone();
        whole.size = specs.iter().map(|s| s.tensor.size).sum();
        let data = file.tensor_data(&whole);
        let in_place = match file.mapping(&whole) {
            Some(region) => self
                .device
                .borrowed(region, data, || Arc::clone(file) as _)?,
            None => None,
        };
        let row_bytes = first.tensor.size as usize / first.rows.max(1);
        let total_rows: usize = specs.iter().map(|s| s.rows).sum();
        // Each buffer's rows: all of them, or as many as the device's parts take (whole
        // matrices where each fits, so that a stack's buffers end between them).
        let mut per_buffer = total_rows;
        if in_place.is_none() {
            let limit = self.device.gpu.max_part().unwrap_or(usize::MAX);
            per_buffer = (limit / row_bytes.max(1)).min(total_rows);
            if per_buffer == 0 {
                return Err(BackendError::Unsupported(format!(
                    "{}: a row of {row_bytes} bytes on {}, whose buffers hold at most {limit}",
                    first.tensor.name,
                    self.device.gpu.api()
                )));
            }
            if specs.iter().all(|s| s.rows == first.rows) && first.rows <= per_buffer {
                per_buffer -= per_buffer % first.rows;
            }
        }
        let mut buffers = Vec::new();
        for start in (0..total_rows.max(1)).step_by(per_buffer.max(1)) {
            let end = (start + per_buffer).min(total_rows);
            buffers.push(match in_place {
                Some(ptr) => Weights::InPlace(ptr, 0),
                None => {
                    let bytes = &data[start * row_bytes..end * row_bytes];
                    Weights::Copied(Arc::new(Buffer::with(&self.device, bytes)?), 0)
                }
            });
        }
        if in_place.is_none() {
            // The host keeps no second copy: the file's pages go back to the OS.
            file.release(&whole, 0..data.len());
        }
        let mut matrices = Vec::with_capacity(specs.len());
        let mut at = 0;
        for spec in specs {
            let mut parts = Vec::new();
            let mut row = at;
            while row < at + spec.rows {
                let buffer = row / per_buffer;
                let end = ((buffer + 1) * per_buffer).min(at + spec.rows);
                let offset = (row - buffer * per_buffer) * row_bytes;
                let weights = match &buffers[buffer] {
                    Weights::Copied(b, _) => Weights::Copied(Arc::clone(b), offset),
                    Weights::InPlace(ptr, _) => Weights::InPlace(*ptr, offset),
                };
                parts.push(Part {
                    weights,
                    first_row: row - at,
                    rows: end - row,
                });
                row = end;
            }
            matrices.push(Matrix {
                parts,
                ty,
                rows: spec.rows,
                cols: spec.cols,
                row_bytes,
            });
            at += spec.rows;
        }
        Ok(matrices)
    }
}
