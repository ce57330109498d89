// What the LM head's rows go through: the rows that produce logits, soft caps, greedy choice.

#include "tallow.h"

// Row rows[i] of `x` (rows of `width`) into row i of `out`. One threadgroup per row.
kernel void gather_rows(device const float* x [[buffer(0)]],
                        device const uint32_t* rows [[buffer(1)]],
                        device float* out [[buffer(2)]], constant int& width [[buffer(3)]],
                        uint row [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint threads [[threads_per_threadgroup]]) {
    device const float* src = x + (size_t)rows[row] * width;
    for (int i = tid; i < width; i += threads) out[(size_t)row * width + i] = src[i];
}

// x = cap * tanh(x / cap) for `n` values.
kernel void softcap(device float* x [[buffer(0)]], constant int& n [[buffer(1)]],
                    constant float& cap [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if ((int)i < n) x[i] = cap * precise::tanh(x[i] / cap);
}

// Whether (v, i) comes before (best, best_i): a larger value, or the same at a lower index.
// NaN never comes first.
inline bool before(float v, uint32_t i, float best, uint32_t best_i) {
    return v > best || (v == best && i < best_i);
}

// tokens[r] = the index of row r's largest value (the first on ties), skipping NaN; the last
// index when every value is NaN (tallow_backend::argmax's rule). One threadgroup per row.
kernel void argmax_rows(device const float* x [[buffer(0)]], constant int& width [[buffer(1)]],
                        device uint32_t* tokens [[buffer(2)]],
                        uint row [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint threads [[threads_per_threadgroup]]) {
    threadgroup float simd_best[32];
    threadgroup uint32_t simd_index[32];
    device const float* src = x + (size_t)row * width;
    const uint32_t none = 0xffffffffu;
    float best = -INFINITY;
    uint32_t best_i = none;
    for (int i = tid; i < width; i += threads) {
        if (before(src[i], (uint32_t)i, best, best_i)) {
            best = src[i];
            best_i = (uint32_t)i;
        }
    }
    for (ushort mask = 16; mask > 0; mask >>= 1) {
        float v = simd_shuffle_xor(best, mask);
        uint32_t i = simd_shuffle_xor(best_i, mask);
        if (before(v, i, best, best_i)) {
            best = v;
            best_i = i;
        }
    }
    uint lane = tid % 32, simd = tid / 32;
    if (lane == 0) {
        simd_best[simd] = best;
        simd_index[simd] = best_i;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        for (uint s = 1; s < threads / 32; ++s) {
            if (before(simd_best[s], simd_index[s], best, best_i)) {
                best = simd_best[s];
                best_i = simd_index[s];
            }
        }
        tokens[row] = best_i == none ? (uint32_t)(width - 1) : best_i;
    }
}
