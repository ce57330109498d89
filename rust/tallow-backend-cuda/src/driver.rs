//! NVIDIA GPUs through the CUDA driver (`libcuda.so.1`, which comes with the GPU's driver),
//! loaded at run time: where there is none, opening a device is an error that says so, never
//! a panic. The kernels are compiled by NVRTC for the device's exact architecture when a device
//! is first opened and kept on disk (`$TALLOW_HOME/cuda`, by default `~/.cache/tallow/cuda`),
//! named by a hash of their sources.

use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Mutex;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use tallow_backend::{BackendError, DeviceInfo};
use tallow_backend_gpu::{Args, AttentionTile, DevicePtr, Gpu, Product};
use tallow_quant::GgmlType;

use crate::nvrtc::Nvrtc;
use crate::sources::SOURCES;

/// The oldest architecture the kernels run on: Turing (sm_75).
const OLDEST: u32 = 75;

/// The oldest driver's CUDA version (as `cuDriverGetVersion` gives it: 1000 * major + 10 *
/// minor): 12.0, whose API the graphs use and whose cubins NVRTC 12 makes.
const OLDEST_DRIVER: i32 = 12_000;

/// The CUDA version of the driver (as `cuDriverGetVersion` gives it).
fn driver_version() -> Result<i32, DriverError> {
    let mut version = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut version) }.result()?;
    Ok(version)
}

pub(crate) fn device_error(e: DriverError) -> BackendError {
    BackendError::Device(format!("CUDA: {e}"))
}

/// Whether the driver's library can be loaded (cudarc panics on the first call without it).
fn driver_present() -> bool {
    // SAFETY: only tries to load the library.
    unsafe { sys::is_culib_present() }
}

/// The CUDA devices, as `tallow info --devices` lists them; none without a driver.
pub fn devices() -> Vec<DeviceInfo> {
    if !driver_present() || result::init().is_err() {
        return Vec::new();
    }
    let count = result::device::get_count().unwrap_or(0);
    (0..count)
        .filter_map(|i| {
            let device = result::device::get(i).ok()?;
            let (major, minor) = capability(device).ok()?;
            Some(DeviceInfo {
                name: format!(
                    "{} (compute {major}.{minor})",
                    result::device::get_name(device).ok()?
                ),
                backend: "cuda".into(),
                // SAFETY: a device the driver just gave.
                memory: unsafe { result::device::total_mem(device) }
                    .ok()
                    .map(|m| m as u64),
            })
        })
        .collect()
}

fn capability(device: sys::CUdevice) -> Result<(u32, u32), DriverError> {
    use sys::CUdevice_attribute::*;
    // SAFETY: a device the driver gave.
    unsafe {
        let major =
            result::device::get_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            result::device::get_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok((major as u32, minor as u32))
    }
}

/// An NVIDIA GPU with the kernels loaded.
pub struct Driver {
    device: sys::CUdevice,
    context: sys::CUcontext,
    name: String,
    memory: u64,
    modules: Vec<sys::CUmodule>,
    functions: Mutex<HashMap<String, usize>>,
}

// SAFETY: the context and modules are the driver's handles, usable from any thread once the
// context is made current there (every call below does).
unsafe impl Send for Driver {}
// SAFETY: as for Send; the function table is behind a lock.
unsafe impl Sync for Driver {}

impl Driver {
    /// Opens CUDA device `ordinal` and loads the kernels, compiling them first if this
    /// architecture has no cubins on disk yet.
    pub fn open(ordinal: usize) -> Result<Self, BackendError> {
        if !driver_present() {
            return Err(BackendError::Unsupported(
                "CUDA needs an NVIDIA GPU and its driver, and no driver (libcuda.so.1) was found"
                    .into(),
            ));
        }
        result::init().map_err(device_error)?;
        let version = driver_version().map_err(device_error)?;
        if version < OLDEST_DRIVER {
            return Err(BackendError::Unsupported(format!(
                "the NVIDIA driver supports CUDA {}.{}; tallow needs a driver for CUDA 12.0 or \
                 later",
                version / 1000,
                version % 1000 / 10
            )));
        }
        let count = result::device::get_count().map_err(device_error)? as usize;
        if ordinal >= count {
            return Err(BackendError::Unsupported(format!(
                "there is no CUDA device {ordinal}: the driver sees {count}"
            )));
        }
        let device = result::device::get(ordinal as i32).map_err(device_error)?;
        let (major, minor) = capability(device).map_err(device_error)?;
        let arch = 10 * major + minor;
        let name = result::device::get_name(device).map_err(device_error)?;
        if arch < OLDEST {
            return Err(BackendError::Unsupported(format!(
                "{name} has compute capability {major}.{minor}; tallow's CUDA kernels need 7.5 \
                 (Turing) or later"
            )));
        }
        // SAFETY: a device the driver gave; the primary context is released in Drop.
        let (memory, context) = unsafe {
            let memory = result::device::total_mem(device).map_err(device_error)? as u64;
            let context = result::primary_ctx::retain(device).map_err(device_error)?;
            (memory, context)
        };
        let mut driver = Driver {
            device,
            context,
            name: format!("{name} (compute {major}.{minor})"),
            memory,
            modules: Vec::new(),
            functions: Mutex::default(),
        };
        driver.current()?;
        let nvrtc = Nvrtc::load()?;
        let headers = headers();
        for (source, text) in kernel_sources() {
            let cubin = cached_cubin(source, arch, || nvrtc.cubin(source, text, &headers, arch))?;
            // SAFETY: a cubin NVRTC made for this device's architecture, in a current context.
            let module = unsafe { result::module::load_data(cubin.as_ptr().cast()) }
                .map_err(device_error)?;
            driver.modules.push(module);
        }
        Ok(driver)
    }

