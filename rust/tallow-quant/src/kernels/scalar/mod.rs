//! The scalar set's row of kernels: the reference dot products, the scalar packed kernel and
//! the reference quantizers. Every other set's kernels are tested against these.

mod float;
mod packed;

use super::activations::RawActivations;
use super::attention::RawAttention;
use super::{RawFloatRow, RawPacked, RawRow, RawVecDot};
use crate::blocks::{
    BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockTq1_0,
    BlockTq2_0,
};
use crate::reference::quantize::quantizer;
use crate::reference::vec_dot as reference;
use crate::GgmlType;

/// The scalar kernels of `ty`.
pub(super) fn row(ty: GgmlType) -> RawRow {
    let (vec_dot, packed): (Option<RawVecDot>, Option<RawPacked>) = match ty {
        GgmlType::F32 => (Some(reference::f32_f32), None),
        GgmlType::F16 => (Some(reference::f16_f32), None),
        GgmlType::BF16 => (Some(reference::bf16_f32), None),
        GgmlType::Q4_0 => (Some(reference::q4_0_q8_0), Some(packed::q4_0_entry)),
        GgmlType::Q4_1 => (Some(reference::q4_1_q8_1), Some(packed::q4_1_entry)),
        GgmlType::Q5_0 => (Some(reference::q5_0_q8_0), Some(packed::q5_0_entry)),
        GgmlType::Q5_1 => (Some(reference::q5_1_q8_1), None),
        GgmlType::Q8_0 => (Some(reference::q8_0_q8_0), Some(packed::q8_0_entry)),
        GgmlType::Q2_K => (Some(reference::q2_k_q8_k), Some(packed::q2_k_entry)),
        GgmlType::Q3_K => (Some(reference::q3_k_q8_k), Some(packed::q3_k_entry)),
        GgmlType::Q4_K => (Some(reference::q4_k_q8_k), Some(packed::q4_k_entry)),
        GgmlType::Q5_K => (Some(reference::q5_k_q8_k), Some(packed::q5_k_entry)),
        GgmlType::Q6_K => (Some(reference::q6_k_q8_k), Some(packed::q6_k_entry)),
        GgmlType::IQ4_NL => (Some(reference::iq4_nl_q8_0), Some(packed::iq4_nl_entry)),
        GgmlType::IQ4_XS => (Some(reference::iq4_xs_q8_k), Some(packed::iq4_xs_entry)),
        GgmlType::MXFP4 => (Some(reference::mxfp4_q8_0), None),
        GgmlType::IQ2_XXS => (Some(reference::grid_q8_k::<BlockIq2Xxs>), None),
        GgmlType::IQ2_XS => (Some(reference::grid_q8_k::<BlockIq2Xs>), None),
        GgmlType::IQ2_S => (Some(reference::grid_q8_k::<BlockIq2S>), None),
        GgmlType::IQ3_XXS => (Some(reference::grid_q8_k::<BlockIq3Xxs>), None),
        GgmlType::IQ3_S => (Some(reference::grid_q8_k::<BlockIq3S>), None),
        GgmlType::IQ1_S => (Some(reference::grid_q8_k::<BlockIq1S>), None),
        GgmlType::IQ1_M => (Some(reference::grid_q8_k::<BlockIq1M>), None),
        GgmlType::TQ1_0 => (Some(reference::grid_q8_k::<BlockTq1_0>), None),
        GgmlType::TQ2_0 => (Some(reference::grid_q8_k::<BlockTq2_0>), None),
        GgmlType::Q8_1 | GgmlType::Q8_K => (None, None),
    };
    RawRow {
        vec_dot,
        packed,
        quantize: quantizer(ty).map(|f| f as super::table::RawQuantize),
        ..RawRow::default()
    }
}

/// The scalar attention kernels and gated activations: all of them (every other set falls
/// back to these).
pub(super) fn float_row() -> RawFloatRow {
    RawFloatRow {
        attention: RawAttention {
            widen: Some(float::widen),
            page: Some(float::page),
            in_place: None,
            merge: Some(float::merge),
            general: Some(float::general),
        },
        activations: RawActivations {
            silu: Some(float::silu),
            gelu_tanh: Some(float::gelu_tanh),
            clamped_swiglu: Some(float::clamped_swiglu),
        },
    }
}
