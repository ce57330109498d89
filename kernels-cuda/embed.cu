// Embedding: rows of a weight matrix in any format, by token id.

#include "tallow.cuh"
#include "formats.h"

// Row ids[t] of `w` (rows of `row_bytes`, `cols` values) times `scale`, into row t of `out`
// (one block per id).
template <class Format>
__device__ void embed(const uint8_t* w, const int* ids, int cols, int row_bytes, float scale,
                      float* out) {
    const uint8_t* row = w + (size_t)ids[blockIdx.x] * row_bytes;
    float* dst = out + (size_t)blockIdx.x * cols;
    float values[32];
    for (int r = threadIdx.x; r < cols / 32; r += blockDim.x) {
        Format::run(row, r, values);
        for (int i = 0; i < 32; ++i) dst[32 * r + i] = values[i] * scale;
    }
}

#define EMBED(name, Format)                                                                \
    extern "C" __global__ void embed_##name(const uint8_t* w, const int* ids, int cols,    \
                                            int row_bytes, float scale, float* out) {      \
        embed<Format>(w, ids, cols, row_bytes, scale, out);                                 \
    }                                                                                      \
    TALLOW_EXPORT(embed_##name)
FOR_EACH_FORMAT(EMBED)
