// Integer products for steps of more than 8 tokens (prefill, large batches): a block takes a
// tile of 64 weight rows by 64 tokens and walks the rows' length 4 runs of 32 values at a
// time. Each pass copies the tile's runs to shared memory, the weights as Format::ints gives
// them (bytes, a scale and an offset per half run) and the activations as quantize_q8 left
// them, and each warp multiplies 16 rows by 32 tokens out of shared memory on the tensor cores
// (mma_s8, a run at a time, or a half run where the halves' scales differ), scaling each
// run's integer sums into f32 sums. Each weight byte is read from memory once per 64 tokens
// (matmul.cu's tiles take 8).

#include "tallow.cuh"
#include "formats.h"

#define TILE_ROWS 64
#define TILE_TOKENS 64
// Runs of 32 values a pass.
#define TILE_RUNS 4
// Words of a tile's row in shared memory: a pass's runs, and 4 more, so that the words a warp
// reads for a fragment (word t of rows group, for group < 8, t < 4) fall in 32 banks.
#define TILE_WORDS (8 * TILE_RUNS + 4)

// y[out[t] * rows + r] = x[in[t]] · w[r] for the block's `count` tokens (at most TILE_TOKENS;
// `in` and `out` in shared memory, written before the call) and rows 64b.. of block (a, b).
// Warp w takes rows 16 (w % 4).. and tokens 32 (w / 4)..: four 16 x 8 tiles of mma_s8, whose
// fragments put (row, token) pairs (group + 8 (i / 2), 2t + i % 2) of each in lane 4 group + t.
template <class Format>
__device__ void tile_product(const uint8_t* w, const int8_t* q, const Q8Run* runs, float* y,
                             int rows, int cols, int row_bytes, int count, const int* in,
                             const int* out) {
    __shared__ int w_quants[TILE_ROWS][TILE_WORDS];
    // Per row, per run: scale, scale, offset, offset. The rows and the tokens are padded, a
    // word and a run, so that the rows (tokens) of a fragment's epilogue fall in different banks.
    __shared__ float w_scales[TILE_ROWS][4 * TILE_RUNS + 1];
    __shared__ int x_quants[TILE_TOKENS][TILE_WORDS];
    __shared__ Q8Run x_runs[TILE_TOKENS][TILE_RUNS + 1];
    int first_row = blockIdx.y * TILE_ROWS;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int group = lane / 4, t = lane % 4;
    int row0 = 16 * (warp % 4), token0 = 32 * (warp / 4);
    int n_runs = cols / 32;
    float acc[4][4];  // [tile j][fragment i]
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    }
    for (int base = 0; base < n_runs; base += TILE_RUNS) {
        __syncthreads();  // the last pass has read the tiles (the first: `in`, `out` written)
        {
            // A (row, run) of the weights and a (token, run)'s scale and sums a thread.
            int row = threadIdx.x / TILE_RUNS, run = threadIdx.x % TILE_RUNS;
            int quants[8];
            float scale[2] = {0.0f, 0.0f}, offset[2] = {0.0f, 0.0f};
            bool inside = first_row + row < rows && base + run < n_runs;
            if (inside) {
                const uint8_t* w_row = w + (size_t)(first_row + row) * row_bytes;
                Format::ints(w_row, base + run, quants, scale, offset);
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) w_quants[row][8 * run + k] = inside ? quants[k] : 0;
            float* scales = &w_scales[row][4 * run];
            scales[0] = scale[0];
            scales[1] = scale[1];
            scales[2] = offset[0];
            scales[3] = offset[1];
            int token = row;
            Q8Run x = {0.0f, {0, 0}, 0};
            if (token < count && base + run < n_runs) {
                x = runs[(size_t)in[token] * n_runs + base + run];
            }
            x_runs[token][run] = x;
        }
        // The activations' bytes: neighbouring threads read neighbouring words.
        for (int e = threadIdx.x; e < TILE_TOKENS * 8 * TILE_RUNS; e += 256) {
            int token = e / (8 * TILE_RUNS), word = e % (8 * TILE_RUNS);
            int value = 0;
            if (token < count && base + word / 8 < n_runs) {
                size_t at = (size_t)in[token] * cols + 32 * base + 4 * word;
                value = word_at((const uint8_t*)q + at);
            }
            x_quants[token][word] = value;
        }
        __syncthreads();
        for (int run = 0; run < TILE_RUNS && base + run < n_runs; ++run) {
#pragma unroll
            for (int h = 0; h < Format::HALVES; ++h) {
                // A run (or half h of it: the other half's words zero).
                int k = 8 * run + 4 * h, halves = Format::HALVES;
                int a[4] = {w_quants[row0 + group][k + t], w_quants[row0 + group + 8][k + t], 0, 0};
                if (halves == 1) {
                    a[2] = w_quants[row0 + group][k + 4 + t];
                    a[3] = w_quants[row0 + group + 8][k + 4 + t];
                }
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int* x_row = x_quants[token0 + 8 * j + group];
                    int b[2] = {x_row[k + t], halves == 1 ? x_row[k + 4 + t] : 0};
                    int c[4] = {0, 0, 0, 0};
                    mma_s8(c, a, b);
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const float* s = &w_scales[row0 + group + 8 * (i / 2)][4 * run];
                        const Q8Run& x = x_runs[token0 + 8 * j + 2 * t + i % 2][run];
                        int sum = halves == 1 ? x.sums[0] + x.sums[1] : x.sums[h];
                        float v = s[h] * (float)(c[i] - Format::ZERO * sum) + s[2 + h] * (float)sum;
                        acc[j][i] += x.d * v;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int r = first_row + row0 + group + 8 * (i / 2), token = token0 + 8 * j + 2 * t + i % 2;
            if (r < rows && token < count) y[(size_t)out[token] * rows + r] = acc[j][i];
        }
    }
}