    /// Makes the device's context the calling thread's.
    pub(crate) fn current(&self) -> Result<(), BackendError> {
        // SAFETY: the primary context retained in `open`.
        unsafe { result::ctx::set_current(self.context) }.map_err(device_error)
    }

    /// The kernel `name`, from whichever module holds it.
    pub(crate) fn function(&self, name: &str) -> Result<sys::CUfunction, BackendError> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&f) = functions.get(name) {
            return Ok(f as sys::CUfunction);
        }
        let c_name = CString::new(name).map_err(|_| BackendError::InvalidArgument(name.into()))?;
        for &module in &self.modules {
            // SAFETY: a module loaded in `open`, not unloaded before Drop.
            if let Ok(f) = unsafe { result::module::get_function(module, c_name.clone()) } {
                functions.insert(name.into(), f as usize);
                return Ok(f);
            }
        }
        Err(BackendError::Device(format!("no CUDA kernel named {name}")))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.current().is_ok() {
            for &module in &self.modules {
                // SAFETY: loaded in `open`, unloaded once.
                let _ = unsafe { result::module::unload(module) };
            }
        }
        // SAFETY: retained in `open`, released once.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

impl Gpu for Driver {
    fn api(&self) -> &'static str {
        "cuda"
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn product(&self, ty: GgmlType, n_tokens: usize) -> Product {
        crate::product(ty, n_tokens)
    }

    fn attention_tile(&self, head_dims: usize) -> Option<AttentionTile> {
        Some(crate::attention_tile(head_dims))
    }

    fn total_memory(&self) -> Option<u64> {
        Some(self.memory)
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
        self.current()?;
        // SAFETY: a fresh allocation, zeroed before it is handed out.
        unsafe {
            let ptr = result::malloc_sync(bytes).map_err(|e| {
                BackendError::Device(format!(
                    "CUDA: cannot allocate {bytes} bytes on {}: {e}",
                    self.name
                ))
            })?;
            result::memset_d8_sync(ptr, 0, bytes).map_err(device_error)?;
            Ok(DevicePtr(ptr))
        }
    }

    fn free(&self, ptr: DevicePtr) {
        if self.current().is_ok() {
            // SAFETY: memory from `alloc`, freed once (by its buffer's Drop).
            let _ = unsafe { result::free_sync(ptr.0) };
        }
    }

    fn write(&self, dst: DevicePtr, bytes: &[u8]) -> Result<(), BackendError> {
        self.current()?;
        // SAFETY: the backend writes within its own buffers.
        unsafe { result::memcpy_htod_sync(dst.0, bytes) }.map_err(device_error)
    }

    fn read(&self, src: DevicePtr, out: &mut [u8]) -> Result<(), BackendError> {
        self.current()?;
        // SAFETY: the backend reads within its own buffers; the copy waits for the launches
        // before it on the default stream.
        unsafe { result::memcpy_dtoh_sync(out, src.0) }.map_err(device_error)
    }

    fn copy(&self, src: DevicePtr, dst: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        self.current()?;
        // SAFETY: within the backend's own buffers.
        unsafe { result::memcpy_dtod_sync(dst.0, src.0, bytes) }.map_err(device_error)
    }

    fn launch(
        &self,
        name: &str,
        grid: [u32; 3],
        block: [u32; 3],
        args: &Args,
    ) -> Result<(), BackendError> {
        self.current()?;
        let function = self.function(name)?;
        // SAFETY: the arguments are the kernel's, in order, each value alive for the call
        // (the driver copies them at launch).
        args.with_params(|params| unsafe {
            result::launch_kernel(
                function,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                0,
                std::ptr::null_mut(),
                params,
            )
        })
        .map_err(device_error)
    }
}

