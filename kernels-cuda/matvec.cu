// Integer products for steps of a few tokens (decode): the activations are quantized to
// signed bytes once per step, and each run of 32 weights meets them in `dp4a` dot products of
// four bytes, read a word at a time (matmul.cu reads and converts the weights value by value).

#include "tallow.cuh"
#include "formats.h"

// Weight rows of one block, a warp each.
#define VEC_ROWS 4

// Runs of 32 values of x (rows of whole runs, one after the other) quantized as ggml's
// quantize_row_q8_1 rounds them: d = max|x| / 127, q = round(x / d). A warp per run, 8 a block.
extern "C" __global__ void quantize_q8(const float* x, int8_t* q, Q8Run* runs, int n_runs) {
    int run = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (run >= n_runs) return;  // the whole warp
    float v = x[(size_t)run * 32 + lane];
    float d = warp_max(fabsf(v)) / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
    int quant = __float2int_rn(v * inverse);
    q[(size_t)run * 32 + lane] = (int8_t)quant;
    // The sum over each half of the warp: masks under 16 stay within a half.
    float sum = (float)quant;
    for (int mask = 8; mask > 0; mask >>= 1) sum += __shfl_xor_sync(FULL_WARP, sum, mask);
    if (lane == 0) {
        runs[run].d = d;
        runs[run].sums[0] = (int)sum;
        runs[run].unused = 0;
    }
    if (lane == 16) runs[run].sums[1] = (int)sum;
}
TALLOW_EXPORT(quantize_q8)

// y[out[t] * rows + r] = x[in[t]] · w[r] for the block's `tokens` tokens (at most
// PRODUCT_TOKENS), with x quantized (`q`, `runs`: rows of cols / 32 runs). Warp k of block b takes row
// VEC_ROWS * b + k; lane i its runs i, i + 32, ...: the run's quants and scales from
// Format::ints, four dp4a a half per token, the integer sums scaled once per half.
template <class Format>
__device__ void matvec_rows(const uint8_t* w, const int8_t* q, const Q8Run* runs, float* y,
                            int rows, int cols, int row_bytes, int tokens, const int* in,
                            const int* out) {
    int lane = threadIdx.x % 32, r = blockIdx.x * VEC_ROWS + threadIdx.x / 32;
    if (r >= rows) return;  // the whole warp
    const uint8_t* row = w + (size_t)r * row_bytes;
    int n_runs = cols / 32;
    float acc[PRODUCT_TOKENS];
#pragma unroll
    for (int t = 0; t < PRODUCT_TOKENS; ++t) acc[t] = 0.0f;
    for (int i = lane; i < n_runs; i += 32) {
        int quants[8];
        float scale[2], offset[2];
        Format::ints(row, i, quants, scale, offset);
#pragma unroll
        for (int t = 0; t < PRODUCT_TOKENS; ++t) {
            if (t >= tokens) break;
            size_t at = (size_t)in[t] * n_runs + i;
            const uint8_t* xq = (const uint8_t*)q + 32 * at;
            Q8Run x = runs[at];
            int dot[2] = {0, 0};
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                dot[k / 4] = __dp4a(quants[k], word_at(xq + 4 * k), dot[k / 4]);
            }
            float sum = 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                sum += scale[h] * (float)(dot[h] - Format::ZERO * x.sums[h]) +
                       offset[h] * (float)x.sums[h];
            }
            acc[t] += x.d * sum;
        }
    }
#pragma unroll
    for (int t = 0; t < PRODUCT_TOKENS; ++t) {
        if (t >= tokens) break;
        float total = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)out[t] * rows + r] = total;
    }
}

// The `n` tokens of x, PRODUCT_TOKENS * blockIdx.y.. in block (b, blockIdx.y).
template <class Format>
__device__ void matvec(const uint8_t* w, const int8_t* q, const Q8Run* runs, float* y,
                       int rows, int cols, int row_bytes, int n) {
    int first = blockIdx.y * PRODUCT_TOKENS;
    int tokens = n - first < PRODUCT_TOKENS ? n - first : PRODUCT_TOKENS;
    int token_rows[PRODUCT_TOKENS];
#pragma unroll
    for (int t = 0; t < PRODUCT_TOKENS; ++t) token_rows[t] = first + t;
    matvec_rows<Format>(w, q, runs, y, rows, cols, row_bytes, tokens, token_rows, token_rows);
}

// A mixture of experts' products, as matmul.cu's matmul_experts with quantized activations.
template <class Format>
__device__ void matvec_experts(const uint8_t* w, const uint32_t* offsets, const int8_t* q,
                               const Q8Run* runs, float* y, int rows, int cols, int row_bytes,
                               const uint32_t* pairs, const uint32_t* tiles, int divisor) {
    const uint32_t* tile = tiles + 4 * blockIdx.y;
    int count = (int)tile[2];
    if (count == 0 || offsets[tile[0]] == NO_EXPERT) return;  // the whole block
    int in[PRODUCT_TOKENS], out[PRODUCT_TOKENS];
#pragma unroll
    for (int t = 0; t < PRODUCT_TOKENS; ++t) {
        tile_pair(pairs, tile, t, divisor, &in[t], &out[t]);
    }
    matvec_rows<Format>(w + offsets[tile[0]], q, runs, y, rows, cols, row_bytes, count, in, out);
}

#define MATVEC(name, Format)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * VEC_ROWS) matvec_##name(                \
        const uint8_t* w, const int8_t* q, const Q8Run* runs, float* y, int rows, int cols,    \
        int row_bytes, int n) {                                                               \
        matvec<Format>(w, q, runs, y, rows, cols, row_bytes, n);                               \
    }                                                                                         \
    TALLOW_EXPORT(matvec_##name)                                                              \
    extern "C" __global__ void __launch_bounds__(32 * VEC_ROWS) matvec_experts_##name(        \
        const uint8_t* w, const uint32_t* offsets, const int8_t* q, const Q8Run* runs,         \
        float* y, int rows, int cols, int row_bytes, const uint32_t* pairs,                    \
        const uint32_t* tiles, int divisor) {                                                  \
        matvec_experts<Format>(w, offsets, q, runs, y, rows, cols, row_bytes, pairs, tiles,    \
                               divisor);                                                      \
    }                                                                                         \
    TALLOW_EXPORT(matvec_experts_##name)
FOR_EACH_QUANTIZED_FORMAT(MATVEC)
