//! The CUDA backend's kernels (`kernels-cuda/`) run on the CPU, for tests without a GPU.
//!
//! Each kernel's source is compiled as C++ after `kernels-cuda/emulation/cuda_emulation.h`,
//! which runs a launch's blocks one after the other and each block's threads as fibers that
//! switch where the kernel synchronizes: `__syncthreads` waits for every live thread of the
//! block, warp shuffles and votes exchange values between the 32 threads of a warp (a warp
//! that diverges there is an error), `__shared__` memory is the block's. Device memory is
//! host memory: [`Emulated`] is the [`Gpu`] the CUDA backend runs on here.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tallow_backend::BackendError;
use tallow_backend_cuda::{Args, CudaBackend, DevicePtr, Gpu};

extern "C" {
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

/// Runs kernel `name` over `grid` blocks of `block` threads with `args`, which must match its
/// parameters in number and size.
///
/// # Safety
/// The pointers among `args` must be valid for every access the kernel makes through them.
pub unsafe fn launch(
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &Args,
) -> Result<(), LaunchError> {
    let name = CString::new(name).map_err(|_| LaunchError("a kernel's name has no NUL".into()))?;
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

/// A GPU emulated on the CPU: its memory is host memory, its kernels the emulation's.
/// Copies are checked against the allocations they touch.
#[derive(Debug, Default)]
pub struct Emulated {
    /// Each allocation by its address (16-byte aligned, as device memory is more than).
    allocations: Mutex<BTreeMap<u64, Box<[u128]>>>,
    /// Allocations made so far.
    made: AtomicU64,
}

impl Emulated {
    /// A new emulated device with nothing allocated.
    pub fn new() -> Self {
        Self::default()
    }

    /// The CUDA backend on a new emulated device.
    pub fn backend() -> CudaBackend<Emulated> {
        CudaBackend::new(Emulated::new())
    }

    /// How many allocations the device has made so far.
    pub fn allocations_made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }

    /// Checks that `bytes` from `at` lie in one allocation.
    fn check(&self, at: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        let allocations = self.allocations.lock().unwrap_or_else(|e| e.into_inner());
        let inside = allocations
            .range(..=at.0)
            .next_back()
            .is_some_and(|(&start, a)| at.0 + bytes as u64 <= start + (a.len() * 16) as u64);
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
    fn name(&self) -> String {
        "CUDA emulated on the CPU".into()
    }

    fn total_memory(&self) -> Option<u64> {
        None
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
        self.made.fetch_add(1, Ordering::Relaxed);
        let memory = vec![0u128; bytes.div_ceil(16)].into_boxed_slice();
        let at = memory.as_ptr() as u64;
        let mut allocations = self.allocations.lock().unwrap_or_else(|e| e.into_inner());
        allocations.insert(at, memory);
        Ok(DevicePtr(at))
    }

    fn free(&self, ptr: DevicePtr) {
        let mut allocations = self.allocations.lock().unwrap_or_else(|e| e.into_inner());
        allocations.remove(&ptr.0);
    }

    fn zero(&self, dst: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        self.check(dst, bytes)?;
        // SAFETY: the destination lies in one live allocation (checked).
        unsafe { std::ptr::write_bytes(dst.0 as *mut u8, 0, bytes) };
        Ok(())
    }

    fn write(&self, dst: DevicePtr, bytes: &[u8]) -> Result<(), BackendError> {
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
        unsafe { launch(name, grid, block, args) }.map_err(|e| BackendError::Device(e.0))
    }
}
