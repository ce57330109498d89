//! The WGSL kernels (the repository's `kernels-wgsl/`): each kernel name the backend launches
//! is one module, the shared prelude (tallow.wgsl) and the kernel's file, after the weight or
//! KV page format it reads where it has one; compiled into a pipeline on first use, for each
//! block size it is launched with.

use tallow_backend_gpu::WEIGHT_FORMATS;
use tallow_quant::GgmlType;

use crate::codebooks;

macro_rules! wgsl {
    ($path:literal) => {
        include_str!(concat!("../../../kernels-wgsl/", $path))
    };
}

const PRELUDE: &str = wgsl!("tallow.wgsl");
const BYTES: &str = wgsl!("bytes.wgsl");
const PRODUCTS: &str = wgsl!("products.wgsl");
const TILES: &str = wgsl!("products_tiles.wgsl");
const CODEBOOKS: &str = wgsl!("codebooks.wgsl");

/// The kernels that read no format, by name.
const PLAIN: [(&str, &str); 16] = [
    ("rms_norm", wgsl!("rms_norm.wgsl")),
    ("add", wgsl!("add.wgsl")),
    ("add_bias", wgsl!("add_bias.wgsl")),
    ("gated", wgsl!("gated.wgsl")),
    ("rope", wgsl!("rope.wgsl")),
    ("gather_rows", wgsl!("gather_rows.wgsl")),
    ("softcap", wgsl!("softcap.wgsl")),
    ("scale_by_sigmoid", wgsl!("scale_by_sigmoid.wgsl")),
    ("route_tokens", wgsl!("route_tokens.wgsl")),
    ("group_pairs", wgsl!("group_pairs.wgsl")),
    ("add_expert_biases", wgsl!("add_expert_biases.wgsl")),
    ("combine_experts", wgsl!("combine_experts.wgsl")),
    ("draw_rows", wgsl!("draw_rows.wgsl")),
    ("attention_merge", wgsl!("attention_merge.wgsl")),
    ("place_columns", wgsl!("place_columns.wgsl")),
    // The device's copies that a buffer copy cannot make (see gpu.rs).
    ("copy_bytes", wgsl!("copy_bytes.wgsl")),
];

/// The kernels of each weight format, by the start of their names (before the format's).
const BY_FORMAT: [(&str, &[&str]); 5] = [
    (
        "matmul_tiles_experts_",
        &[TILES, wgsl!("matmul_tiles_experts.wgsl")],
    ),
    ("matmul_tiles_", &[TILES, wgsl!("matmul_tiles.wgsl")]),
    ("matmul_experts_", &[PRODUCTS, wgsl!("matmul_experts.wgsl")]),
    ("matmul_", &[PRODUCTS, wgsl!("matmul.wgsl")]),
    ("embed_", &[wgsl!("embed.wgsl")]),
];

/// Each weight format's `dequant32`.
fn format(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => wgsl!("formats/f32.wgsl"),
        GgmlType::F16 => wgsl!("formats/f16.wgsl"),
        GgmlType::BF16 => wgsl!("formats/bf16.wgsl"),
        GgmlType::Q4_0 => wgsl!("formats/q4_0.wgsl"),
        GgmlType::Q4_1 => wgsl!("formats/q4_1.wgsl"),
        GgmlType::Q5_0 => wgsl!("formats/q5_0.wgsl"),
        GgmlType::Q5_1 => wgsl!("formats/q5_1.wgsl"),
        GgmlType::Q8_0 => wgsl!("formats/q8_0.wgsl"),
        GgmlType::Q2_K => wgsl!("formats/q2_k.wgsl"),
        GgmlType::Q3_K => wgsl!("formats/q3_k.wgsl"),
        GgmlType::Q4_K => wgsl!("formats/q4_k.wgsl"),
        GgmlType::Q5_K => wgsl!("formats/q5_k.wgsl"),
        GgmlType::Q6_K => wgsl!("formats/q6_k.wgsl"),
        GgmlType::IQ4_NL => wgsl!("formats/iq4_nl.wgsl"),
        GgmlType::IQ4_XS => wgsl!("formats/iq4_xs.wgsl"),
        GgmlType::MXFP4 => wgsl!("formats/mxfp4.wgsl"),
        GgmlType::IQ2_XXS => wgsl!("formats/iq2_xxs.wgsl"),
        GgmlType::IQ2_XS => wgsl!("formats/iq2_xs.wgsl"),
        GgmlType::IQ2_S => wgsl!("formats/iq2_s.wgsl"),
        GgmlType::IQ3_XXS => wgsl!("formats/iq3_xxs.wgsl"),
        GgmlType::IQ3_S => wgsl!("formats/iq3_s.wgsl"),
        GgmlType::IQ1_S => wgsl!("formats/iq1_s.wgsl"),
        GgmlType::IQ1_M => wgsl!("formats/iq1_m.wgsl"),
        GgmlType::TQ1_0 => wgsl!("formats/tq1_0.wgsl"),
        GgmlType::TQ2_0 => wgsl!("formats/tq2_0.wgsl"),
        _ => return None,
    })
}

