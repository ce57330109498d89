//! What the backend asks of a device: memory, copies and kernel launches by name. Each GPU
//! API implements it (tallow-backend-cuda's driver, tallow-backend-metal); the emulation
//! (tallow-gpu-emulation) implements it on the CPU for either API's kernels.

use std::any::Any;
use std::collections::{BTreeSet, HashMap};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tallow_backend::BackendError;
use tallow_quant::GgmlType;

use crate::kernels::{AttentionTile, Product};

/// An address in a device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }
}

/// A kernel's arguments, in order: each value's bytes, and whether it is an address (a
/// buffer, which Metal binds apart from plain values).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Args {
    values: Vec<[u8; 8]>,
    sizes: Vec<u32>,
    pointers: Vec<bool>,
}

/// One argument of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    /// An address in device memory.
    Pointer(DevicePtr),
    /// A plain value's bytes (an `int`, a `float`).
    Value(&'a [u8]),
}

impl Args {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, bytes: &[u8], pointer: bool) -> &mut Self {
        let mut value = [0u8; 8];
        value[..bytes.len()].copy_from_slice(bytes);
        self.values.push(value);
        self.sizes.push(bytes.len() as u32);
        self.pointers.push(pointer);
        self
    }

    /// A pointer to device memory.
    pub fn ptr(&mut self, p: DevicePtr) -> &mut Self {
        self.push(&p.0.to_ne_bytes(), true)
    }

    /// An `int`.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.push(&v.to_ne_bytes(), false)
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
        self.push(&v.to_ne_bytes(), false)
    }

    /// The arguments in order.
    pub fn each(&self) -> impl Iterator<Item = Arg<'_>> {
        let values = self.values.iter().zip(&self.sizes).zip(&self.pointers);
        values.map(|((value, &size), &pointer)| match pointer {
            true => Arg::Pointer(DevicePtr(u64::from_ne_bytes(*value))),
            false => Arg::Value(&value[..size as usize]),
        })
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

/// A device the backend's kernels run on.
pub trait Gpu: Send + Sync + 'static {
    /// The API whose kernels it runs (`"cuda"`, `"metal"`): the backend's name.
    fn api(&self) -> &'static str;

    /// What the device is called, and through what it runs (`"NVIDIA H100 (CUDA 12.8)"`).
    fn name(&self) -> String;

    /// The kernels that take a product of `ty` weights by a step's `n_tokens` tokens: its
    /// API's choice (each API's crate says it in a function of the same name).
    fn product(&self, ty: GgmlType, n_tokens: usize) -> Product;

    /// How its tiled attention kernel for heads of at most `head_dims` dimensions (one of
    /// [`crate::kernels::ATTENTION_TILE_HEAD_DIMS`]) cuts a step: its API's choice (each API's
    /// crate says it in a function of the same name); `None` where its kernels have no tiled
    /// attention, and every token takes a block per head.
    fn attention_tile(&self, head_dims: usize) -> Option<AttentionTile>;

    /// The most bytes of one part of a weight matrix (larger ones are cut by rows into parts
    /// of their own allocations) and of one block of logits (a step's rows of logits are
    /// computed a block at a time where they are larger): the most one of its kernels'
    /// buffers may cover. `None` where it has no such limit.
    fn max_part(&self) -> Option<usize> {
        None
    }

    /// Whether its `draw_rows` draws at a temperature too. Where not, it takes greedy rows
    /// alone, and a step with another draw reads its logits back and draws on the host.
    fn draws_at_temperature(&self) -> bool {
        true
    }

    /// Its memory in bytes, where known.
    fn total_memory(&self) -> Option<u64>;

    /// `bytes` of zeroed device memory.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr, BackendError>;

    /// Host memory used in place as device memory, on a device that shares the host's memory:
    /// the device address of `region` (page-aligned, as a file's mapping is), which the device
    /// keeps `owner` alive for until it is freed. `None` where the device copies instead.
    fn borrow(
        &self,
        region: &[u8],
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Result<Option<DevicePtr>, BackendError> {
        let _ = (region, owner);
        Ok(None)
    }

    /// Gives back memory from [`Gpu::alloc`] or [`Gpu::borrow`].
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
    spare: Mutex<Spare>,
    /// The most bytes of spare step buffers kept: a 16th of the device's memory, at most 1 GiB.
    spare_limit: usize,
    /// Tables of experts' offsets from the first expert's address (the experts' products take
    /// one), each made the first time a step uses it and kept, with its size, until the
    /// device is dropped. A table is keyed by what it holds, so one that outlives the
    /// matrices it was made for is never read wrongly; uploading one per product would wait,
    /// each time, for every launch before it.
    offset_tables: Mutex<HashMap<Vec<u32>, (DevicePtr, usize)>>,
    /// The host regions used in place ([`Gpu::borrow`]), by their address: a file's mapping
    /// once for every matrix in it, until the device is dropped.
    borrowed: Mutex<HashMap<usize, DevicePtr>>,
}

