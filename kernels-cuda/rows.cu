// Operations on rows of activations: RMSNorm, bias, residual add, gated activations, a
// shared expert's sigmoid gate.

#include "tallow.cuh"

// RMSNorm of each row of `width` values of `x` (one block per row) times `gain`, into `out`
// (which may be `x`).
extern "C" __global__ void rms_norm(const float* x, const float* gain, float eps, float* out,
                                    int width) {
    const float* row = x + (size_t)blockIdx.x * width;
    float* dst = out + (size_t)blockIdx.x * width;
    float squares = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) squares += row[i] * row[i];
    float scale = rsqrtf(block_sum(squares) / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = row[i] * scale * gain[i];
}
TALLOW_EXPORT(rms_norm)

// x[i] += y[i] for `n` values.
extern "C" __global__ void add(float* x, const float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}
TALLOW_EXPORT(add)

// Each row of `width` values of `x` plus `bias`, for `n` values.
extern "C" __global__ void add_bias(float* x, const float* bias, int n, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += bias[i % width];
}
TALLOW_EXPORT(add_bias)

// gate = act(gate) * up for `n` values, as the CPU computes them: SiLU where `activation` is
// 0; GELU's tanh form (`x * sigmoid(2c(x + 0.044715 x^3))`) where 1; gpt-oss's clamped
// SwiGLU (`g * sigmoid(1.702 g) * (clamp(up, -7, 7) + 1)`, `g = min(gate, 7)`) where 2.
extern "C" __global__ void gated(float* gate, const float* up, int n, int activation) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = gate[i], u = up[i], z = x;
    if (activation == 1) {
        z = 2.0f * 0.7978846f * (x + 0.044715f * x * x * x);
    } else if (activation == 2) {
        x = fminf(x, 7.0f);
        z = 1.702f * x;
        u = fminf(fmaxf(u, -7.0f), 7.0f) + 1.0f;
    }
    gate[i] = x / (1.0f + expf(-z)) * u;
}
TALLOW_EXPORT(gated)

// Each row of `width` values of `x` times the sigmoid of its row's `gates` value, for `n`
// values (a shared expert's gate).
extern "C" __global__ void scale_by_sigmoid(float* x, const float* gates, int n, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 1.0f / (1.0f + expf(-gates[i / width]));
}
TALLOW_EXPORT(scale_by_sigmoid)

// Row t's `width` values of `x` into columns first.. of row t of `out` (rows of `out_width`),
// for `n` values: the products of one part of a matrix cut into parts.
extern "C" __global__ void place_columns(const float* x, float* out, int n, int width,
                                         int out_width, int first) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[(size_t)(i / width) * out_width + first + i % width] = x[i];
}
TALLOW_EXPORT(place_columns)

// `n` bytes from `src` to `dst` (not overlapping): a copy kept in a run of launches, so that
// a step's copies (a branch's positions shared with its parent) do not cut its graph.
extern "C" __global__ void copy_bytes(const uint8_t* src, uint8_t* dst, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
TALLOW_EXPORT(copy_bytes)