// The `n` tokens of x, TILE_TOKENS * a.. in block (a, b): neighbouring blocks share their
// weights, read from memory once for all of a step's tokens while the activations stay in L2.
template <class Format>
__device__ void tiles(const uint8_t* w, const int8_t* q, const Q8Run* runs, float* y, int rows,
                      int cols, int row_bytes, int n) {
    __shared__ int token_rows[TILE_TOKENS];
    int first = blockIdx.x * TILE_TOKENS;
    if (threadIdx.x < TILE_TOKENS) token_rows[threadIdx.x] = first + threadIdx.x;
    int count = n - first < TILE_TOKENS ? n - first : TILE_TOKENS;
    tile_product<Format>(w, q, runs, y, rows, cols, row_bytes, count, token_rows, token_rows);
}

// A mixture of experts' products, as matvec.cu's matvec_experts with tiles of up to
// TILE_TOKENS pairs (block (i, b): tile i of `tiles`, rows 64b..).
template <class Format>
__device__ void tiles_experts(const uint8_t* w, const uint32_t* offsets, const int8_t* q,
                              const Q8Run* runs, float* y, int rows, int cols, int row_bytes,
                              const uint32_t* pairs, const uint32_t* tiles, int divisor) {
    __shared__ int in[TILE_TOKENS], out[TILE_TOKENS];
    const uint32_t* tile = tiles + 4 * blockIdx.x;
    int count = (int)tile[2];
    if (count == 0 || offsets[tile[0]] == NO_EXPERT) return;  // the whole block
    int i = threadIdx.x;
    if (i < count) tile_pair(pairs, tile, i, divisor, &in[i], &out[i]);
    tile_product<Format>(w + offsets[tile[0]], q, runs, y, rows, cols, row_bytes, count, in, out);
}

// (256, 1): one block a multiprocessor at least, which leaves ptxas the registers it needs;
// with 256 alone it spilled a value of tiles_experts in the formats of one scale a run.
#define TILES(name, Format)                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 1) tiles_##name(                      \
        const uint8_t* w, const int8_t* q, const Q8Run* runs, float* y, int rows, int cols,  \
        int row_bytes, int n) {                                                             \
        tiles<Format>(w, q, runs, y, rows, cols, row_bytes, n);                              \
    }                                                                                       \
    TALLOW_EXPORT(tiles_##name)                                                             \
    extern "C" __global__ void __launch_bounds__(256, 1) tiles_experts_##name(              \
        const uint8_t* w, const uint32_t* offsets, const int8_t* q, const Q8Run* runs,       \
        float* y, int rows, int cols, int row_bytes, const uint32_t* pairs,                  \
        const uint32_t* tiles, int divisor) {                                                \
        tiles_experts<Format>(w, offsets, q, runs, y, rows, cols, row_bytes, pairs, tiles,   \
                              divisor);                                                     \
    }                                                                                       \
    TALLOW_EXPORT(tiles_experts_##name)
FOR_EACH_QUANTIZED_FORMAT(TILES)
