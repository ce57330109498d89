// What the LM head's rows go through: the rows that produce logits, soft caps, greedy choice.

#include "tallow.cuh"

// Row rows[i] of `x` (rows of `width`) into row i of `out`. One block per row.
extern "C" __global__ void gather_rows(const float* x, const uint32_t* rows, float* out,
                                       int width) {
    const float* src = x + (size_t)rows[blockIdx.x] * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) out[(size_t)blockIdx.x * width + i] = src[i];
}
TALLOW_EXPORT(gather_rows)

// x = cap * tanh(x / cap) for `n` values.
extern "C" __global__ void softcap(float* x, int n, float cap) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}
TALLOW_EXPORT(softcap)

// Whether (v, i) comes before (best, best_i): a larger value, or the same at a lower index.
// NaN never comes first.
__device__ __forceinline__ bool before(float v, uint32_t i, float best, uint32_t best_i) {
    return v > best || (v == best && i < best_i);
}

// tokens[r] = the index of row r's largest value (the first on ties), skipping NaN; the last
// index when every value is NaN (tallow_backend::argmax's rule). One block per row.
extern "C" __global__ void argmax_rows(const float* x, int width, uint32_t* tokens) {
    const float* row = x + (size_t)blockIdx.x * width;
    const uint32_t none = 0xffffffffu;
    float best = -INFINITY;
    uint32_t best_i = none;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        if (before(row[i], (uint32_t)i, best, best_i)) {
            best = row[i];
            best_i = (uint32_t)i;
        }
    }
    for (int mask = 16; mask > 0; mask >>= 1) {
        float v = __shfl_xor_sync(FULL_WARP, best, mask);
        uint32_t i = __shfl_xor_sync(FULL_WARP, best_i, mask);
        if (before(v, i, best, best_i)) {
            best = v;
            best_i = i;
        }
    }
    __shared__ float warp_best[32];
    __shared__ uint32_t warp_index[32];
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        warp_best[warp] = best;
        warp_index[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned w = 1; w < blockDim.x / 32; ++w) {
            if (before(warp_best[w], warp_index[w], best, best_i)) {
                best = warp_best[w];
                best_i = warp_index[w];
            }
        }
        tokens[blockIdx.x] = best_i == none ? (uint32_t)(width - 1) : best_i;
    }
}
TALLOW_EXPORT(argmax_rows)
