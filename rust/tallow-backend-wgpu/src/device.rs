//! Finding GPUs and opening one.

use std::sync::OnceLock;

use tallow_backend::{BackendError, DeviceInfo};

use crate::gpu::Wgpu;
use crate::WgpuBackend;

/// The process's one wgpu instance: every device listing and every model's device come from
/// it. With an instance per model, NVIDIA's Vulkan driver found no adapter any more after
/// about thirty models in one process; with one, models come and go without limit.
fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12,
            ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
        })
    })
}

/// The adapters that can run compute shaders, real GPUs first, then software ones (Mesa's
/// llvmpipe), each kind in the driver's order.
fn adapters() -> Vec<wgpu::Adapter> {
    let mut adapters: Vec<wgpu::Adapter> =
        pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()))
            .into_iter()
            .filter(|a| {
                a.get_downlevel_capabilities()
                    .flags
                    .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
            })
            .collect();
    adapters.sort_by_key(|a| a.get_info().device_type == wgpu::DeviceType::Cpu);
    adapters
}

fn describe(adapter: &wgpu::Adapter) -> DeviceInfo {
    let info = adapter.get_info();
    let kind = match info.device_type {
        wgpu::DeviceType::Cpu => ", software",
        _ => "",
    };
    DeviceInfo {
        name: info.name.clone(),
        backend: format!("wgpu ({:?}{kind})", info.backend),
        memory: None,
    }
}

/// Every GPU wgpu finds, in the order `wgpu:N` numbers them.
pub fn devices() -> Vec<DeviceInfo> {
    adapters().iter().map(describe).collect()
}

/// How [`open_with`] opens a GPU. The default takes what the adapter offers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WgpuOptions {
    /// The most bytes of a part of a weight matrix (larger ones are cut by rows) and of a
    /// block of logits; the adapter's buffer limit where that is less.
    pub max_part: Option<usize>,
    /// Kernels laid out for a software adapter (true: whole rows an invocation) or for a GPU
    /// (false); `None` picks by the adapter.
    pub software: Option<bool>,
}

/// Opens GPU `index` of [`devices`] as the backend's device.
pub fn open(index: usize) -> Result<WgpuBackend, BackendError> {
    open_with(index, WgpuOptions::default())
}

/// Opens GPU `index` of [`devices`] as `options` say.
pub fn open_with(index: usize, options: WgpuOptions) -> Result<WgpuBackend, BackendError> {
    let adapters = adapters();
    let n = adapters.len();
    let adapter = adapters.into_iter().nth(index).ok_or_else(|| {
        BackendError::Device(match n {
            0 => "no GPU found (wgpu sees no Vulkan, Metal or DX12 adapter)".to_string(),
            n => format!(
                "there is no GPU wgpu:{index} ({n} found: wgpu:0 to wgpu:{})",
                n - 1
            ),
        })
    })?;
    let limits = adapter.limits();
    let descriptor = wgpu::DeviceDescriptor {
        label: Some("tallow"),
        // As large as the adapter allows: weights and KV pages are large buffers, and a kernel
        // may take a dozen of them.
        required_limits: limits.clone(),
        ..Default::default()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&descriptor)).map_err(|e| {
        BackendError::Device(format!("cannot open {}: {e}", adapter.get_info().name))
    })?;
    let info = describe(&adapter);
    let name = format!("{} ({})", info.name, info.backend);
    let software =
        (options.software).unwrap_or(adapter.get_info().device_type == wgpu::DeviceType::Cpu);
    let gpu = Wgpu::new(device, queue, name, &limits, software, options.max_part);
    Ok(WgpuBackend::new(gpu))
}
