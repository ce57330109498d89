// What the LM head's rows go through: the rows that produce logits, soft caps, the token drawn
// from each row.

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

// The first of the block's pairs (best, best_i) by `before`, in every thread. Every thread of
// the block must call it.
__device__ __forceinline__ void block_first(float& best, uint32_t& best_i) {
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
    __syncthreads();  // an earlier call's values have been read
    if (lane == 0) {
        warp_best[warp] = best;
        warp_index[warp] = best_i;
    }
    __syncthreads();
    best = warp_best[0];
    best_i = warp_index[0];
    for (unsigned w = 1; w < blockDim.x / 32; ++w) {
        if (before(warp_best[w], warp_index[w], best, best_i)) {
            best = warp_best[w];
            best_i = warp_index[w];
        }
    }
}

// The index of the row's largest value (the first on ties), skipping NaN; the last index when
// every value is NaN (tallow_backend::argmax's rule): in every thread. Every thread of the
// block must call it.
__device__ __forceinline__ uint32_t row_argmax(const float* row, int width) {
    const uint32_t none = 0xffffffffu;
    float best = -INFINITY;
    uint32_t best_i = none;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        if (before(row[i], (uint32_t)i, best, best_i)) {
            best = row[i];
            best_i = (uint32_t)i;
        }
    }
    block_first(best, best_i);
    return best_i == none ? (uint32_t)(width - 1) : best_i;
}

// Whether a logit may be drawn: neither NaN nor -inf (a banned token).
__device__ __forceinline__ bool drawable(float l) { return !isnan(l) && l != -INFINITY; }

// A key whose unsigned order is the values' order (-0 taken as +0, as comparisons take it).
__device__ __forceinline__ uint32_t order_key(float v) {
    uint32_t bits = __float_as_uint(v + 0.0f);
    return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// The largest order key k such that the values of `row` (divided by t) with keys k and above
// weigh at least `target`, found bit by bit, each bit a block sum: each value weighs w[i]
// where w is given (-1 for none), one where it is drawable otherwise. In every thread; every
// thread of the block must call it.
__device__ uint32_t key_reaching(const float* row, const float* w, int width, float t,
                                 float target) {
    uint32_t key = 0;
    for (int bit = 31; bit >= 0; --bit) {
        uint32_t candidate = key | (1u << bit);
        float sum = 0.0f;
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            float weight = w ? w[i] : (drawable(row[i]) ? 1.0f : -1.0f);
            if (weight >= 0.0f && order_key(row[i] / t) >= candidate) sum += weight;
        }
        if (block_sum(sum) >= target) key = candidate;
    }
    return key;
}

// The Gumbel noise of token i under `seed` (tallow_backend::noise).
__device__ __forceinline__ float gumbel(uint64_t seed, uint32_t i) {
    uint64_t z = seed ^ ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float u = ((float)(uint32_t)(z >> 41) + 0.5f) * (1.0f / 8388608.0f);
    return -logf(-logf(u));
}

// tokens[r] = the token drawn from row r of `x` (rows of `width` logits) as tallow_backend::draw
// draws it, by the six words of draws[6r..]: temperature, top_k, top_p and min_p (floats as
// their bits), the seed's low and high halves. A greedy row (temperature 0), one with nothing
// to draw, one holding +inf and one whose filters keep nothing take the row's argmax. The
// filters are thresholds found bit by bit on the values' order keys (32 passes for top-k, 32
// for top-p, each a block sum: no sort); `weights` holds each row's exp(s - m) for the kept
// tokens, -1 for the others. One block per row.
extern "C" __global__ void draw_rows(const float* x, int width, const uint32_t* draws,
                                     float* weights, uint32_t* tokens) {
    const float* row = x + (size_t)blockIdx.x * width;
    float* w = weights + (size_t)blockIdx.x * width;
    const uint32_t* d = draws + 6 * blockIdx.x;
    const float t = __uint_as_float(d[0]), top_p = __uint_as_float(d[2]);
    const float min_p = __uint_as_float(d[3]);
    const uint32_t top_k = d[1];
    const uint64_t seed = (uint64_t)d[4] | ((uint64_t)d[5] << 32);
    const uint32_t none = 0xffffffffu;
    float m = -INFINITY, valid = 0.0f;
    if (t > 0.0f) {
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            if (drawable(row[i])) {
                m = fmaxf(m, row[i] / t);
                valid += 1.0f;
            }
        }
    }
    m = block_max(m);
    valid = block_sum(valid);
    if (!(t > 0.0f) || valid == 0.0f || m == INFINITY) {
        uint32_t token = row_argmax(row, width);
        if (threadIdx.x == 0) tokens[blockIdx.x] = token;
        return;
    }
    // Top-k: the largest key that `top_k` values reach (each drawable value weighs one).
    uint32_t lowest = 0;
    if (top_k > 0 && (float)top_k < valid) lowest = key_reaching(row, nullptr, width, t, top_k);
    // Min-p, and the weights of the tokens kept so far.
    float total = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float s = row[i] / t;
        float e = drawable(row[i]) && order_key(s) >= lowest ? expf(s - m) : -1.0f;
        w[i] = e >= min_p ? e : -1.0f;
        total += fmaxf(w[i], 0.0f);
    }
    // Top-p: the largest key whose values and those above hold `top_p` of the weight.
    uint32_t cut = 0;
    if (top_p < 1.0f) cut = key_reaching(row, w, width, t, top_p * block_sum(total));
    float best = -INFINITY;
    uint32_t best_i = none;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float s = row[i] / t;
        if (w[i] >= 0.0f && order_key(s) >= cut) {
            float v = s + gumbel(seed, (uint32_t)i);
            if (before(v, (uint32_t)i, best, best_i)) {
                best = v;
                best_i = (uint32_t)i;
            }
        }
    }
    block_first(best, best_i);
    // Nothing kept (values that all overflow to -inf at a temperature near 0): the argmax.
    if (best_i == none) best_i = row_argmax(row, width);
    if (threadIdx.x == 0) tokens[blockIdx.x] = best_i;
}
TALLOW_EXPORT(draw_rows)