/// Step buffers given back, by size, for later steps to take instead of allocating: a step
/// makes dozens, and a GPU's free waits for the whole device, which would stall every step.
/// The lowest address of a size is taken first: steps alike then take their buffers at the
/// same addresses whatever order the last one gave them back in, and a step replayed as a
/// graph ([`crate::Replayed`]) has few launches to update.
#[derive(Default)]
struct Spare {
    by_size: HashMap<usize, BTreeSet<DevicePtr>>,
    bytes: usize,
}

/// The size a step buffer of `bytes` is allocated with: sizes within an eighth of a power of
/// two share one, so that steps of slightly different shapes reuse each other's buffers.
fn step_size(bytes: usize) -> usize {
    let bytes = bytes.max(256);
    let unit = (bytes.next_power_of_two() / 8).max(256);
    bytes.div_ceil(unit) * unit
}

impl<G: Gpu> Device<G> {
    pub fn new(gpu: G) -> Self {
        const GIB: u64 = 1 << 30;
        let spare_limit = gpu.total_memory().map_or(GIB / 4, |m| (m / 16).min(GIB)) as usize;
        Device {
            gpu,
            usage: Usage::default(),
            spare: Mutex::default(),
            spare_limit,
            offset_tables: Mutex::default(),
            borrowed: Mutex::default(),
        }
    }

    /// The device address of `data`, a part of `region` that `owner` keeps alive, used in
    /// place; `None` where the device copies instead.
    pub fn borrowed(
        &self,
        region: &[u8],
        data: &[u8],
        owner: impl FnOnce() -> Arc<dyn Any + Send + Sync>,
    ) -> Result<Option<DevicePtr>, BackendError> {
        let mut borrowed = self.borrowed.lock().unwrap_or_else(|e| e.into_inner());
        let key = region.as_ptr() as usize;
        let base = match borrowed.get(&key) {
            Some(&base) => base,
            None => match self.gpu.borrow(region, owner())? {
                Some(base) => *borrowed.entry(key).or_insert(base),
                None => return Ok(None),
            },
        };
        Ok(Some(base.offset(data.as_ptr() as usize - key)))
    }

    /// A table on the device holding `offsets`, made once for each list of them.
    pub fn offset_table(&self, offsets: &[u32]) -> Result<DevicePtr, BackendError> {
        let mut tables = (self.offset_tables.lock()).unwrap_or_else(|e| e.into_inner());
        if let Some(&(ptr, _)) = tables.get(offsets) {
            return Ok(ptr);
        }
        let bytes = bytes_of(offsets);
        let ptr = self.alloc(bytes.len())?;
        if let Err(e) = self.gpu.write(ptr, &bytes) {
            self.free(ptr, bytes.len());
            return Err(e);
        }
        tables.insert(offsets.to_vec(), (ptr, bytes.len()));
        Ok(ptr)
    }

