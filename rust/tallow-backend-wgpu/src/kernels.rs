//! The WGSL kernels (in the repository's `kernels-wgsl/`), compiled into pipelines on first
//! use: the quantized ones once per GGUF format, each the format's `dequant32` with the
//! kernel's body.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tallow_backend::BackendError;
use tallow_quant::GgmlType;

use crate::gpu::Gpu;

const BYTES: &str = include_str!("../../../kernels-wgsl/bytes.wgsl");
const MATMUL: &str = include_str!("../../../kernels-wgsl/matmul.wgsl");
const EMBED: &str = include_str!("../../../kernels-wgsl/embed.wgsl");
const NORM: &str = include_str!("../../../kernels-wgsl/norm.wgsl");
const ELEMENTWISE: &str = include_str!("../../../kernels-wgsl/elementwise.wgsl");
const ROPE: &str = include_str!("../../../kernels-wgsl/rope.wgsl");
const KV: &str = include_str!("../../../kernels-wgsl/kv.wgsl");
const ATTENTION: &str = include_str!("../../../kernels-wgsl/attention.wgsl");
const ARGMAX: &str = include_str!("../../../kernels-wgsl/argmax.wgsl");
const EXPERTS: &str = include_str!("../../../kernels-wgsl/experts.wgsl");
/// Workgroup reductions for the kernels that need them, with subgroup operations or without.
const REDUCE_SUBGROUP: &str = include_str!("../../../kernels-wgsl/reduce/subgroup.wgsl");
const REDUCE_SHARED: &str = include_str!("../../../kernels-wgsl/reduce/shared.wgsl");

/// The weight formats the kernels read, with the source of each one's `dequant32`.
const FORMATS: [(GgmlType, &str); 9] = [
    (
        GgmlType::F32,
        include_str!("../../../kernels-wgsl/formats/f32.wgsl"),
    ),
    (
        GgmlType::F16,
        include_str!("../../../kernels-wgsl/formats/f16.wgsl"),
    ),
    (
        GgmlType::Q4_0,
        include_str!("../../../kernels-wgsl/formats/q4_0.wgsl"),
    ),
    (
        GgmlType::Q4_1,
        include_str!("../../../kernels-wgsl/formats/q4_1.wgsl"),
    ),
    (
        GgmlType::Q5_0,
        include_str!("../../../kernels-wgsl/formats/q5_0.wgsl"),
    ),
    (
        GgmlType::Q8_0,
        include_str!("../../../kernels-wgsl/formats/q8_0.wgsl"),
    ),
    (
        GgmlType::Q4_K,
        include_str!("../../../kernels-wgsl/formats/q4_k.wgsl"),
    ),
    (
        GgmlType::Q5_K,
        include_str!("../../../kernels-wgsl/formats/q5_k.wgsl"),
    ),
    (
        GgmlType::Q6_K,
        include_str!("../../../kernels-wgsl/formats/q6_k.wgsl"),
    ),
];

/// The weight formats the kernels read.
pub fn weight_formats() -> impl Iterator<Item = GgmlType> {
    FORMATS.iter().map(|&(ty, _)| ty)
}

/// Whether the kernels read weights in format `ty`.
pub(crate) fn reads(ty: GgmlType) -> bool {
    weight_formats().any(|t| t == ty)
}

/// How the product kernel lays out its work (see matmul.wgsl): `lanes` invocations share
/// each `rows` rows of W.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProductShape {
    lanes: u32,
    rows: u32,
}

impl ProductShape {
    /// For GPUs: the 64 invocations of a workgroup split 4 rows' weights.
    pub(crate) const SPLIT: ProductShape = ProductShape { lanes: 64, rows: 4 };
    /// For software adapters: each invocation takes 8 whole rows.
    pub(crate) const WHOLE: ProductShape = ProductShape { lanes: 1, rows: 8 };

    /// The rows of W one workgroup takes.
    pub(crate) fn rows_per_workgroup(self) -> usize {
        (64 / self.lanes * self.rows) as usize
    }
}

/// One entry point of one kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    /// Products of weights in a format, for blocks of 1 or 4 tokens (see matmul.wgsl).
    Matmul(GgmlType, u32),
    /// The products of a mixture of experts, in tiles of 1 or 4 pairs (matmul.wgsl's
    /// `experts`).
    MatmulExperts(GgmlType, u32),
    Embed(GgmlType),
    Norm,
    NormInPlace,
    Add,
    AddBias,
    Gated,
    Softcap,
    ScaleBySigmoid,
    Rope,
    WriteKv,
    Attention,
    Argmax,
    /// experts.wgsl's entry points.
    Route,
    Group,
    AddBiases,
    Combine,
}

impl Kernel {
    /// The binding of the kernel's uniform parameters (after its buffers).
    pub(crate) fn params_binding(self) -> u32 {
        match self {
            Kernel::Add
            | Kernel::AddBias
            | Kernel::Gated
            | Kernel::Softcap
            | Kernel::ScaleBySigmoid
            | Kernel::Rope
            | Kernel::Argmax => 2,
            Kernel::Matmul(..)
            | Kernel::MatmulExperts(..)
            | Kernel::Embed(_)
            | Kernel::Norm
            | Kernel::NormInPlace => 3,
            Kernel::WriteKv => 4,
            Kernel::Attention => 5,
            Kernel::Route | Kernel::Group | Kernel::AddBiases | Kernel::Combine => 8,
        }
    }

