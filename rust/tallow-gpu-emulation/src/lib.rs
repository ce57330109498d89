//! The GPU backends' kernels run on the CPU, for tests without a GPU: CUDA's
//! (`kernels-cuda/`) and Metal's (`kernels-metal/`).
//!
//! Each kernel's source is compiled as C++ after its API's header
//! (`kernels-cuda/emulation/cuda_emulation.h`, `kernels-metal/emulation/metal_emulation.h`) on
//! one scheduler (`emulator/`), which runs a launch's blocks one after the other and each
//! block's threads as fibers that switch where the kernel synchronizes: a block barrier
//! (`__syncthreads`, `threadgroup_barrier`) waits for every live thread of the block, warp
//! (SIMD-group) operations exchange values between 32 threads (a warp that diverges there is
//! an error), block-shared memory is the block's. Device memory is host memory: [`Emulated`]
//! is the [`Gpu`] the backend runs on here, with either API's kernels.

use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;

use tallow_backend::BackendError;
use tallow_backend_gpu::{
    Args, AttentionTile, DevicePtr, Gpu, GpuBackend, Launch, Product, Replay, Replayed,
};
use tallow_quant::GgmlType;

extern "C" {
    fn tallow_emu_register_metal();
    fn tallow_emu_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        params: *mut *mut c_void,
        sizes: *const u32,
        n_params: u32,
    ) -> *const c_char;
}

/// Why a launch did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LaunchError(pub String);

/// The device address of host memory at `p`: what a kernel under emulation reads.
pub fn host<T>(p: *const T) -> DevicePtr {
    DevicePtr(p as usize as u64)
}

/// The GPU API whose kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `kernels-cuda/`.
    Cuda,
    /// `kernels-metal/`.
    Metal,
}

impl Api {
    /// Its name, as the backend reports it.
    pub fn name(self) -> &'static str {
        match self {
            Api::Cuda => "cuda",
            Api::Metal => "metal",
        }
    }

    /// The kernels of its products of `ty` weights by `n_tokens` tokens, as on its GPUs.
    pub fn product(self, ty: GgmlType, n_tokens: usize) -> Product {
        match self {
            Api::Cuda => tallow_backend_cuda::product(ty, n_tokens),
            Api::Metal => tallow_backend_metal::product(ty, n_tokens),
        }
    }

    /// How its tiled attention for heads of at most `head_dims` dimensions cuts a step, as
    /// on its GPUs.
    pub fn attention_tile(self, head_dims: usize) -> AttentionTile {
        match self {
            Api::Cuda => tallow_backend_cuda::attention_tile(head_dims),
            Api::Metal => tallow_backend_metal::attention_tile(head_dims),
        }
    }
}

/// Runs `api`'s kernel `name` over `grid` blocks of `block` threads with `args`, which must
/// match its parameters in number and size.
///
/// # Safety
/// The pointers among `args` must be valid for every access the kernel makes through them.
pub unsafe fn launch(
    api: Api,
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &Args,
) -> Result<(), LaunchError> {
    if api == Api::Metal {
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers the Metal kernels' trampolines; no arguments.
        REGISTERED.call_once(|| unsafe { tallow_emu_register_metal() });
    }
    let name = CString::new(format!("{}/{name}", api.name()))
        .map_err(|_| LaunchError("a kernel's name has no NUL".into()))?;
    // SAFETY: every pointer passed lives until the call returns; the emulator checks the
    // arguments' count and sizes against the kernel's parameters; the caller vouches for the
    // memory the kernel reaches through them.
    let error = args.with_params(|params| unsafe {
        tallow_emu_launch(
            name.as_ptr(),
            grid.as_ptr(),
            block.as_ptr(),
            params.as_mut_ptr(),
            args.sizes().as_ptr(),
            args.sizes().len() as u32,
        )
    });
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: a NUL-terminated message, valid until this thread's next launch.
    Err(LaunchError(
        unsafe { CStr::from_ptr(error) }
            .to_string_lossy()
            .into_owned(),
    ))
}

/// A GPU emulated on the CPU: its memory is host memory, its kernels `api`'s under the
/// emulation. Copies are checked against the allocations they touch. As on the real devices,
/// Metal's uses the model file's mapping in place (unified memory) where CUDA's copies it.
pub struct Emulated {
    api: Api,
    /// Each allocation by its address.
    allocations: Mutex<BTreeMap<u64, Memory>>,
    /// Allocations made so far.
    made: AtomicU64,
    /// Copies from the host made so far.
    writes: AtomicU64,
    /// The most launches a graph may hold (as a GPU's memory bounds its graphs); `None` for
    /// no bound.
    graph_launches: Option<usize>,
}

/// An allocation of the emulated device.
enum Memory {
    /// Device memory (16-byte aligned, as device memory is more than).
    Owned(Box<[u128]>),
    /// Host memory used in place, `len` bytes that `_owner` keeps alive.
    Borrowed {
        len: usize,
        _owner: Arc<dyn Any + Send + Sync>,
    },
}

impl Memory {
    fn len(&self) -> usize {
        match self {
            Memory::Owned(words) => words.len() * 16,
            Memory::Borrowed { len, .. } => *len,
        }
    }
}

impl std::fmt::Debug for Emulated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulated").field("api", &self.api).finish()
    }
}

impl Emulated {
    /// A new emulated device running `api`'s kernels, with nothing allocated.
    pub fn new(api: Api) -> Self {
        Emulated {
            api,
            allocations: Mutex::default(),
            made: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            graph_launches: None,
        }
    }

