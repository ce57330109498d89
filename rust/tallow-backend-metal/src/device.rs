//! Apple GPUs through Metal (macOS): the device tallow-backend-gpu's host code runs its steps
//! on.
//!
//! - Memory is unified: every buffer is `StorageModeShared`, so the host writes and reads it
//!   in place, after the work queued before has finished; the weights are read where the model
//!   file is mapped (`newBufferWithBytesNoCopy` over the mapping), never copied. A device address is the buffer's
//!   `gpuAddress` (Metal 3) plus an offset; a launch binds each address as its buffer and the
//!   offset in it, and each plain value with `setBytes`.
//! - Allocations past the device's `recommendedMaxWorkingSetSize`, and model files larger than
//!   it, are refused before they are used: running past it slows every kernel to a crawl or
//!   fails the command buffer.
//! - The kernels (`kernels-metal/`, one library) are compiled from source when the device is
//!   opened, with fast math off (the CPU backend's float semantics); Metal keeps its own cache
//!   of compiled libraries, so a later process compiles from that cache.
//! - Launches, fills and copies are encoded into one command buffer, committed when the host
//!   next needs the results (a read, a write, a free).

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use objc2::rc::Retained;
use objc2::runtime::ProtocolObject;
use objc2_foundation::NSString;
use objc2_metal::{
    MTLBlitCommandEncoder, MTLBuffer, MTLCommandBuffer, MTLCommandBufferStatus, MTLCommandEncoder,
    MTLCommandQueue, MTLCompileOptions, MTLComputeCommandEncoder, MTLComputePipelineState,
    MTLCreateSystemDefaultDevice, MTLDevice, MTLLanguageVersion, MTLLibrary, MTLResourceOptions,
    MTLSize,
};
use tallow_backend::{BackendError, DeviceInfo};
use tallow_backend_gpu::{Arg, Args, AttentionTile, DevicePtr, Gpu, Product};
use tallow_quant::GgmlType;

use crate::sources::library_source;

type Device = ProtocolObject<dyn MTLDevice>;
type Buffer = ProtocolObject<dyn MTLBuffer>;
type CommandBuffer = ProtocolObject<dyn MTLCommandBuffer>;
type ComputeEncoder = ProtocolObject<dyn MTLComputeCommandEncoder>;
type Pipeline = ProtocolObject<dyn MTLComputePipelineState>;

fn device_error(what: impl std::fmt::Display) -> BackendError {
    BackendError::Device(format!("Metal: {what}"))
}

/// The Metal devices, as `tallow info --devices` lists them (the system's default GPU), with
/// the memory it should keep its working set within.
pub fn devices() -> Vec<DeviceInfo> {
    let Some(device) = MTLCreateSystemDefaultDevice() else {
        return Vec::new();
    };
    vec![DeviceInfo {
        name: device.name().to_string(),
        backend: "metal".into(),
        memory: Some(device.recommendedMaxWorkingSetSize()),
    }]
}

/// Work encoded and not yet committed.
struct Pending {
    commands: Retained<CommandBuffer>,
    /// The compute encoder launches go to, until a fill or copy ends it.
    compute: Option<Retained<ComputeEncoder>>,
}

/// The pages of Apple silicon's memory (16 KiB): a buffer over host memory spans whole ones.
const PAGE: usize = 16 << 10;

/// The device's buffers and queued work.
struct State {
    /// Each buffer by its device address.
    buffers: BTreeMap<u64, Retained<Buffer>>,
    /// What keeps the host memory of each borrowed buffer alive, by its device address.
    owners: HashMap<u64, Arc<dyn Any + Send + Sync>>,
    pending: Option<Pending>,
    pipelines: HashMap<String, Retained<Pipeline>>,
}

/// An Apple GPU.
pub struct Metal {
    device: Retained<Device>,
    queue: Retained<ProtocolObject<dyn MTLCommandQueue>>,
    library: Retained<ProtocolObject<dyn MTLLibrary>>,
    name: String,
    working_set: u64,
    unified: bool,
    state: Mutex<State>,
}

// SAFETY: Metal's devices, queues, libraries, buffers and pipeline states may be used from any
// thread; the command buffer and encoder being recorded are only touched under `state`'s lock.
unsafe impl Send for Metal {}
// SAFETY: as for Send.
unsafe impl Sync for Metal {}

