// What the LM head's rows go through: the rows that produce logits, soft caps, the token drawn
// from each row.

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

// The first of the threadgroup's pairs (best, best_i) by `before`, in every thread, through
// 32 values and 32 indices of the threadgroup's memory. Every thread must call it.
inline void group_first(thread float& best, thread uint32_t& best_i, threadgroup float* values,
                        threadgroup uint32_t* indices, uint tid, uint threads) {
    for (ushort mask = 16; mask > 0; mask >>= 1) {
        float v = simd_shuffle_xor(best, mask);
        uint32_t i = simd_shuffle_xor(best_i, mask);
        if (before(v, i, best, best_i)) {
            best = v;
            best_i = i;
        }
    }
    uint lane = tid % 32, simd = tid / 32;
    threadgroup_barrier(mem_flags::mem_threadgroup);  // an earlier call's values have been read
    if (lane == 0) {
        values[simd] = best;
        indices[simd] = best_i;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    best = values[0];
    best_i = indices[0];
    for (uint s = 1; s < threads / 32; ++s) {
        if (before(values[s], indices[s], best, best_i)) {
            best = values[s];
            best_i = indices[s];
        }
    }
}

// The index of the row's largest value (the first on ties), skipping NaN; the last index when
// every value is NaN (tallow_backend::argmax's rule): in every thread, through group_first's
// threadgroup memory. Every thread must call it.
inline uint32_t row_argmax(device const float* row, int width, threadgroup float* values,
                           threadgroup uint32_t* indices, uint tid, uint threads) {
    const uint32_t none = 0xffffffffu;
    float best = -INFINITY;
    uint32_t best_i = none;
    for (int i = tid; i < width; i += threads) {
        if (before(row[i], (uint32_t)i, best, best_i)) {
            best = row[i];
            best_i = (uint32_t)i;
        }
    }
    group_first(best, best_i, values, indices, tid, threads);
    return best_i == none ? (uint32_t)(width - 1) : best_i;
}

// Whether a logit may be drawn: neither NaN nor -inf (a banned token).
inline bool drawable(float l) { return !isnan(l) && l != -INFINITY; }

// A key whose unsigned order is the values' order (-0 taken as +0, as comparisons take it).
inline uint32_t order_key(float v) {
    uint32_t bits = as_type<uint32_t>(v + 0.0f);
    return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// The largest order key k such that the values of `row` (divided by t) with keys k and above
// weigh at least `target`, found bit by bit, each bit a threadgroup sum through `partial`:
// each value weighs w[i] where w is given (-1 for none), one where it is drawable otherwise.
// In every thread; every thread must call it.
inline uint32_t key_reaching(device const float* row, device const float* w, int width, float t,
                             float target, threadgroup float* partial, uint tid, uint threads) {
    uint32_t key = 0;
    for (int bit = 31; bit >= 0; --bit) {
        uint32_t candidate = key | (1u << bit);
        float sum = 0.0f;
        for (int i = tid; i < width; i += threads) {
            float weight = w ? w[i] : (drawable(row[i]) ? 1.0f : -1.0f);
            if (weight >= 0.0f && order_key(row[i] / t) >= candidate) sum += weight;
        }
        if (group_sum(sum, partial, tid, threads) >= target) key = candidate;
    }
    return key;
}

// The Gumbel noise of token i under `seed` (tallow_backend::noise).
inline float gumbel(ulong seed, uint32_t i) {
    ulong z = seed ^ ((ulong)i + 1) * 0x9e3779b97f4a7c15ul;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ul;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebul;
    z ^= z >> 31;
    float u = ((float)(uint32_t)(z >> 41) + 0.5f) * (1.0f / 8388608.0f);
    return -precise::log(-precise::log(u));
}

// tokens[r] = the token drawn from row r of `x` (rows of `width` logits) as tallow_backend::draw
// draws it, by the six words of draws[6r..]: temperature, top_k, top_p and min_p (floats as
// their bits), the seed's low and high halves. A greedy row (temperature 0), one with nothing
// to draw, one holding +inf and one whose filters keep nothing take the row's argmax. The
// filters are thresholds found bit by bit on the values' order keys (32 passes for top-k, 32
// for top-p, each a threadgroup sum: no sort); `weights` holds each row's exp(s - m) for the
// kept tokens, -1 for the others. One threadgroup per row.
kernel void draw_rows(device const float* x [[buffer(0)]], constant int& width [[buffer(1)]],
                      device const uint32_t* draws [[buffer(2)]],
                      device float* weights [[buffer(3)]], device uint32_t* tokens [[buffer(4)]],
                      uint r [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]],
                      uint threads [[threads_per_threadgroup]]) {
    threadgroup float partial[32];
    threadgroup uint32_t indices[32];
    device const float* row = x + (size_t)r * width;
    device float* w = weights + (size_t)r * width;
    device const uint32_t* d = draws + 6 * r;
    const float t = as_type<float>(d[0]), top_p = as_type<float>(d[2]);
    const float min_p = as_type<float>(d[3]);
    const uint32_t top_k = d[1];
    const ulong seed = (ulong)d[4] | ((ulong)d[5] << 32);
    const uint32_t none = 0xffffffffu;
    float m = -INFINITY, valid = 0.0f;
    if (t > 0.0f) {
        for (int i = tid; i < width; i += threads) {
            if (drawable(row[i])) {
                m = max(m, row[i] / t);
                valid += 1.0f;
            }
        }
    }
    m = group_max(m, partial, tid, threads);
    valid = group_sum(valid, partial, tid, threads);
    if (!(t > 0.0f) || valid == 0.0f || m == INFINITY) {
        uint32_t token = row_argmax(row, width, partial, indices, tid, threads);
        if (tid == 0) tokens[r] = token;
        return;
    }
    // Top-k: the largest key that `top_k` values reach (each drawable value weighs one).
    uint32_t lowest = 0;
    if (top_k > 0 && (float)top_k < valid) {
        lowest = key_reaching(row, nullptr, width, t, top_k, partial, tid, threads);
    }
    // Min-p, and the weights of the tokens kept so far.
    float total = 0.0f;
    for (int i = tid; i < width; i += threads) {
        float s = row[i] / t;
        float e = drawable(row[i]) && order_key(s) >= lowest ? precise::exp(s - m) : -1.0f;
        w[i] = e >= min_p ? e : -1.0f;
        total += max(w[i], 0.0f);
    }
    // Top-p: the largest key whose values and those above hold `top_p` of the weight.
    uint32_t cut = 0;
    if (top_p < 1.0f) {
        const float target = top_p * group_sum(total, partial, tid, threads);
        cut = key_reaching(row, w, width, t, target, partial, tid, threads);
    }
    float best = -INFINITY;
    uint32_t best_i = none;
    for (int i = tid; i < width; i += threads) {
        float s = row[i] / t;
        if (w[i] >= 0.0f && order_key(s) >= cut) {
            float v = s + gumbel(seed, (uint32_t)i);
            if (before(v, (uint32_t)i, best, best_i)) {
                best = v;
                best_i = (uint32_t)i;
            }
        }
    }
    group_first(best, best_i, partial, indices, tid, threads);
    // Nothing kept (values that all overflow to -inf at a temperature near 0): the argmax.
    if (best_i == none) best_i = row_argmax(row, width, partial, indices, tid, threads);
    if (tid == 0) tokens[r] = best_i;
}
