// Products of weights in any format and f32 activations: y = x · Wᵀ.

#include "tallow.cuh"
#include "formats.h"

// Weight rows of one block (a warp each): they share the block's copy of the activations.
#define ROWS 8

// y[out[t] * rows + r] = x[in[t]] · w[r] for the `rows` rows of `w` (`row_bytes` each,
// `cols` values) and the block's `tokens` tokens (at most PRODUCT_TOKENS, each run of weights
// decoded once for all of them). Block (b, tile): warp k over row ROWS * b + k. A pass
// takes 32 runs of 32 values: the block copies those 1024 values of each token's activations
// to shared memory (neighbouring threads reading neighbouring values), and lane i decodes run
// i of its row and takes its dot products there.
// The copy's rows are padded to 33 values, so that the 32 lanes, each reading its own run,
// read 32 different banks.
template <class Format>
__device__ void matmul_rows(const uint8_t* w, const float* x, float* y, int rows, int cols,
                            int row_bytes, int tokens, const int* in, const int* out) {
    __shared__ float tile[PRODUCT_TOKENS][32 * 33];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int r = blockIdx.x * ROWS + warp;
    const uint8_t* row = w + (size_t)(r < rows ? r : 0) * row_bytes;
    float acc[PRODUCT_TOKENS];
    for (int t = 0; t < PRODUCT_TOKENS; ++t) acc[t] = 0.0f;
    float values[32];
    int runs = cols / 32;
    for (int base = 0; base < runs; base += 32) {
        int n_values = (runs - base < 32 ? runs - base : 32) * 32;
        __syncthreads();  // the last pass has read the tile
        for (int j = threadIdx.x; j < tokens * 1024; j += 32 * ROWS) {
            int t = j / 1024, v = j % 1024;
            if (v < n_values) tile[t][v / 32 * 33 + v % 32] = x[(size_t)in[t] * cols + 32 * base + v];
        }
        __syncthreads();
        if (r >= rows || base + lane >= runs) continue;
        Format::run(row, base + lane, values);
        for (int t = 0; t < tokens; ++t) {
            const float* xs = &tile[t][lane * 33];
            float sum = 0.0f;
            for (int i = 0; i < 32; ++i) sum += values[i] * xs[i];
            acc[t] += sum;
        }
    }
    for (int t = 0; t < tokens; ++t) {
        float total = warp_sum(acc[t]);
        if (lane == 0 && r < rows) y[(size_t)out[t] * rows + r] = total;
    }
}

// The `n` tokens of x, PRODUCT_TOKENS * blockIdx.y.. in block (b, blockIdx.y).
template <class Format>
__device__ void matmul(const uint8_t* w, const float* x, float* y, int rows, int cols,
                       int row_bytes, int n) {
    int first = blockIdx.y * PRODUCT_TOKENS;
    int tokens = n - first < PRODUCT_TOKENS ? n - first : PRODUCT_TOKENS;
    int token_rows[PRODUCT_TOKENS];
    for (int t = 0; t < PRODUCT_TOKENS; ++t) token_rows[t] = first + t;
    matmul_rows<Format>(w, x, y, rows, cols, row_bytes, tokens, token_rows, token_rows);
}

// A mixture of experts' products: block (b, i) takes tile i of `tiles` (expert, first index
// in `pairs`, count, unused; count 0 past the last, see experts.cu's group_pairs): its
// expert's weights (expert e's at `w + offsets[e]`) by the rows of x its pairs name (row
// pair / divisor), into the pairs' rows of y.
template <class Format>
__device__ void matmul_experts(const uint8_t* w, const uint32_t* offsets, const float* x,
                               float* y, int rows, int cols, int row_bytes,
                               const uint32_t* pairs, const uint32_t* tiles, int divisor) {
    const uint32_t* tile = tiles + 4 * blockIdx.y;
    int count = (int)tile[2];
    if (count == 0 || offsets[tile[0]] == NO_EXPERT) return;  // the whole block
    int in[PRODUCT_TOKENS], out[PRODUCT_TOKENS];
    for (int t = 0; t < PRODUCT_TOKENS; ++t) {
        tile_pair(pairs, tile, t, divisor, &in[t], &out[t]);
    }
    matmul_rows<Format>(w + offsets[tile[0]], x, y, rows, cols, row_bytes, count, in, out);
}

#define MATMUL(name, Format)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * ROWS) matmul_##name(                  \
        const uint8_t* w, const float* x, float* y, int rows, int cols, int row_bytes,       \
        int n) {                                                                            \
        matmul<Format>(w, x, y, rows, cols, row_bytes, n);                                   \
    }                                                                                       \
    TALLOW_EXPORT(matmul_##name)                                                            \
    extern "C" __global__ void __launch_bounds__(32 * ROWS) matmul_experts_##name(          \
        const uint8_t* w, const uint32_t* offsets, const float* x, float* y, int rows,       \
        int cols, int row_bytes, const uint32_t* pairs, const uint32_t* tiles, int divisor) { \
        matmul_experts<Format>(w, offsets, x, y, rows, cols, row_bytes, pairs, tiles,        \
                               divisor);                                                    \
    }                                                                                       \
    TALLOW_EXPORT(matmul_experts_##name)
FOR_EACH_FORMAT(MATMUL)
