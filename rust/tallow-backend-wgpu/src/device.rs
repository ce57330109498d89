//! Finding GPUs and opening one.

use std::sync::OnceLock;

use tallow_backend::{BackendError, DeviceInfo};

use crate::gpu::Gpu;

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

/// Opens GPU `index` of [`devices`], with those of `wanted`'s optional features (subgroup
/// operations, f16 arithmetic) the adapter has.
pub(crate) fn open(index: usize, wanted: wgpu::Features) -> Result<Gpu, BackendError> {
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
        required_features: adapter.features() & wanted,
        // As large as the adapter allows: weights and KV pages are large buffers.
        required_limits: limits.clone(),
        ..Default::default()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&descriptor)).map_err(|e| {
        BackendError::Device(format!("cannot open {}: {e}", adapter.get_info().name))
    })?;
    Ok(Gpu::new(
        device,
        queue,
        describe(&adapter),
        limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size),
        adapter.get_info().device_type == wgpu::DeviceType::Cpu,
    ))
}