    /// `bytes` of fresh device memory, counted in use; where the device is full, the spare
    /// step buffers are given back first.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
        let ptr = self.gpu.alloc(bytes).or_else(|_| {
            self.release_spare();
            self.gpu.alloc(bytes)
        })?;
        let in_use = self.usage.in_use.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.usage.peak.fetch_max(in_use, Ordering::Relaxed);
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr, bytes: usize) {
        self.gpu.free(ptr);
        self.usage.in_use.fetch_sub(bytes as u64, Ordering::Relaxed);
    }

    fn spare(&self) -> std::sync::MutexGuard<'_, Spare> {
        self.spare.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release_spare(&self) {
        let by_size = {
            let mut spare = self.spare();
            spare.bytes = 0;
            std::mem::take(&mut spare.by_size)
        };
        for (size, ptrs) in by_size {
            for ptr in ptrs {
                self.free(ptr, size);
            }
        }
    }
}

impl<G: Gpu> Drop for Device<G> {
    fn drop(&mut self) {
        self.release_spare();
        let tables = std::mem::take(
            self.offset_tables
                .get_mut()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for (ptr, bytes) in tables.into_values() {
            self.free(ptr, bytes);
        }
        let borrowed = std::mem::take(self.borrowed.get_mut().unwrap_or_else(|e| e.into_inner()));
        for ptr in borrowed.into_values() {
            self.gpu.free(ptr);
        }
    }
}

/// Device memory, given back when dropped: freed, or kept for later steps where it was made
/// for one.
pub(crate) struct Buffer<G: Gpu> {
    device: Arc<Device<G>>,
    ptr: DevicePtr,
    bytes: usize,
    step: bool,
}

impl<G: Gpu> Buffer<G> {
    /// `bytes` of zeroed memory on `device`, for as long as the buffer lives.
    pub fn zeroed(device: &Arc<Device<G>>, bytes: usize) -> Result<Self, BackendError> {
        // A kernel may be handed an empty buffer's address: never a null one.
        let bytes = bytes.max(4);
        Ok(Buffer {
            device: Arc::clone(device),
            ptr: device.alloc(bytes)?,
            bytes,
            step: false,
        })
    }

    /// A buffer holding `data`, for as long as the buffer lives.
    pub fn with(device: &Arc<Device<G>>, data: &[u8]) -> Result<Self, BackendError> {
        let buffer = Self::zeroed(device, data.len())?;
        device.gpu.write(buffer.ptr, data)?;
        Ok(buffer)
    }

    /// A buffer holding `data` for one step.
    pub fn with_for_step(device: &Arc<Device<G>>, data: &[u8]) -> Result<Self, BackendError> {
        let buffer = Self::scratch_for_step(device, data.len())?;
        // Nothing to copy (a step with no hidden-state rows, say): no call to the driver.
        if !data.is_empty() {
            device.gpu.write(buffer.ptr, data)?;
        }
        Ok(buffer)
    }

    /// `bytes` for one step, holding whatever an earlier step left there: for what kernels
    /// write whole before anything reads it.
    pub fn scratch_for_step(device: &Arc<Device<G>>, bytes: usize) -> Result<Self, BackendError> {
        let size = step_size(bytes);
        let spare = {
            let mut spare = device.spare();
            let ptr = spare.by_size.get_mut(&size).and_then(BTreeSet::pop_first);
            if ptr.is_some() {
                spare.bytes -= size;
            }
            ptr
        };
        let ptr = match spare {
            Some(ptr) => ptr,
            None => device.alloc(size)?,
        };
        Ok(Buffer {
            device: Arc::clone(device),
            ptr,
            bytes: size,
            step: true,
        })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl<G: Gpu> Drop for Buffer<G> {
    fn drop(&mut self) {
        if self.step {
            let mut spare = self.device.spare();
            if spare.bytes + self.bytes <= self.device.spare_limit {
                spare.bytes += self.bytes;
                spare
                    .by_size
                    .entry(self.bytes)
                    .or_default()
                    .insert(self.ptr);
                return;
            }
        }
        self.device.free(self.ptr, self.bytes);
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
