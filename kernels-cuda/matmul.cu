// Products of weights in any format and f32 activations: y = x · Wᵀ.

#include "formats.cuh"

// Tokens of one block: each run of weights is decoded once for all of them.
#define TOKENS 8

// y[t * rows + r] = x[t] · w[r] for the `rows` rows of `w` (`row_bytes` each, `cols`
// values) and `n` tokens of `x`. Block (r, tile): one warp over row r for tokens
// TOKENS * tile.. of them; lane i takes runs i, i + 32, ... of the row.
template <class Format>
__device__ void matmul(const uint8_t* w, const float* x, float* y, int rows, int cols,
                       int row_bytes, int n) {
    int r = blockIdx.x, first = blockIdx.y * TOKENS;
    int tokens = n - first < TOKENS ? n - first : TOKENS;
    const uint8_t* row = w + (size_t)r * row_bytes;
    float acc[TOKENS];
    for (int t = 0; t < TOKENS; ++t) acc[t] = 0.0f;
    float values[32];
    for (int run = threadIdx.x; run < cols / 32; run += 32) {
        Format::run(row, run, values);
        for (int t = 0; t < tokens; ++t) {
            const float* xs = x + (size_t)(first + t) * cols + 32 * run;
            float sum = 0.0f;
            for (int i = 0; i < 32; ++i) sum += values[i] * xs[i];
            acc[t] += sum;
        }
    }
    for (int t = 0; t < tokens; ++t) {
        float total = warp_sum(acc[t]);
        if (threadIdx.x == 0) y[(size_t)(first + t) * rows + r] = total;
    }
}

#define MATMUL(name, Format)                                                                \
    extern "C" __global__ void matmul_##name(const uint8_t* w, const float* x, float* y,    \
                                             int rows, int cols, int row_bytes, int n) {     \
        matmul<Format>(w, x, y, rows, cols, row_bytes, n);                                   \
    }                                                                                       \
    TALLOW_EXPORT(matmul_##name)
FOR_EACH_FORMAT(MATMUL)
