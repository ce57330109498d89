// Operations on rows of activations: RMSNorm, bias, residual add, gated activations, a
// shared expert's sigmoid gate.

#include "tallow.h"

// RMSNorm of each row of `width` values of `x` (one threadgroup per row) times `gain`, into
// `out` (which may be `x`).
kernel void rms_norm(device const float* x [[buffer(0)]], device const float* gain [[buffer(1)]],
                     constant float& eps [[buffer(2)]], device float* out [[buffer(3)]],
                     constant int& width [[buffer(4)]],
                     uint row [[threadgroup_position_in_grid]],
                     uint tid [[thread_index_in_threadgroup]],
                     uint threads [[threads_per_threadgroup]]) {
    threadgroup float partial[32];
    device const float* src = x + (size_t)row * width;
    device float* dst = out + (size_t)row * width;
    float squares = 0.0f;
    for (int i = tid; i < width; i += threads) squares += src[i] * src[i];
    float total = group_sum(squares, partial, tid, threads);
    float scale = 1.0f / sqrt(total / (float)width + eps);
    for (int i = tid; i < width; i += threads) dst[i] = src[i] * scale * gain[i];
}

// x[i] += y[i] for `n` values.
kernel void add(device float* x [[buffer(0)]], device const float* y [[buffer(1)]],
                constant int& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if ((int)i < n) x[i] += y[i];
}

// Each row of `width` values of `x` plus `bias`, for `n` values.
kernel void add_bias(device float* x [[buffer(0)]], device const float* bias [[buffer(1)]],
                     constant int& n [[buffer(2)]], constant int& width [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
    if ((int)i < n) x[i] += bias[i % width];
}

// gate = act(gate) * up for `n` values, as the CPU computes them: SiLU where `activation` is
// 0; GELU's tanh form (`x * sigmoid(2c(x + 0.044715 x^3))`) where 1; gpt-oss's clamped
// SwiGLU (`g * sigmoid(1.702 g) * (clamp(up, -7, 7) + 1)`, `g = min(gate, 7)`) where 2.
kernel void gated(device float* gate [[buffer(0)]], device const float* up [[buffer(1)]],
                  constant int& n [[buffer(2)]], constant int& activation [[buffer(3)]],
                  uint i [[thread_position_in_grid]]) {
    if ((int)i >= n) return;
    float x = gate[i], u = up[i], z = x;
    if (activation == 1) {
        z = 2.0f * 0.7978846f * (x + 0.044715f * x * x * x);
    } else if (activation == 2) {
        x = min(x, 7.0f);
        z = 1.702f * x;
        u = clamp(u, -7.0f, 7.0f) + 1.0f;
    }
    gate[i] = x / (1.0f + precise::exp(-z)) * u;
}

// Each row of `width` values of `x` times the sigmoid of its row's `gates` value, for `n`
// values (a shared expert's gate).
kernel void scale_by_sigmoid(device float* x [[buffer(0)]],
                             device const float* gates [[buffer(1)]],
                             constant int& n [[buffer(2)]], constant int& width [[buffer(3)]],
                             uint i [[thread_position_in_grid]]) {
    if ((int)i < n) x[i] *= 1.0f / (1.0f + precise::exp(-gates[i / width]));
}

// Row t's `width` values of `x` into columns first.. of row t of `out` (rows of `out_width`),
// for `n` values: the products of one part of a matrix cut into parts.
kernel void place_columns(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                          constant int& n [[buffer(2)]], constant int& width [[buffer(3)]],
                          constant int& out_width [[buffer(4)]], constant int& first [[buffer(5)]],
                          uint i [[thread_position_in_grid]]) {
    if ((int)i < n) out[(size_t)(i / width) * out_width + first + i % width] = x[i];
}

// `n` bytes from `src` to `dst` (not overlapping): a copy kept in a run of launches.
kernel void copy_bytes(device const uint8_t* src [[buffer(0)]], device uint8_t* dst [[buffer(1)]],
                       constant int& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if ((int)i < n) dst[i] = src[i];
}