    /// The backend on a new emulated device running `api`'s kernels.
    pub fn backend(api: Api) -> GpuBackend<Emulated> {
        GpuBackend::new(Emulated::new(api))
    }

    /// The backend on a new emulated device running `api`'s kernels, its runs of launches
    /// replayed as graphs (as CUDA's are on a GPU).
    pub fn replaying_backend(api: Api) -> GpuBackend<Replayed<Emulated>> {
        GpuBackend::new(Replayed::new(Emulated::new(api)))
    }

    /// This device with graphs of at most `launches` launches: a longer run's recording
    /// fails, as it may on a GPU short of memory.
    pub fn with_graphs_of_at_most(self, launches: usize) -> Self {
        Emulated {
            graph_launches: Some(launches),
            ..self
        }
    }

    /// How many allocations the device has made so far (host memory used in place is none).
    pub fn allocations_made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }

    /// How many copies from the host the device has taken so far.
    pub fn writes_made(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Checks that `bytes` from `at` lie in one allocation.
    fn check(&self, at: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        let allocations = self.allocations.lock().unwrap_or_else(|e| e.into_inner());
        let inside = allocations
            .range(..=at.0)
            .next_back()
            .is_some_and(|(&start, a)| at.0 + bytes as u64 <= start + a.len() as u64);
        if inside {
            return Ok(());
        }
        Err(BackendError::Device(format!(
            "{bytes} bytes at {:#x} are outside device memory",
            at.0
        )))
    }
}

impl Gpu for Emulated {
    fn api(&self) -> &'static str {
        self.api.name()
    }

    fn name(&self) -> String {
        format!("{} emulated on the CPU", self.api.name())
    }

    fn product(&self, ty: GgmlType, n_tokens: usize) -> Product {
        self.api.product(ty, n_tokens)
    }

    fn attention_tile(&self, head_dims: usize) -> Option<AttentionTile> {
        Some(self.api.attention_tile(head_dims))
    }

    fn total_memory(&self) -> Option<u64> {
        None
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
        self.made.fetch_add(1, Ordering::Relaxed);
        let memory = vec![0u128; bytes.div_ceil(16)].into_boxed_slice();
        let at = memory.as_ptr() as u64;
        let mut allocations = self.allocations.lock().unwrap_or_else(|e| e.into_inner());
        allocations.insert(at, Memory::Owned(memory));
        Ok(DevicePtr(at))
    }

    fn borrow(
        &self,
        region: &[u8],
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Result<Option<DevicePtr>, BackendError> {
        if self.api != Api::Metal {
            return Ok(None);
        }
        let at = region.as_ptr() as u64;
        let mut allocations = self.allocations.lock().unwrap_or_else(|e| e.into_inner());
        let memory = Memory::Borrowed {
            len: region.len(),
            _owner: owner,
        };
        allocations.insert(at, memory);
        Ok(Some(DevicePtr(at)))
    }

    fn free(&self, ptr: DevicePtr) {
        let mut allocations = self.allocations.lock().unwrap_or_else(|e| e.into_inner());
        allocations.remove(&ptr.0);
    }

    fn write(&self, dst: DevicePtr, bytes: &[u8]) -> Result<(), BackendError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.check(dst, bytes.len())?;
        // SAFETY: the destination lies in one live allocation (checked).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.0 as *mut u8, bytes.len()) };
        Ok(())
    }

    fn read(&self, src: DevicePtr, out: &mut [u8]) -> Result<(), BackendError> {
        self.check(src, out.len())?;
        // SAFETY: the source lies in one live allocation (checked).
        unsafe { std::ptr::copy_nonoverlapping(src.0 as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn copy(&self, src: DevicePtr, dst: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        self.check(src, bytes)?;
        self.check(dst, bytes)?;
        // SAFETY: both ranges lie in live allocations (checked); they may overlap.
        unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, bytes) };
        Ok(())
    }

    fn launch(
        &self,
        name: &str,
        grid: [u32; 3],
        block: [u32; 3],
        args: &Args,
    ) -> Result<(), BackendError> {
        // SAFETY: the backend passes pointers into the buffers it allocated here, sized for
        // the kernels' indexing (the conformance suite checks the results).
        unsafe { launch(self.api, name, grid, block, args) }.map_err(|e| BackendError::Device(e.0))
    }
}

/// A graph is its own copy of the launches, run one by one: a launch of a kept graph that a
/// step changed and [`Replayed`] did not update runs as recorded, as on a GPU.
impl Replay for Emulated {
    type Graph = Vec<Launch>;

    fn record(&self, launches: &[Launch]) -> Result<Vec<Launch>, BackendError> {
        match self.graph_launches {
            Some(most) if launches.len() > most => Err(BackendError::Device(format!(
                "out of memory for a graph of {} launches",
                launches.len()
            ))),
            _ => Ok(launches.to_vec()),
        }
    }

    fn update(
        &self,
        graph: &mut Vec<Launch>,
        index: usize,
        launch: &Launch,
    ) -> Result<(), BackendError> {
        let Some(recorded) = graph.get_mut(index) else {
            return Err(BackendError::InvalidArgument(format!(
                "a graph of {} launches has no launch {index}",
                graph.len()
            )));
        };
        if recorded.name != launch.name {
            return Err(BackendError::InvalidArgument(format!(
                "launch {index} of a graph runs {}, not {}",
                recorded.name, launch.name
            )));
        }
        *recorded = launch.clone();
        Ok(())
    }

    fn replay(&self, graph: &Vec<Launch>) -> Result<(), BackendError> {
        for launch in graph {
            self.launch(&launch.name, launch.grid, launch.block, &launch.args)?;
        }
        Ok(())
    }
}
