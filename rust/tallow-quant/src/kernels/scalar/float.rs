//! The scalar set's attention kernels and gated activations: the portable loops as they
//! are (the compiler vectorizes them for the baseline of the target).

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::kernels::activations::{clamped_swiglu_loop, gated_loop};
use crate::kernels::attention::loops;

pub(super) unsafe fn page(
    states: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
) {
    loops::rows(states, q, keys, values, scores)
}

pub(super) unsafe fn merge(state: &mut [f32], other: &[f32]) {
    loops::merge(state, other)
}

pub(super) unsafe fn general(
    states: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    scale: f32,
    softcap: Option<f32>,
) {
    loops::rows_with(states, q, keys, values, scores, scale, softcap)
}

/// f16 to f32 with the `half` crate (which uses F16C where the CPU has it).
pub(super) unsafe fn widen(src: &[f16], out: &mut [f32]) {
    src.convert_to_f32_slice(out);
}

pub(super) unsafe fn silu(gate: &mut [f32], up: &[f32]) {
    gated_loop::<false>(gate, up)
}

pub(super) unsafe fn gelu_tanh(gate: &mut [f32], up: &[f32]) {
    gated_loop::<true>(gate, up)
}

pub(super) unsafe fn clamped_swiglu(gate: &mut [f32], up: &[f32]) {
    clamped_swiglu_loop(gate, up)
}
