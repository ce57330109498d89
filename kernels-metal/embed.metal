// Embedding: rows of a weight matrix in any format, by token id.

#include "tallow.h"

// Row ids[t] of `w` (rows of `row_bytes`, `cols` values) times `scale`, into row t of `out`
// (one threadgroup per id).
template <class Format>
inline void embed(device const uint8_t* w, device const int* ids, int cols, int row_bytes,
                  float scale, device float* out, uint token, uint tid, uint threads) {
    device const uint8_t* row = w + (size_t)ids[token] * row_bytes;
    device float* dst = out + (size_t)token * cols;
    float values[32];
    for (int r = tid; r < cols / 32; r += threads) {
        Format::run(row, r, values);
        for (int i = 0; i < 32; ++i) dst[32 * r + i] = values[i] * scale;
    }
}

#define EMBED(name, Format)                                                                 \
    kernel void embed_##name(                                                               \
        device const uint8_t* w [[buffer(0)]], device const int* ids [[buffer(1)]],         \
        constant int& cols [[buffer(2)]], constant int& row_bytes [[buffer(3)]],            \
        constant float& scale [[buffer(4)]], device float* out [[buffer(5)]],               \
        uint token [[threadgroup_position_in_grid]],                                        \
        uint tid [[thread_index_in_threadgroup]],                                           \
        uint threads [[threads_per_threadgroup]]) {                                         \
        embed<Format>(w, ids, cols, row_bytes, scale, out, token, tid, threads);            \
    }
FOR_EACH_FORMAT(EMBED)
