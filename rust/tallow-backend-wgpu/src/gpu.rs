//! A GPU through wgpu as tallow-backend-gpu's [`Gpu`]: its device memory, copies and kernel
//! launches.
//!
//! - An address is a buffer's number (bits 40 and up) and a byte offset in it. A launch binds
//!   each pointer argument's buffer whole, in order, and writes every argument (a pointer as
//!   its offset) and the grid into the kernel's uniform parameters (kernels-wgsl/tallow.wgsl).
//! - Launches, fills and copies are recorded into one command encoder, submitted when the host
//!   writes or reads, or after [`PASSES_A_SUBMIT`] launches; wgpu keeps a freed buffer until
//!   the work that uses it is done.
//! - Errors wgpu reports (validation, out of memory) become [`BackendError`]s, never panics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tallow_backend::BackendError;
use tallow_backend_gpu::{Arg, Args, AttentionTile, DevicePtr, Gpu, Product};
use tallow_quant::GgmlType;

use crate::codebooks::Codebooks;
use crate::kernels::{self, Pipeline};

/// Where a buffer's number starts in an address: a buffer holds at most 1 TiB.
const BUFFER_SHIFT: u32 = 40;

/// Launches recorded before the encoder is submitted, so that the GPU starts on a long step
/// while the host records the rest.
const PASSES_A_SUBMIT: usize = 64;

/// Bytes of one write handed to the queue at a time: wgpu stages a write in host memory
/// until it is submitted.
const WRITE_PART: usize = 64 << 20;

/// A GPU through wgpu.
pub struct Wgpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    name: String,
    /// The most bytes one buffer may hold and one binding may cover.
    max_buffer: u64,
    /// The most bytes of a part of a weight matrix and of a block of logits: the adapter's
    /// `max_buffer`, or less where asked ([`crate::WgpuOptions`]).
    max_part: usize,
    /// The most workgroups of a dispatch along one dimension.
    max_groups: u32,
    /// Whether the kernels are laid out for a software adapter (Mesa's llvmpipe), whose
    /// invocations are a CPU's.
    software: bool,
    /// Errors wgpu reported outside any error scope (it would panic on them otherwise).
    uncaptured: Arc<Mutex<Vec<String>>>,
    state: Mutex<State>,
    pipelines: Mutex<HashMap<(String, u32), Arc<Pipeline>>>,
    /// The codebooks of the IQ formats, made when a kernel first takes them.
    codebooks: OnceLock<Codebooks>,
}

/// The buffers and the work recorded but not submitted.
#[derive(Default)]
struct State {
    buffers: HashMap<u64, wgpu::Buffer>,
    next: u64,
    encoder: Option<wgpu::CommandEncoder>,
    passes: usize,
}

impl State {
    /// The buffer of `ptr`, and the offset in it.
    fn find(&self, ptr: DevicePtr) -> Result<(wgpu::Buffer, u64), BackendError> {
        let offset = ptr.0 & ((1 << BUFFER_SHIFT) - 1);
        match self.buffers.get(&(ptr.0 >> BUFFER_SHIFT)) {
            Some(buffer) if offset <= buffer.size() => Ok((buffer.clone(), offset)),
            _ => Err(BackendError::InvalidArgument(format!(
                "address {:#x} is in no buffer",
                ptr.0
            ))),
        }
    }

    fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.encoder
            .get_or_insert_with(|| device.create_command_encoder(&Default::default()))
    }
}