    /// The values of the kernel's `override` constants.
    fn constants(self, shape: ProductShape) -> Vec<(&'static str, f64)> {
        match self {
            Kernel::Matmul(_, tokens) | Kernel::MatmulExperts(_, tokens) => vec![
                ("TOKENS", f64::from(tokens)),
                ("LANES", f64::from(shape.lanes)),
                ("ROWS", f64::from(shape.rows)),
            ],
            _ => Vec::new(),
        }
    }

    /// The kernel's source and entry point; reductions with subgroup operations if
    /// `subgroups`, products in f16 arithmetic if `f16`.
    fn source(self, subgroups: bool, f16: bool) -> Result<(String, &'static str), BackendError> {
        let with_format = |ty: GgmlType, body: &str| {
            let (_, format) = FORMATS.iter().find(|&&(t, _)| t == ty).ok_or_else(|| {
                BackendError::Unsupported(format!("{} weights on wgpu", ty.name()))
            })?;
            Ok::<_, BackendError>(format!("{BYTES}\n{format}\n{body}"))
        };
        let reducing = |body: &str| {
            let reduce = if subgroups {
                REDUCE_SUBGROUP
            } else {
                REDUCE_SHARED
            };
            format!("{reduce}\n{body}")
        };
        Ok(match self {
            Kernel::Matmul(ty, _) | Kernel::MatmulExperts(ty, _) => {
                // F32 weights keep f32 products: in f16 they would lose their precision.
                let arithmetic = if f16 && ty != GgmlType::F32 {
                    "enable f16;\nalias H = f16;\nconst HALF = true;"
                } else {
                    "alias H = f32;\nconst HALF = false;"
                };
                let body = with_format(ty, MATMUL)?;
                let entry = match self {
                    Kernel::Matmul(..) => "main",
                    _ => "experts",
                };
                (format!("{arithmetic}\n{body}"), entry)
            }
            Kernel::Embed(ty) => (with_format(ty, EMBED)?, "main"),
            Kernel::Norm => (reducing(NORM), "norm"),
            Kernel::NormInPlace => (reducing(NORM), "norm_in_place"),
            Kernel::Add => (ELEMENTWISE.into(), "add"),
            Kernel::AddBias => (ELEMENTWISE.into(), "add_bias"),
            Kernel::Gated => (ELEMENTWISE.into(), "gated"),
            Kernel::Softcap => (ELEMENTWISE.into(), "softcap"),
            Kernel::ScaleBySigmoid => (ELEMENTWISE.into(), "scale_by_sigmoid"),
            Kernel::Rope => (ROPE.into(), "main"),
            Kernel::WriteKv => (KV.into(), "write"),
            Kernel::Attention => (reducing(ATTENTION), "main"),
            Kernel::Argmax => (reducing(ARGMAX), "main"),
            Kernel::Route => (EXPERTS.into(), "route"),
            Kernel::Group => (EXPERTS.into(), "group"),
            Kernel::AddBiases => (EXPERTS.into(), "add_biases"),
            Kernel::Combine => (EXPERTS.into(), "combine"),
        })
    }
}

/// The pipelines built so far.
pub(crate) struct Kernels {
    pipelines: Mutex<HashMap<Kernel, Arc<wgpu::ComputePipeline>>>,
    /// Whether reductions use subgroup operations (the device has them enabled).
    subgroups: bool,
    /// Whether products compute in f16 (the device has it enabled).
    f16: bool,
    shape: ProductShape,
}

impl Kernels {
    pub(crate) fn new(subgroups: bool, f16: bool, shape: ProductShape) -> Self {
        Kernels {
            pipelines: Mutex::default(),
            subgroups,
            f16,
            shape,
        }
    }

    pub(crate) fn product_shape(&self) -> ProductShape {
        self.shape
    }

    pub(crate) fn subgroups(&self) -> bool {
        self.subgroups
    }

    pub(crate) fn f16(&self) -> bool {
        self.f16
    }

    /// The pipeline of `kernel`, compiled on first use.
    pub(crate) fn get(
        &self,
        gpu: &Gpu,
        kernel: Kernel,
    ) -> Result<Arc<wgpu::ComputePipeline>, BackendError> {
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pipelines.get(&kernel) {
            return Ok(Arc::clone(p));
        }
        let (source, entry) = kernel.source(self.subgroups, self.f16)?;
        let pipeline = gpu.checked(|device| {
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(entry),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            };
            let module = device.create_shader_module(desc);
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &kernel.constants(self.shape),
                    ..Default::default()
                },
                cache: None,
            })
        })?;
        let pipeline = Arc::new(pipeline);
        pipelines.insert(kernel, Arc::clone(&pipeline));
        Ok(pipeline)
    }
}
