// Products of weights in any format and f32 activations: y = x · Wᵀ.

#include "formats.cuh"

// Tokens of one block: each run of weights is decoded once for all of them.
#define TOKENS 8

// Weight rows of one block (a warp each): they share the block's copy of the activations.
#define ROWS 8

// y[t * rows + r] = x[t] · w[r] for the `rows` rows of `w` (`row_bytes` each, `cols`
// values) and `n` tokens of `x`. Block (b, tile): warp k over row ROWS * b + k for tokens
// TOKENS * tile.. of them. A pass takes 32 runs of 32 values: the block copies those 1024
// values of each token's activations to shared memory (neighbouring threads reading
// neighbouring values), and lane i decodes run i of its row and takes its dot products there.
// The copy's rows are padded to 33 values, so that the 32 lanes, each reading its own run,
// read 32 different banks.
template <class Format>
__device__ void matmul(const uint8_t* w, const float* x, float* y, int rows, int cols,
                       int row_bytes, int n) {
    __shared__ float tile[TOKENS][32 * 33];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int r = blockIdx.x * ROWS + warp, first = blockIdx.y * TOKENS;
    int tokens = n - first < TOKENS ? n - first : TOKENS;
    const uint8_t* row = w + (size_t)(r < rows ? r : 0) * row_bytes;
    float acc[TOKENS];
    for (int t = 0; t < TOKENS; ++t) acc[t] = 0.0f;
    float values[32];
    int runs = cols / 32;
    for (int base = 0; base < runs; base += 32) {
        int n_values = (runs - base < 32 ? runs - base : 32) * 32;
        __syncthreads();  // the last pass has read the tile
        for (int j = threadIdx.x; j < tokens * 1024; j += 32 * ROWS) {
            int t = j / 1024, v = j % 1024;
            if (v < n_values) tile[t][v / 32 * 33 + v % 32] = x[(size_t)(first + t) * cols + 32 * base + v];
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
        if (lane == 0 && r < rows) y[(size_t)(first + t) * rows + r] = total;
    }
}

#define MATMUL(name, Format)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * ROWS) matmul_##name(                  \
        const uint8_t* w, const float* x, float* y, int rows, int cols, int row_bytes,       \
        int n) {                                                                            \
        matmul<Format>(w, x, y, rows, cols, row_bytes, n);                                   \
    }                                                                                       \
    TALLOW_EXPORT(matmul_##name)
FOR_EACH_FORMAT(MATMUL)
