//! An opened GPU: its device and queue, errors caught instead of panicking, and the buffer
//! helpers the rest of the backend uses.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tallow_backend::{BackendError, DeviceInfo, DeviceMemory};

pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: DeviceInfo,
    /// The most bytes one buffer may hold and one binding may cover.
    pub max_binding: u64,
    /// Whether the adapter is software (Mesa's llvmpipe): its invocations are a CPU's.
    pub software: bool,
    /// Errors wgpu reported outside any error scope (it would panic on them otherwise).
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// Bytes in the buffers made here.
    memory: Arc<Counter>,
}

/// Bytes in live buffers, and the most there have been.
#[derive(Default)]
struct Counter {
    live: AtomicU64,
    peak: AtomicU64,
}

/// A buffer whose bytes count in its GPU's [`DeviceMemory`] until the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Buffer {
    raw: wgpu::Buffer,
    _held: Arc<Held>,
}

struct Held {
    size: u64,
    memory: Arc<Counter>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.memory.live.fetch_sub(self.size, Ordering::Relaxed);
    }
}

impl Buffer {
    /// Whether `other` is this buffer (a clone of it).
    pub(crate) fn same(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self._held, &other._held)
    }
}

impl Deref for Buffer {
    type Target = wgpu::Buffer;

    fn deref(&self) -> &wgpu::Buffer {
        &self.raw
    }
}

impl Gpu {
    pub(crate) fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: DeviceInfo,
        max_binding: u64,
        software: bool,
    ) -> Gpu {
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&uncaptured);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(e.to_string())
        }));
        Gpu {
            device,
            queue,
            info,
            max_binding,
            software,
            uncaptured,
            memory: Arc::default(),
        }
    }

    /// Bytes in buffers now, and the most since the device was opened.
    pub(crate) fn memory(&self) -> DeviceMemory {
        DeviceMemory {
            in_use: self.memory.live.load(Ordering::Relaxed),
            peak: self.memory.peak.load(Ordering::Relaxed),
        }
    }

    /// A buffer made as `desc` says, counted in [`Gpu::memory`].
    pub(crate) fn create(&self, desc: &wgpu::BufferDescriptor<'_>) -> Result<Buffer, BackendError> {
        let raw = self.checked(|device| device.create_buffer(desc))?;
        let live = self.memory.live.fetch_add(desc.size, Ordering::Relaxed) + desc.size;
        self.memory.peak.fetch_max(live, Ordering::Relaxed);
        Ok(Buffer {
            raw,
            _held: Arc::new(Held {
                size: desc.size,
                memory: Arc::clone(&self.memory),
            }),
        })
    }

    /// Runs `f`, turning the validation and out-of-memory errors it causes into an error.
    pub(crate) fn checked<T>(&self, f: impl FnOnce(&wgpu::Device) -> T) -> Result<T, BackendError> {
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f(&self.device);
        let errors = [
            pollster::block_on(validation.pop()),
            pollster::block_on(memory.pop()),
        ];
        if let Some(e) = errors.into_iter().flatten().next() {
            return Err(BackendError::Device(e.to_string()));
        }
        let mut uncaptured = self.uncaptured.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = uncaptured.drain(..).next() {
            return Err(BackendError::Device(e));
        }
        Ok(value)
    }

    /// A storage buffer holding `bytes` (padded to whole words), usable as a copy source and
    /// destination.
    pub(crate) fn buffer_with(&self, bytes: &[u8]) -> Result<Buffer, BackendError> {
        let size = (bytes.len().max(4).next_multiple_of(4)) as u64;
        self.check_size(size)?;
        let buffer = self.create(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: storage_usage(),
            mapped_at_creation: true,
        })?;
        buffer
            .get_mapped_range_mut(..)
            .map_err(device_error)?
            .slice(..bytes.len())
            .copy_from_slice(bytes);
        buffer.unmap();
        Ok(buffer)
    }

    /// A zeroed storage buffer of `size` bytes.
    pub(crate) fn zeroed(&self, size: u64) -> Result<Buffer, BackendError> {
        let size = size.max(4).next_multiple_of(4);
        self.check_size(size)?;
        self.create(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: storage_usage(),
            mapped_at_creation: false,
        })
    }

    fn check_size(&self, size: u64) -> Result<(), BackendError> {
        if size > self.max_binding {
            return Err(BackendError::Device(format!(
                "a buffer of {size} bytes is larger than {} allows ({} bytes)",
                self.info.name, self.max_binding
            )));
        }
        Ok(())
    }

    /// Copies the first `out.len()` values of `src` to `out`, after everything submitted.
    pub(crate) fn read<T: Word>(
        &self,
        mut encoder: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        out: &mut [T],
    ) -> Result<(), BackendError> {
        let size = (out.len() * 4) as u64;
        let staging = self.create(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: size.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })?;
        if size > 0 {
            encoder.copy_buffer_to_buffer(src, 0, &staging, 0, size);
        }
        self.checked(|_| self.queue.submit([encoder.finish()]))?;
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
        for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = T::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        drop(bytes);
        staging.unmap();
        Ok(())
    }
}

/// A value of four bytes that the kernels write.
pub(crate) trait Word: Copy {
    fn from_le_bytes(bytes: [u8; 4]) -> Self;
}

impl Word for f32 {
    fn from_le_bytes(bytes: [u8; 4]) -> Self {
        f32::from_le_bytes(bytes)
    }
}

impl Word for u32 {
    fn from_le_bytes(bytes: [u8; 4]) -> Self {
        u32::from_le_bytes(bytes)
    }
}

pub(crate) fn device_error(e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(e.to_string())
}

pub(crate) fn storage_usage() -> wgpu::BufferUsages {
    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST
}
