//! What a backend runs: asked when a model loads (and a KV cache is made), so that a gap is
//! named before anything is uploaded, not discovered when a kernel is missing.

use std::fmt::Write;

use tallow_kv::KvDtype;
use tallow_quant::GgmlType;

use crate::error::BackendError;

/// The weight formats, KV page types and attention heads a backend's kernels take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend's name in messages (`"the CPU"`, `"wgpu"`).
    pub backend: &'static str,
    /// Formats its products and embeddings read.
    pub weight_formats: Vec<GgmlType>,
    /// What its KV pages may hold.
    pub kv_dtypes: Vec<KvDtype>,
    /// The most dimensions of an attention head.
    pub max_head_dim: usize,
    /// A number every head's dimensions must be a multiple of.
    pub head_dim_multiple: usize,
    /// Whether it runs mixture-of-experts layers ([`crate::Step::experts`]).
    pub experts: bool,
}

fn names(types: &[GgmlType]) -> String {
    let mut out = String::new();
    for (i, ty) in types.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let _ = write!(out, "{sep}{ty:?}");
    }
    out
}

impl Capabilities {
    /// Checks that the backend reads weights of type `ty` (of tensor `tensor`).
    pub fn check_weights(&self, tensor: &str, ty: GgmlType) -> Result<(), BackendError> {
        if self.weight_formats.contains(&ty) {
            return Ok(());
        }
        Err(BackendError::Unsupported(format!(
            "{} does not run weights of type {ty:?} (tensor {tensor}); it runs {}",
            self.backend,
            names(&self.weight_formats)
        )))
    }

    /// Checks that the backend's attention takes heads of `d` dimensions.
    pub fn check_head_dim(&self, d: usize) -> Result<(), BackendError> {
        if d <= self.max_head_dim && d.is_multiple_of(self.head_dim_multiple) {
            return Ok(());
        }
        let multiple = match self.head_dim_multiple {
            1 => String::new(),
            m => format!(" and a multiple of {m}"),
        };
        Err(BackendError::Unsupported(format!(
            "{} does not run attention heads of {d} dimensions (at most {}{multiple})",
            self.backend, self.max_head_dim
        )))
    }

    /// Checks that the backend runs mixture-of-experts layers.
    pub fn check_experts(&self) -> Result<(), BackendError> {
        if self.experts {
            return Ok(());
        }
        Err(BackendError::Unsupported(format!(
            "{} does not run mixture-of-experts layers; load the model on the CPU",
            self.backend
        )))
    }

    /// Checks that the backend's KV pages may hold `dtype`.
    pub fn check_kv(&self, dtype: KvDtype) -> Result<(), BackendError> {
        if self.kv_dtypes.contains(&dtype) {
            return Ok(());
        }
        let held: Vec<_> = self.kv_dtypes.iter().map(|d| d.name()).collect();
        Err(BackendError::Unsupported(format!(
            "{} does not hold KV pages of {}; it holds {}",
            self.backend,
            dtype.name(),
            held.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> Capabilities {
        Capabilities {
            backend: "a GPU",
            weight_formats: vec![GgmlType::F16, GgmlType::Q4_0],
            kv_dtypes: vec![KvDtype::F16],
            max_head_dim: 256,
            head_dim_multiple: 2,
            experts: false,
        }
    }

    #[test]
    fn each_gap_is_named() {
        let caps = gpu();
        assert!(caps.check_weights("w", GgmlType::Q4_0).is_ok());
        let e = caps.check_weights("blk.0.ffn_up.weight", GgmlType::Q6_K);
        assert_eq!(
            e.unwrap_err().to_string(),
            "not supported yet: a GPU does not run weights of type Q6_K (tensor \
             blk.0.ffn_up.weight); it runs F16, Q4_0"
        );
        assert!(caps.check_head_dim(128).is_ok());
        for bad in [257, 63] {
            let e = caps.check_head_dim(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "heads of {bad} dimensions (at most 256 and a multiple of 2)"
                )),
                "{e}"
            );
        }
        assert!(caps.check_kv(KvDtype::F16).is_ok());
        let e = caps.check_experts().unwrap_err().to_string();
        assert!(
            e.contains("a GPU does not run mixture-of-experts layers"),
            "{e}"
        );
        assert!(Capabilities {
            experts: true,
            ..caps.clone()
        }
        .check_experts()
        .is_ok());
        let e = caps.check_kv(KvDtype::Q8_0).unwrap_err().to_string();
        assert!(
            e.ends_with("does not hold KV pages of q8_0; it holds f16"),
            "{e}"
        );
    }
}
