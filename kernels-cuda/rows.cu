// Operations on rows of activations: RMSNorm, bias, residual add, gated activations.

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

// gate = act(gate) * up for `n` values: SiLU where `gelu` is 0, GELU's tanh form otherwise
// (`x * sigmoid(2c(x + 0.044715 x^3))`, as the CPU computes it).
extern "C" __global__ void gated(float* gate, const float* up, int n, int gelu) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = gate[i];
    float z = gelu ? 2.0f * 0.7978846f * (x + 0.044715f * x * x * x) : x;
    gate[i] = x / (1.0f + expf(-z)) * up[i];
}
TALLOW_EXPORT(gated)
