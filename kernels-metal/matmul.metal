// Products of weights in any format and f32 activations: y = x · Wᵀ.

#include "tallow.h"

// Weight rows of one threadgroup, a SIMD-group each.
#define ROWS 8

// y[out[t] * rows + r] = x[in[t]] · w[r] for the `rows` rows of `w` (`row_bytes` each,
// `cols` values) and the threadgroup's `tokens` tokens (at most PRODUCT_TOKENS, each run of
// weights decoded once for all of them). SIMD-group k of threadgroup b takes row ROWS * b + k:
// lane i decodes runs i, i + 32, ... of the row and takes their dot products with the
// tokens' values, read where they are (a token's row is small enough for the caches to hold).
template <class Format>
inline void matmul_rows(device const uint8_t* w, device const float* x, device float* y,
                        int rows, int cols, int row_bytes, int tokens, thread const int* in,
                        thread const int* out, uint block, uint tid) {
    uint lane = tid % 32, simd = tid / 32;
    int r = block * ROWS + simd;
    if (r >= rows) return;  // the whole SIMD-group
    device const uint8_t* row = w + (size_t)r * row_bytes;
    float acc[PRODUCT_TOKENS];
    for (int t = 0; t < PRODUCT_TOKENS; ++t) acc[t] = 0.0f;
    float values[32];
    int runs = cols / 32;
    for (int run = lane; run < runs; run += 32) {
        Format::run(row, run, values);
        for (int t = 0; t < tokens; ++t) {
            device const float* xs = x + (size_t)in[t] * cols + 32 * run;
            float sum = 0.0f;
            for (int i = 0; i < 32; ++i) sum += values[i] * xs[i];
            acc[t] += sum;
        }
    }
    for (int t = 0; t < tokens; ++t) {
        float total = simd_sum(acc[t]);
        if (lane == 0) y[(size_t)out[t] * rows + r] = total;
    }
}

// The `n` tokens of x, PRODUCT_TOKENS * group.y.. in threadgroup (b, group.y).
template <class Format>
inline void matmul(device const uint8_t* w, device const float* x, device float* y, int rows,
                   int cols, int row_bytes, int n, uint3 group, uint tid) {
    int first = group.y * PRODUCT_TOKENS;
    int tokens = n - first < PRODUCT_TOKENS ? n - first : PRODUCT_TOKENS;
    int token_rows[PRODUCT_TOKENS];
    for (int t = 0; t < PRODUCT_TOKENS; ++t) token_rows[t] = first + t;
    matmul_rows<Format>(w, x, y, rows, cols, row_bytes, tokens, token_rows, token_rows, group.x,
                        tid);
}

// A mixture of experts' products: threadgroup (b, i) takes tile i of `tiles` (expert, first
// index in `pairs`, count, unused; count 0 past the last, see experts.metal's group_pairs):
// its expert's weights (expert e's at `w + offsets[e]`) by the rows of x its pairs name (row
// pair / divisor), into the pairs' rows of y.
template <class Format>
inline void matmul_experts(device const uint8_t* w, device const uint32_t* offsets,
                           device const float* x, device float* y, int rows, int cols,
                           int row_bytes, device const uint32_t* pairs,
                           device const uint32_t* tiles, int divisor, uint3 group, uint tid) {
    device const uint32_t* tile = tiles + 4 * group.y;
    int count = (int)tile[2];
    if (count == 0 || offsets[tile[0]] == NO_EXPERT) return;  // the whole threadgroup
    int in[PRODUCT_TOKENS], out[PRODUCT_TOKENS];
    for (int t = 0; t < PRODUCT_TOKENS; ++t) tile_pair(pairs, tile, t, divisor, &in[t], &out[t]);
    matmul_rows<Format>(w + offsets[tile[0]], x, y, rows, cols, row_bytes, count, in, out,
                        group.x, tid);
}

#define MATMUL(name, Format)                                                                \
    kernel void matmul_##name(                                                              \
        device const uint8_t* w [[buffer(0)]], device const float* x [[buffer(1)]],         \
        device float* y [[buffer(2)]], constant int& rows [[buffer(3)]],                    \
        constant int& cols [[buffer(4)]], constant int& row_bytes [[buffer(5)]],            \
        constant int& n [[buffer(6)]], uint3 group [[threadgroup_position_in_grid]],        \
        uint tid [[thread_index_in_threadgroup]]) {                                         \
        matmul<Format>(w, x, y, rows, cols, row_bytes, n, group, tid);                      \
    }                                                                                       \
    kernel void matmul_experts_##name(                                                      \
        device const uint8_t* w [[buffer(0)]], device const uint32_t* offsets [[buffer(1)]], \
        device const float* x [[buffer(2)]], device float* y [[buffer(3)]],                 \
        constant int& rows [[buffer(4)]], constant int& cols [[buffer(5)]],                 \
        constant int& row_bytes [[buffer(6)]], device const uint32_t* pairs [[buffer(7)]],  \
        device const uint32_t* tiles [[buffer(8)]], constant int& divisor [[buffer(9)]],    \
        uint3 group [[threadgroup_position_in_grid]],                                       \
        uint tid [[thread_index_in_threadgroup]]) {                                         \
        matmul_experts<Format>(w, offsets, x, y, rows, cols, row_bytes, pairs, tiles,       \
                               divisor, group, tid);                                        \
    }
FOR_EACH_FORMAT(MATMUL)
