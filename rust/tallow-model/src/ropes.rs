//! The RoPEs of a model's layers.

use tallow_backend::{Rope, RopeParams, RopeScaling};

use crate::config::ModelConfig;

/// The distinct RoPEs of a model: the layers that attend globally use the model's base,
/// frequency factors and scaling (first); sliding-window layers may use their own base,
/// unscaled (second, where the architecture says so). [`rope_index`] says which one a layer uses. `freq_factors` are the
/// global layers' frequency divisors, if the model has them.
pub(crate) fn ropes(config: &ModelConfig, freq_factors: Option<&[f32]>) -> Vec<Rope> {
    let global = RopeParams {
        style: config.arch.rope,
        base: config.rope_base,
        rope_dim: config.rope_dim,
        head_dim: config.head_dim,
        freq_factors,
        scaling: config.rope_scaling,
        original_context: config.rope_original_context,
        attn_factor: config.rope_attn_factor,
    };
    let mut ropes = vec![Rope::new(global)];
    if config.sliding_window.is_some() && config.arch.sliding_rope {
        ropes.push(Rope::new(RopeParams {
            base: config.rope_base_swa,
            freq_factors: None,
            scaling: RopeScaling::None,
            attn_factor: 1.0,
            ..global
        }));
    }
    ropes
}

/// Which of [`ropes`] layer `layer` uses.
pub(crate) fn rope_index(config: &ModelConfig, layer: usize) -> usize {
    usize::from(config.arch.sliding_rope && config.slides(layer))
}