impl Metal {
    /// The system's default GPU, its kernels compiled.
    pub fn open() -> Result<Self, BackendError> {
        let device = MTLCreateSystemDefaultDevice()
            .ok_or_else(|| device_error("this Mac has no Metal GPU"))?;
        if !device.supportsFamily(objc2_metal::MTLGPUFamily::Metal3) {
            return Err(BackendError::Unsupported(format!(
                "{} on metal: the kernels need a Metal 3 GPU (Apple M1 or later, or AMD \
                 RDNA on macOS 13)",
                device.name()
            )));
        }
        let queue = device
            .newCommandQueue()
            .ok_or_else(|| device_error("no command queue"))?;
        let options = MTLCompileOptions::new();
        options.setLanguageVersion(MTLLanguageVersion::Version3_0);
        #[allow(deprecated)]
        options.setFastMathEnabled(false);
        let library = device
            .newLibraryWithSource_options_error(
                &NSString::from_str(&library_source()),
                Some(&options),
            )
            .map_err(|e| device_error(format!("the kernels do not compile: {e}")))?;
        Ok(Metal {
            name: format!("{} (Metal)", device.name()),
            working_set: device.recommendedMaxWorkingSetSize(),
            unified: device.hasUnifiedMemory(),
            device,
            queue,
            library,
            state: Mutex::new(State {
                buffers: BTreeMap::new(),
                owners: HashMap::new(),
                pending: None,
                pipelines: HashMap::new(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits the queued work and waits for it.
    fn finish(&self, state: &mut State) -> Result<(), BackendError> {
        let Some(pending) = state.pending.take() else {
            return Ok(());
        };
        if let Some(compute) = pending.compute {
            compute.endEncoding();
        }
        pending.commands.commit();
        pending.commands.waitUntilCompleted();
        if pending.commands.status() == MTLCommandBufferStatus::Error {
            let error = pending.commands.error();
            let message = error.map_or("unknown".to_string(), |e| e.to_string());
            return Err(device_error(format!("a step failed on the GPU: {message}")));
        }
        Ok(())
    }

    /// The command buffer work is being recorded into.
    fn pending<'a>(&self, state: &'a mut State) -> Result<&'a mut Pending, BackendError> {
        if state.pending.is_none() {
            let commands =
                (self.queue.commandBuffer()).ok_or_else(|| device_error("no command buffer"))?;
            state.pending = Some(Pending {
                commands,
                compute: None,
            });
        }
        Ok(state.pending.as_mut().expect("made above"))
    }

    /// The buffer holding `ptr`, and the offset of `ptr` in it.
    fn find(
        state: &State,
        ptr: DevicePtr,
        bytes: usize,
    ) -> Result<(Retained<Buffer>, usize), BackendError> {
        let (&start, buffer) = (state.buffers.range(..=ptr.0).next_back())
            .ok_or_else(|| device_error(format!("{:#x} is not in a buffer", ptr.0)))?;
        let offset = (ptr.0 - start) as usize;
        if offset + bytes > buffer.length() {
            return Err(device_error(format!(
                "{bytes} bytes at {:#x} run past their buffer",
                ptr.0
            )));
        }
        Ok((buffer.clone(), offset))
    }

    /// Runs `encode` on a blit encoder of the pending work, in order with the launches.
    fn blit(
        &self,
        encode: impl FnOnce(&ProtocolObject<dyn MTLBlitCommandEncoder>),
    ) -> Result<(), BackendError> {
        let mut state = self.state();
        let pending = self.pending(&mut state)?;
        if let Some(compute) = pending.compute.take() {
            compute.endEncoding();
        }
        let blit = (pending.commands.blitCommandEncoder())
            .ok_or_else(|| device_error("no blit encoder"))?;
        encode(&blit);
        blit.endEncoding();
        Ok(())
    }

    fn pipeline(&self, state: &mut State, name: &str) -> Result<Retained<Pipeline>, BackendError> {
        if let Some(p) = state.pipelines.get(name) {
            return Ok(p.clone());
        }
        let function = (self.library.newFunctionWithName(&NSString::from_str(name)))
            .ok_or_else(|| device_error(format!("no kernel named {name}")))?;
        let pipeline = (self
            .device
            .newComputePipelineStateWithFunction_error(&function))
        .map_err(|e| device_error(format!("kernel {name}: {e}")))?;
        state.pipelines.insert(name.to_string(), pipeline.clone());
        Ok(pipeline)
    }
}

impl Gpu for Metal {
    fn api(&self) -> &'static str {
        "metal"
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn total_memory(&self) -> Option<u64> {
        Some(self.working_set)
    }

    fn product(&self, ty: GgmlType, n_tokens: usize) -> Product {
        crate::product(ty, n_tokens)
    }

    fn attention_tile(&self, head_dims: usize) -> Option<AttentionTile> {
        Some(crate::attention_tile(head_dims))
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
        let in_use = self.device.currentAllocatedSize() as u64;
        if in_use + bytes as u64 > self.working_set {
            return Err(device_error(format!(
                "{bytes} bytes on {} beside the {in_use} in use would pass the {} it can keep \
                 resident (its recommendedMaxWorkingSetSize)",
                self.name, self.working_set
            )));
        }
        let buffer = (self.device)
            .newBufferWithLength_options(bytes.max(1), MTLResourceOptions::StorageModeShared)
            .ok_or_else(|| {
                device_error(format!("cannot allocate {bytes} bytes on {}", self.name))
            })?;
        // Metal clears new buffers.
        let at = buffer.gpuAddress();
        self.state().buffers.insert(at, buffer);
        Ok(DevicePtr(at))
    }

    fn borrow(
        &self,
        region: &[u8],
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Result<Option<DevicePtr>, BackendError> {
        if !self.unified || !(region.as_ptr() as usize).is_multiple_of(PAGE) {
            return Ok(None);
        }
        // The mapping covers whole pages, the last one past the region's end included.
        let length = region.len().div_ceil(PAGE) * PAGE;
        if length as u64 > self.working_set {
            return Err(device_error(format!(
                "the model's {length} bytes pass the {} that {} can keep resident (its \
                 recommendedMaxWorkingSetSize)",
                self.working_set, self.name
            )));
        }
        let start = NonNull::new(region.as_ptr().cast_mut().cast()).expect("not null");
        // SAFETY: page-aligned host memory of `length` bytes (the mapping's pages), kept alive
        // by `owner` until the buffer is freed; the kernels only read weights.
        let buffer = unsafe {
            self.device
                .newBufferWithBytesNoCopy_length_options_deallocator(
                    start,
                    length,
                    MTLResourceOptions::StorageModeShared,
                    None,
                )
        };
        let Some(buffer) = buffer else {
            return Ok(None);
        };
        let at = buffer.gpuAddress();
        let mut state = self.state();
        state.buffers.insert(at, buffer);
        state.owners.insert(at, owner);
        Ok(Some(DevicePtr(at)))
    }

    fn free(&self, ptr: DevicePtr) {
        let mut state = self.state();
        // The queued work may use it.
        let _ = self.finish(&mut state);
        state.buffers.remove(&ptr.0);
        state.owners.remove(&ptr.0);
    }

    fn write(&self, dst: DevicePtr, bytes: &[u8]) -> Result<(), BackendError> {
        let mut state = self.state();
        let (buffer, offset) = Self::find(&state, dst, bytes.len())?;
        self.finish(&mut state)?;
        // SAFETY: the range lies in the buffer (checked) and no work is queued that uses it.
        unsafe {
            let at = buffer.contents().as_ptr().cast::<u8>().add(offset);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len());
        }
        Ok(())
    }

    fn read(&self, src: DevicePtr, out: &mut [u8]) -> Result<(), BackendError> {
        let mut state = self.state();
        let (buffer, offset) = Self::find(&state, src, out.len())?;
        self.finish(&mut state)?;
        // SAFETY: the range lies in the buffer (checked) and the work writing it has finished.
        unsafe {
            let at = buffer.contents().as_ptr().cast::<u8>().add(offset);
            std::ptr::copy_nonoverlapping(at, out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    fn copy(&self, src: DevicePtr, dst: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        let (from, from_offset, to, to_offset) = {
            let state = self.state();
            let (from, from_offset) = Self::find(&state, src, bytes)?;
            let (to, to_offset) = Self::find(&state, dst, bytes)?;
            (from, from_offset, to, to_offset)
        };
        // SAFETY: both ranges lie in their buffers (checked).
        self.blit(|blit| unsafe {
            blit.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size(
                &from,
                from_offset,
                &to,
                to_offset,
                bytes,
            )
        })
    }

    fn launch(
        &self,
        name: &str,
        grid: [u32; 3],
        block: [u32; 3],
        args: &Args,
    ) -> Result<(), BackendError> {
        let mut state = self.state();
        let pipeline = self.pipeline(&mut state, name)?;
        let mut bound = Vec::new();
        for arg in args.each() {
            bound.push(match arg {
                Arg::Pointer(p) => Some(Self::find(&state, p, 0)?),
                Arg::Value(_) => None,
            });
        }
        let pending = self.pending(&mut state)?;
        if pending.compute.is_none() {
            let encoder = (pending.commands.computeCommandEncoder())
                .ok_or_else(|| device_error("no compute encoder"))?;
            pending.compute = Some(encoder);
        }
        let encoder = pending.compute.as_ref().expect("made above");
        encoder.setComputePipelineState(&pipeline);
        for (index, (arg, buffer)) in args.each().zip(&bound).enumerate() {
            match (arg, buffer) {
                // SAFETY: the offset lies in the buffer (checked), which the state keeps alive
                // until the work is finished (free waits for it).
                (_, Some((buffer, offset))) => unsafe {
                    encoder.setBuffer_offset_atIndex(Some(buffer), *offset, index)
                },
                // SAFETY: Metal copies the bytes when encoding.
                (Arg::Value(bytes), None) => unsafe {
                    let at = NonNull::new(bytes.as_ptr().cast_mut().cast()).expect("not null");
                    encoder.setBytes_length_atIndex(at, bytes.len(), index)
                },
                (Arg::Pointer(_), None) => unreachable!("every pointer is bound above"),
            }
        }
        let size = |s: [u32; 3]| MTLSize {
            width: s[0] as usize,
            height: s[1] as usize,
            depth: s[2] as usize,
        };
        encoder.dispatchThreadgroups_threadsPerThreadgroup(size(grid), size(block));
        Ok(())
    }
}
