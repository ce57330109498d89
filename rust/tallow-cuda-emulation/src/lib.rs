//! The CUDA backend's kernels (`kernels-cuda/`) run on the CPU, for tests without a GPU.
//!
//! Each kernel's source is compiled as C++ after `kernels-cuda/emulation/cuda_emulation.h`,
//! which runs a launch's blocks one after the other and each block's threads as fibers that
//! switch where the kernel synchronizes: `__syncthreads` waits for every live thread of the
//! block, warp shuffles and votes exchange values between the 32 threads of a warp (a warp
//! that diverges there is an error), `__shared__` memory is the block's. Device memory is
//! host memory: a device pointer is an address in this process.

use std::ffi::{c_char, c_void, CStr, CString};

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

    /// A pointer to device memory (here, host memory).
    pub fn ptr<T>(&mut self, p: *const T) -> &mut Self {
        self.push(&(p as usize).to_ne_bytes())
    }

    /// An `int`.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }

    /// An `unsigned int`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }

    /// A `float`.
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }
}

/// Why a launch did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LaunchError(pub String);

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
    let mut values = args.values.clone();
    let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
    // SAFETY: every pointer passed lives until the call returns; the emulator checks the
    // arguments' count and sizes against the kernel's parameters; the caller vouches for the
    // memory the kernel reaches through them.
    let error = unsafe {
        tallow_emu_launch(
            name.as_ptr(),
            grid.as_ptr(),
            block.as_ptr(),
            params.as_mut_ptr(),
            args.sizes.as_ptr(),
            args.sizes.len() as u32,
        )
    };
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
