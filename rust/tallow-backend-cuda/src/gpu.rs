//! What the CUDA backend asks of a device: memory, copies and kernel launches by name. The
//! driver implements it on a GPU; the emulation (tallow-cuda-emulation) on the CPU.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tallow_backend::BackendError;

/// An address in a device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }
}

/// A kernel's arguments, in order, as `cuLaunchKernel` takes them: each value's bytes.
#[derive(Debug, Default, Clone)]
pub struct Args {
    values: Vec<[u8; 8]>,
    sizes: Vec<u32>,
}

impl Args {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, bytes: &[u8]) -> &mut Self {
        let mut value = [0u8; 8];
        value[..bytes.len()].copy_from_slice(bytes);
        self.values.push(value);
        self.sizes.push(bytes.len() as u32);
        self
    }

    /// A pointer to device memory.
    pub fn ptr(&mut self, p: DevicePtr) -> &mut Self {
        self.push(&p.0.to_ne_bytes())
    }

    /// An `int`.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }

    /// An `int` from a size or count, which must fit one.
    pub fn int(&mut self, v: usize) -> Result<&mut Self, BackendError> {
        let v = i32::try_from(v).map_err(|_| {
            BackendError::InvalidArgument(format!("{v} is beyond a kernel's 32-bit indices"))
        })?;
        Ok(self.i32(v))
    }

    /// A `float`.
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }

    /// Runs `launch` with the arguments as `cuLaunchKernel` takes them: a pointer to each
    /// value (to copies that live for the call).
    pub fn with_params<R>(&self, launch: impl FnOnce(&mut [*mut c_void]) -> R) -> R {
        let mut values = self.values.clone();
        let mut params: Vec<*mut c_void> =
            values.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
        launch(&mut params)
    }

    /// Each argument's size in bytes.
    pub fn sizes(&self) -> &[u32] {
        &self.sizes
    }
}

/// A device the CUDA backend's kernels run on.
pub trait Gpu: Send + Sync + 'static {
    /// What the device is called, and through what it runs (`"NVIDIA H100 (CUDA 12.8)"`).
    fn name(&self) -> String;

    /// Its memory in bytes, where known.
    fn total_memory(&self) -> Option<u64>;

    /// `bytes` of zeroed device memory.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr, BackendError>;

    /// Gives back memory from [`Gpu::alloc`].
    fn free(&self, ptr: DevicePtr);

    /// Copies `bytes` from the host to `dst`.
    fn write(&self, dst: DevicePtr, bytes: &[u8]) -> Result<(), BackendError>;

    /// Copies `out.len()` bytes from `src` to the host, after every launch before it.
    fn read(&self, src: DevicePtr, out: &mut [u8]) -> Result<(), BackendError>;

    /// Copies `bytes` from `src` to `dst` on the device, in order with the launches.
    fn copy(&self, src: DevicePtr, dst: DevicePtr, bytes: usize) -> Result<(), BackendError>;

    /// Runs kernel `name` over `grid` blocks of `block` threads with `args`.
    fn launch(
        &self,
        name: &str,
        grid: [u32; 3],
        block: [u32; 3],
        args: &Args,
    ) -> Result<(), BackendError>;
}

/// Bytes in device buffers now, and the most at any time.
#[derive(Debug, Default)]
pub(crate) struct Usage {
    in_use: AtomicU64,
    peak: AtomicU64,
}

impl Usage {
    pub(crate) fn now(&self) -> (u64, u64) {
        (
            self.in_use.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
        )
    }
}

/// A device and what the backend holds on it.
pub(crate) struct Device<G: Gpu> {
    pub gpu: G,
    pub usage: Usage,
}

/// Device memory, given back when dropped.
pub(crate) struct Buffer<G: Gpu> {
    device: Arc<Device<G>>,
    ptr: DevicePtr,
    bytes: usize,
}

impl<G: Gpu> Buffer<G> {
    /// `bytes` of zeroed memory on `device`.
    pub fn zeroed(device: &Arc<Device<G>>, bytes: usize) -> Result<Self, BackendError> {
        // A kernel may be handed an empty buffer's address: never a null one.
        let ptr = device.gpu.alloc(bytes.max(4))?;
        let usage = &device.usage;
        let in_use = usage.in_use.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        usage.peak.fetch_max(in_use, Ordering::Relaxed);
        Ok(Buffer {
            device: Arc::clone(device),
            ptr,
            bytes,
        })
    }

    /// A buffer holding `data`.
    pub fn with(device: &Arc<Device<G>>, data: &[u8]) -> Result<Self, BackendError> {
        let buffer = Self::zeroed(device, data.len())?;
        device.gpu.write(buffer.ptr, data)?;
        Ok(buffer)
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl<G: Gpu> Drop for Buffer<G> {
    fn drop(&mut self) {
        self.device.gpu.free(self.ptr);
        (self.device.usage.in_use).fetch_sub(self.bytes as u64, Ordering::Relaxed);
    }
}

/// The bytes of `values` (f32, u32, i32), as a device buffer holds them.
pub(crate) fn bytes_of<T: Copy + ToNeBytes>(values: &[T]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne()).collect()
}

/// Values that go to the device as their native-endian bytes.
pub(crate) trait ToNeBytes {
    fn to_ne(self) -> [u8; 4];
}

impl ToNeBytes for f32 {
    fn to_ne(self) -> [u8; 4] {
        self.to_ne_bytes()
    }
}

impl ToNeBytes for u32 {
    fn to_ne(self) -> [u8; 4] {
        self.to_ne_bytes()
    }
}
