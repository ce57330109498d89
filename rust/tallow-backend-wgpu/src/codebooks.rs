//! The codebooks of the IQ1, IQ2 and IQ3 formats on the device: one read-only buffer of them
//! all (ggml's `iq*_grid`, as [`tallow_quant::codebook_words`] gives them), bound as bind
//! group 1 of the kernels that decode those formats (kernels-wgsl/codebooks.wgsl).

use tallow_backend::BackendError;

/// The codebooks' buffer, and the bind group of it that the kernels take.
pub(crate) struct Codebooks {
    pub layout: wgpu::BindGroupLayout,
    pub group: wgpu::BindGroup,
}

impl Codebooks {
    pub(crate) fn new(device: &wgpu::Device) -> Result<Codebooks, BackendError> {
        let bytes: Vec<u8> = tallow_quant::codebook_words()
            .into_iter()
            .flat_map(|(_, words)| words)
            .flat_map(u32::to_le_bytes)
            .collect();
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("codebooks"),
            size: bytes.len() as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: true,
        });
        (buffer.get_mapped_range_mut(..))
            .map_err(|e| BackendError::Device(e.to_string()))?
            .copy_from_slice(&bytes);
        buffer.unmap();
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("codebooks"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: true },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            }],
        });
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("codebooks"),
            layout: &layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: buffer.as_entire_binding(),
            }],
        });
        Ok(Codebooks { layout, group })
    }
}

/// The WGSL that declares the codebooks' binding and the first word of each table in it
/// (`const IQ2XXS_GRID = 0u;` and so on), before codebooks.wgsl.
pub(crate) fn declarations() -> String {
    let mut wgsl =
        String::from("@group(1) @binding(0) var<storage, read> codebooks: array<u32>;\n");
    let mut at = 0;
    for (name, words) in tallow_quant::codebook_words() {
        wgsl.push_str(&format!("const {name} = {at}u;\n"));
        at += words.len();
    }
    wgsl
}