/// Each KV page format's reading and writing.
fn kv_format(name: &str) -> Option<[&'static str; 2]> {
    Some(match name {
        "f16" => [wgsl!("kv/f16_read.wgsl"), wgsl!("kv/f16_write.wgsl")],
        "q8_0" => [wgsl!("kv/q8_0_read.wgsl"), wgsl!("kv/q8_0_write.wgsl")],
        _ => return None,
    })
}

/// The WGSL source of kernel `name`; `None` where there is no such kernel.
pub(crate) fn source(name: &str) -> Option<String> {
    let module = |parts: &[&str]| {
        let mut source = String::from(PRELUDE);
        for part in parts {
            source.push('\n');
            source.push_str(part);
        }
        source
    };
    if let Some((_, body)) = PLAIN.iter().find(|(n, _)| *n == name) {
        return Some(module(&[body]));
    }
    for (prefix, bodies) in BY_FORMAT {
        let Some(format_name) = name.strip_prefix(prefix) else {
            continue;
        };
        let ty = WEIGHT_FORMATS
            .into_iter()
            .find(|ty| ty.name().eq_ignore_ascii_case(format_name))?;
        let declarations;
        let codebooks: &[&str] = match reads_codebooks(ty) {
            true => {
                declarations = codebooks::declarations();
                &[&declarations, CODEBOOKS]
            }
            false => &[],
        };
        return Some(module(
            &[&[BYTES], codebooks, &[format(ty)?], bodies].concat(),
        ));
    }
    if let Some(kv) = name.strip_prefix("kv_write_") {
        let [read, write] = kv_format(kv)?;
        return Some(module(&[read, write, wgsl!("kv_write.wgsl")]));
    }
    let kv = name.strip_prefix("attention_")?;
    let [read, _] = kv_format(kv)?;
    Some(module(&[read, wgsl!("attention.wgsl")]))
}

/// Whether the kernels of weights of `ty` read the codebooks of the IQ formats.
fn reads_codebooks(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M
    )
}

/// Whether a kernel's module reads the codebooks of the IQ formats (bind group 1).
pub(crate) fn takes_codebooks(source: &str) -> bool {
    source.contains("var<storage, read> codebooks")
}

/// A compiled kernel: its pipeline, the layout of its bind group, and whether it takes the
/// codebooks as bind group 1.
pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    pub takes_codebooks: bool,
}

impl Pipeline {
    /// Kernel `name` (its WGSL `source`) for blocks of `block` invocations, taking `buffers`
    /// buffers then its uniform parameters, and where it reads them, the codebooks of the
    /// layout `codebooks`.
    pub(crate) fn new(
        device: &wgpu::Device,
        name: &str,
        source: String,
        block: u32,
        buffers: usize,
        codebooks: Option<&wgpu::BindGroupLayout>,
    ) -> Pipeline {
        let storage = |binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let mut entries: Vec<_> = (0..buffers as u32).map(storage).collect();
        entries.push(wgpu::BindGroupLayoutEntry {
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            ..storage(buffers as u32)
        });
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(name),
            entries: &entries,
        });
        let groups = [Some(&layout), codebooks];
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(name),
            bind_group_layouts: &groups[..1 + usize::from(codebooks.is_some())],
            immediate_size: 0,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[("BLOCK", f64::from(block))],
                // The kernels write their workgroup memory before they read it.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        Pipeline {
            pipeline,
            layout,
            takes_codebooks: codebooks.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use tallow_backend_gpu::{kernels, Product};

    /// Every kernel the backend may launch on wgpu has a module that compiles on the adapter,
    /// and a name that is none of them has none.
    #[test]
    fn every_kernel_compiles() {
        let backend = crate::open(0).expect("a wgpu adapter (install mesa-vulkan-drivers)");
        let gpu = backend.gpu();
        // The products of GPUs and of software adapters, whichever this one is.
        let mut names = kernels::names(|_, _| Product::Float, false);
        names.extend(kernels::names(|_, _| Product::FloatTiles, false));
        names.sort();
        names.dedup();
        for name in names {
            let source = super::source(&name).unwrap_or_else(|| panic!("no source for {name}"));
            // Bind group 0's storage buffers (the codebooks are group 1's).
            let buffers = source.matches("var<storage").count()
                - usize::from(super::takes_codebooks(&source));
            if let Err(e) = gpu.pipeline(&name, 128, buffers) {
                panic!("{name}: {e}");
            }
        }
        assert!(super::source("matmul_q7_k").is_none());
        assert!(super::source("attention_f32").is_none());
        assert!(super::source("tiles_q4_0").is_none());
    }
}
