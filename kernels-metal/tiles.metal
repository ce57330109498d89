// Prefill products: y = x · Wᵀ for many tokens in tiles of 64 weight rows by 32 tokens, on
// the SIMD-groups' matrix units (simdgroup_float8x8): each run of 32 weights is decoded once
// per tile, into the threadgroup's memory, for 32 tokens (matmul.metal decodes it for at most
// PRODUCT_TOKENS).

#include "tallow.h"

#define TILE_ROWS 64
#define TILE_TOKENS 32

// The threadgroup memory of one tile: the tile's weights for one run (w[r * 32 + k]), and the
// tokens' values for it (x[k * TILE_TOKENS + t]); at the end `w` holds the tile's results
// (w[r * TILE_TOKENS + t]).
struct TileShared {
    float w[TILE_ROWS * 32];
    float x[32 * TILE_TOKENS];
};

// The rows of x and y of a dense product's tokens: token t of the tile is row first + t.
struct DenseTokens {
    int first;
    void rows(int t, thread int* in, thread int* out) const {
        *in = first + t;
        *out = first + t;
    }
};

// The rows of x and y of a mixture's tile of pairs (tallow.h's tile_pair).
struct PairTokens {
    device const uint32_t* pairs;
    device const uint32_t* tile;
    int divisor;
    void rows(int t, thread int* in, thread int* out) const {
        tile_pair(pairs, tile, t, divisor, in, out);
    }
};

// The tile of rows row0.. of `w` by the threadgroup's `tokens` tokens (at most TILE_TOKENS,
// whose rows `at` names). 128 threads: for each run of 32 values, threads 0..64 decode the
// run of one row each and threads 64..128 copy the tokens' values; then SIMD-group s
// multiplies its 32 rows (s % 2) by its 16 tokens (s / 2) as 4 x 2 matrices of 8 x 8.
template <class Format, class Tokens>
inline void matmul_tile(device const uint8_t* w, device const float* x, device float* y,
                        int rows, int cols, int row_bytes, int tokens, Tokens at, int row0,
                        uint tid, threadgroup TileShared& s) {
    uint simd = tid / 32;
    int simd_rows = (simd % 2) * 32, simd_tokens = (simd / 2) * 16;
    simdgroup_float8x8 acc[4][2];
    for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
    float values[32];
    for (int run = 0; run < cols / 32; ++run) {
        // The last run's tiles have been read.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (tid < TILE_ROWS) {
            int r = row0 + (int)tid;
            if (r < rows) {
                Format::run(w + (size_t)r * row_bytes, run, values);
            } else {
                for (int k = 0; k < 32; ++k) values[k] = 0.0f;
            }
            for (int k = 0; k < 32; ++k) s.w[tid * 32 + k] = values[k];
        } else {
            for (int i = (int)tid - TILE_ROWS; i < 32 * TILE_TOKENS; i += TILE_ROWS) {
                int t = i / 32, k = i % 32, in = 0, out = 0;
                float v = 0.0f;
                if (t < tokens) {
                    at.rows(t, &in, &out);
                    v = x[(size_t)in * cols + 32 * run + k];
                }
                s.x[k * TILE_TOKENS + t] = v;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int k8 = 0; k8 < 32; k8 += 8) {
            simdgroup_float8x8 a[4], b[2];
            for (int i = 0; i < 4; ++i) simdgroup_load(a[i], &s.w[(simd_rows + 8 * i) * 32 + k8], 32);
            for (int j = 0; j < 2; ++j) {
                simdgroup_load(b[j], &s.x[k8 * TILE_TOKENS + simd_tokens + 8 * j], TILE_TOKENS);
            }
            for (int i = 0; i < 4; ++i) {
                for (int j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 2; ++j) {
            simdgroup_store(acc[i][j], &s.w[(simd_rows + 8 * i) * TILE_TOKENS + simd_tokens + 8 * j],
                            TILE_TOKENS);
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // Neighbouring threads write neighbouring rows of a token's output.
    for (int i = tid; i < TILE_ROWS * TILE_TOKENS; i += 128) {
        int t = i / TILE_ROWS, r = i % TILE_ROWS, in = 0, out = 0;
        if (t >= tokens || row0 + r >= rows) continue;
        at.rows(t, &in, &out);
        y[(size_t)out * rows + row0 + r] = s.w[r * TILE_TOKENS + t];
    }
}

#define MATMUL_TILES(name, Format)                                                          \
    kernel void matmul_tiles_##name(                                                        \
        device const uint8_t* w [[buffer(0)]], device const float* x [[buffer(1)]],         \
        device float* y [[buffer(2)]], constant int& rows [[buffer(3)]],                    \
        constant int& cols [[buffer(4)]], constant int& row_bytes [[buffer(5)]],            \
        constant int& n [[buffer(6)]], uint3 group [[threadgroup_position_in_grid]],        \
        uint tid [[thread_index_in_threadgroup]]) {                                         \
        threadgroup TileShared s;                                                           \
        int first = group.x * TILE_TOKENS;                                                  \
        int tokens = min(n - first, TILE_TOKENS);                                           \
        DenseTokens at = {first};                                                           \
        matmul_tile<Format>(w, x, y, rows, cols, row_bytes, tokens, at,                     \
                            (int)group.y * TILE_ROWS, tid, s);                              \
    }                                                                                       \
    kernel void matmul_tiles_experts_##name(                                                \
        device const uint8_t* w [[buffer(0)]], device const uint32_t* offsets [[buffer(1)]], \
        device const float* x [[buffer(2)]], device float* y [[buffer(3)]],                 \
        constant int& rows [[buffer(4)]], constant int& cols [[buffer(5)]],                 \
        constant int& row_bytes [[buffer(6)]], device const uint32_t* pairs [[buffer(7)]],  \
        device const uint32_t* tiles [[buffer(8)]], constant int& divisor [[buffer(9)]],    \
        uint3 group [[threadgroup_position_in_grid]],                                       \
        uint tid [[thread_index_in_threadgroup]]) {                                         \
        threadgroup TileShared s;                                                           \
        device const uint32_t* tile = tiles + 4 * group.x;                                  \
        int count = (int)tile[2];                                                           \
        if (count == 0 || offsets[tile[0]] == NO_EXPERT) return; /* the whole threadgroup */ \
        PairTokens at = {pairs, tile, divisor};                                             \
        matmul_tile<Format>(w + offsets[tile[0]], x, y, rows, cols, row_bytes, count, at,   \
                            (int)group.y * TILE_ROWS, tid, s);                              \
    }
FOR_EACH_FORMAT(MATMUL_TILES)