/// The kernel sources (not the headers) of [`SOURCES`].
fn kernel_sources() -> impl Iterator<Item = (&'static str, &'static str)> {
    SOURCES
        .into_iter()
        .filter(|(name, _)| name.ends_with(".cu"))
}

/// The headers the kernel sources include (`.cuh`, and the `.h` shared with Metal's kernels).
fn headers() -> Vec<(&'static str, &'static str)> {
    SOURCES
        .into_iter()
        .filter(|(name, _)| !name.ends_with(".cu"))
        .collect()
}

/// Every kernel source compiled by NVRTC for `sm_{arch}` (no GPU or driver needed): (source,
/// cubin).
pub fn cubins(arch: u32) -> Result<Vec<(&'static str, Vec<u8>)>, BackendError> {
    let nvrtc = Nvrtc::load()?;
    kernel_sources()
        .map(|(source, text)| Ok((source, nvrtc.cubin(source, text, &headers(), arch)?)))
        .collect()
}

/// The cubin of `source` for `sm_{arch}` from the disk cache, or `compile`d and kept there.
fn cached_cubin(
    source: &str,
    arch: u32,
    compile: impl FnOnce() -> Result<Vec<u8>, BackendError>,
) -> Result<Vec<u8>, BackendError> {
    let path = cache_dir()
        .map(|dir| dir.join(format!("{:016x}-sm_{arch}-{source}.cubin", sources_hash())));
    if let Some(cubin) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(cubin);
    }
    let cubin = compile()?;
    if let Some(path) = path {
        // A cache that cannot be written only costs a compilation next time.
        let written = path.parent().map(std::fs::create_dir_all);
        if matches!(written, Some(Ok(()))) {
            let partial = path.with_extension("partial");
            if std::fs::write(&partial, &cubin).is_ok() {
                let _ = std::fs::rename(&partial, &path);
            }
        }
    }
    Ok(cubin)
}

fn cache_dir() -> Option<PathBuf> {
    let home = std::env::var_os("TALLOW_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tallow")))?;
    Some(home.join("cuda"))
}

/// FNV-1a over every source: cubins of other sources are never taken for these.
fn sources_hash() -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for (name, text) in SOURCES {
        for byte in name.bytes().chain([0]).chain(text.bytes()).chain([0]) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// What ptxas reports of one kernel compiled for one architecture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelUsage {
    pub source: &'static str,
    pub kernel: String,
    pub registers: u32,
    /// Bytes of registers spilled to local memory, stored and loaded.
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Bytes of each thread's stack frame.
    pub stack: u32,
    /// Bytes of static shared memory per block.
    pub shared: u32,
}

/// ptxas's report of every kernel compiled for `sm_{arch}` (registers, spills, stack, shared
/// memory), source by source.
pub fn kernel_usage(arch: u32) -> Result<Vec<KernelUsage>, BackendError> {
    let nvrtc = Nvrtc::load()?;
    let mut usage = Vec::new();
    for (source, text) in kernel_sources() {
        let (_, log) = nvrtc.compile(source, text, &headers(), arch, true)?;
        usage.extend(parse_report(source, &log));
    }
    Ok(usage)
}

/// The kernels of ptxas's verbose log: an entry's "Compiling entry function 'NAME'" line, its
/// "N bytes stack frame, N bytes spill stores, N bytes spill loads" and its "Used N
/// registers, ..., N bytes smem, ..." lines.
fn parse_report(source: &'static str, log: &str) -> Vec<KernelUsage> {
    // The number before `unit` in `line` ("48 registers" -> 48).
    let number_before = |line: &str, unit: &str| -> u32 {
        line.find(unit)
            .and_then(|end| line[..end].trim_end().rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    let mut kernels: Vec<KernelUsage> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let kernel = rest.split('\'').next().unwrap_or_default().to_string();
            kernels.push(KernelUsage {
                source,
                kernel,
                ..Default::default()
            });
        } else if let Some(k) = kernels.last_mut() {
            if line.contains("bytes stack frame") {
                k.stack = number_before(line, "bytes stack frame");
                k.spill_stores = number_before(line, "bytes spill stores");
                k.spill_loads = number_before(line, "bytes spill loads");
            } else if line.contains("Used ") && line.contains("registers") {
                k.registers = number_before(line, "registers");
                k.shared = number_before(line, "bytes smem");
            }
        }
    }
    kernels
}