impl Wgpu {
    pub(crate) fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        name: String,
        limits: &wgpu::Limits,
        software: bool,
        max_part: Option<usize>,
    ) -> Wgpu {
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&uncaptured);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(e.to_string())
        }));
        let max_buffer = (limits.max_storage_buffer_binding_size).min(limits.max_buffer_size);
        Wgpu {
            device,
            queue,
            name,
            max_buffer,
            max_part: max_part.unwrap_or(usize::MAX).min(max_buffer as usize),
            max_groups: limits.max_compute_workgroups_per_dimension,
            software,
            uncaptured,
            state: Mutex::default(),
            pipelines: Mutex::default(),
            codebooks: OnceLock::new(),
        }
    }

    /// Whether its kernels are laid out for a software adapter ([`crate::WgpuOptions`]).
    pub fn software_layout(&self) -> bool {
        self.software
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f`, turning the validation and out-of-memory errors it causes, and any reported
    /// since the last call, into an error.
    fn checked<T>(&self, f: impl FnOnce(&wgpu::Device) -> T) -> Result<T, BackendError> {
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f(&self.device);
        let errors = [
            pollster::block_on(validation.pop()),
            pollster::block_on(memory.pop()),
        ];
        if let Some(e) = errors.into_iter().flatten().next() {
            return Err(device_error(e));
        }
        let mut uncaptured = self.uncaptured.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = uncaptured.drain(..).next() {
            return Err(BackendError::Device(e));
        }
        Ok(value)
    }

    /// Submits the work recorded so far.
    fn submit(&self, state: &mut State) -> Result<(), BackendError> {
        state.passes = 0;
        match state.encoder.take() {
            Some(encoder) => self
                .checked(|_| self.queue.submit([encoder.finish()]))
                .map(drop),
            None => Ok(()),
        }
    }

    /// The pipeline of kernel `name` for blocks of `block`, compiled on first use.
    pub(crate) fn pipeline(
        &self,
        name: &str,
        block: u32,
        buffers: usize,
    ) -> Result<Arc<Pipeline>, BackendError> {
        let key = (name.to_string(), block);
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pipelines.get(&key) {
            return Ok(Arc::clone(p));
        }
        let source = kernels::source(name)
            .ok_or_else(|| BackendError::Unsupported(format!("no kernel {name} on wgpu")))?;
        let codebooks = match kernels::takes_codebooks(&source) {
            true => Some(&self.codebooks()?.layout),
            false => None,
        };
        let pipeline = self
            .checked(|device| Pipeline::new(device, name, source, block, buffers, codebooks))
            .map_err(|e| BackendError::Device(format!("kernel {name}: {e}")))?;
        let pipeline = Arc::new(pipeline);
        pipelines.insert(key, Arc::clone(&pipeline));
        Ok(pipeline)
    }

    /// The codebooks' bind group, made on first use.
    fn codebooks(&self) -> Result<&Codebooks, BackendError> {
        if let Some(codebooks) = self.codebooks.get() {
            return Ok(codebooks);
        }
        let made = self.checked(Codebooks::new)??;
        Ok(self.codebooks.get_or_init(|| made))
    }

    /// A copy no buffer copy can make: between places that are not whole words, or within one
    /// buffer (the copy_bytes kernel).
    fn copy_by_kernel(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        bytes: usize,
    ) -> Result<(), BackendError> {
        let mut args = Args::new();
        args.ptr(src).ptr(dst).int(bytes)?;
        let blocks = bytes.div_ceil(256) as u32;
        self.launch("copy_bytes", [blocks, 1, 1], [256, 1, 1], &args)
    }
}

impl Gpu for Wgpu {
    fn api(&self) -> &'static str {
        "wgpu"
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    /// f32 products over the decoded weights for every format and step: a weight row a warp
    /// on a GPU, whole rows an invocation in tiles on a software adapter (products.wgsl,
    /// products_tiles.wgsl).
    fn product(&self, _ty: GgmlType, _n_tokens: usize) -> Product {
        match self.software {
            true => Product::FloatTiles,
            false => Product::Float,
        }
    }

    fn attention_tile(&self, _head_dims: usize) -> Option<AttentionTile> {
        None
    }

    fn draws_at_temperature(&self) -> bool {
        false
    }

    fn max_part(&self) -> Option<usize> {
        Some(self.max_part)
    }

    fn total_memory(&self) -> Option<u64> {
        None
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
        let size = bytes.max(4).next_multiple_of(4) as u64;
        if size > self.max_buffer {
            return Err(BackendError::Unsupported(format!(
                "a buffer of {size} bytes on {}: its buffers hold at most {} bytes",
                self.name, self.max_buffer
            )));
        }
        let buffer = self.checked(|device| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        let mut state = self.state();
        state.next += 1;
        let id = state.next;
        state.buffers.insert(id, buffer);
        Ok(DevicePtr(id << BUFFER_SHIFT))
    }

    fn free(&self, ptr: DevicePtr) {
        self.state().buffers.remove(&(ptr.0 >> BUFFER_SHIFT));
    }

    fn write(&self, dst: DevicePtr, bytes: &[u8]) -> Result<(), BackendError> {
        let mut state = self.state();
        let (buffer, offset) = state.find(dst)?;
        if offset % 4 != 0 || offset + bytes.len() as u64 > buffer.size() {
            return Err(BackendError::InvalidArgument(format!(
                "a write of {} bytes at byte {offset} of a buffer of {}",
                bytes.len(),
                buffer.size()
            )));
        }
        // The queue's writes come before any work submitted after them: what was recorded
        // before this one goes first.
        self.submit(&mut state)?;
        for (i, part) in bytes.chunks(WRITE_PART).enumerate() {
            let at = offset + (i * WRITE_PART) as u64;
            let mut words = part.to_vec();
            words.resize(part.len().next_multiple_of(4), 0);
            self.checked(|_| {
                self.queue.write_buffer(&buffer, at, &words);
                self.queue.submit([]);
            })?;
        }
        Ok(())
    }

    fn read(&self, src: DevicePtr, out: &mut [u8]) -> Result<(), BackendError> {
        let mut state = self.state();
        let (buffer, offset) = state.find(src)?;
        let size = (out.len() as u64).next_multiple_of(4).max(4);
        if offset % 4 != 0 || offset + size > buffer.size() {
            return Err(BackendError::InvalidArgument(format!(
                "a read of {} bytes at byte {offset} of a buffer of {}",
                out.len(),
                buffer.size()
            )));
        }
        let staging = self.checked(|device| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("read"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        state
            .encoder(&self.device)
            .copy_buffer_to_buffer(&buffer, offset, &staging, 0, size);
        self.submit(&mut state)?;
        drop(state);
        let slice = staging.slice(..);
        let (sender, receiver) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = sender.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(device_error)?;
        receiver
            .recv()
            .map_err(device_error)?
            .map_err(device_error)?;
        let bytes = slice.get_mapped_range().map_err(device_error)?;
        out.copy_from_slice(&bytes[..out.len()]);
        drop(bytes);
        staging.unmap();
        self.checked(|_| ())
    }

    fn copy(&self, src: DevicePtr, dst: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        let mut state = self.state();
        let (from, src_offset) = state.find(src)?;
        let (to, dst_offset) = state.find(dst)?;
        let words = [src_offset, dst_offset, bytes as u64]
            .iter()
            .all(|v| v % 4 == 0);
        // A buffer copy takes whole words between two buffers.
        if !words || from == to {
            drop(state);
            return self.copy_by_kernel(src, dst, bytes);
        }
        state.encoder(&self.device).copy_buffer_to_buffer(
            &from,
            src_offset,
            &to,
            dst_offset,
            bytes as u64,
        );
        Ok(())
    }

    fn launch(
        &self,
        name: &str,
        grid: [u32; 3],
        block: [u32; 3],
        args: &Args,
    ) -> Result<(), BackendError> {
        let n_buffers = args.each().filter(|a| matches!(a, Arg::Pointer(_))).count();
        let pipeline = self.pipeline(name, block[0], n_buffers)?;
        let codebooks = match pipeline.takes_codebooks {
            true => Some(&self.codebooks()?.group),
            false => None,
        };
        let mut state = self.state();
        let mut buffers = Vec::with_capacity(n_buffers);
        let mut params: Vec<u8> = Vec::new();
        for arg in args.each() {
            match arg {
                Arg::Pointer(p) => {
                    let (buffer, offset) = state.find(p)?;
                    buffers.push(buffer);
                    params.extend((offset as u32).to_ne_bytes());
                }
                Arg::Value(bytes) => params.extend(bytes),
            }
        }
        // A grid wider than a dispatch may be takes the rest of x along z (tallow.wgsl's
        // block_id).
        let folds = grid[0].div_ceil(self.max_groups).max(1);
        let groups = [grid[0].min(self.max_groups), grid[1], grid[2] * folds];
        if groups[1] > self.max_groups || groups[2] > self.max_groups {
            return Err(BackendError::Unsupported(format!(
                "a launch of {grid:?} blocks of {name} on {}",
                self.name
            )));
        }
        params.extend(grid.iter().flat_map(|g| g.to_ne_bytes()));
        params.resize(params.len().next_multiple_of(16), 0);
        let uniform = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: params.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: true,
        });
        uniform
            .get_mapped_range_mut(..)
            .map_err(device_error)?
            .copy_from_slice(&params);
        uniform.unmap();
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = (buffers.iter().enumerate())
            .map(|(i, buffer)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: n_buffers as u32,
            resource: uniform.as_entire_binding(),
        });
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &pipeline.layout,
            entries: &entries,
        });
        {
            let mut pass = state
                .encoder(&self.device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            if let Some(codebooks) = codebooks {
                pass.set_bind_group(1, codebooks, &[]);
            }
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
        state.passes += 1;
        if state.passes >= PASSES_A_SUBMIT {
            self.submit(&mut state)?;
        }
        Ok(())
    }
}

fn device_error(e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(e.to_string())
}
