// Mixture-of-experts layers around the products of matmul.cu's matmul_experts: route_tokens
// chooses each token's experts and weights from its router logits, group_pairs sorts the
// (token, expert) pairs by expert and cuts each expert's run into tiles of products, and after
// the products add_expert_biases adds each pair's expert's bias and combine_experts sums each
// token's pairs by their weights. Pair `t * top_k + j` is token t's j-th expert.

#include "tallow.cuh"

// The most experts a token may choose.
#define MAX_TOP_K 32

// One thread per token of `n`: its `top_k` experts, largest logit first (ties to the lower
// index), as tallow_backend::Routing::route chooses them, and their weights: the softmax of the
// chosen logits among themselves, or (softmax_all) their share of a softmax over all experts.
extern "C" __global__ void route_tokens(const float* logits, uint32_t* chosen, float* weights,
                                        int n, int experts, int top_k, int softmax_all) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const float* l = logits + (size_t)t * experts;
    uint32_t best[MAX_TOP_K];
    int kept = 0;
    for (int e = 0; e < experts; ++e) {
        int at = kept;
        while (at > 0 && l[best[at - 1]] < l[e]) --at;
        if (at == top_k) continue;
        int end = kept + 1 < top_k ? kept + 1 : top_k;
        for (int j = end - 1; j > at; --j) best[j] = best[j - 1];
        best[at] = (uint32_t)e;
        kept = end;
    }
    float largest = l[best[0]], total = 0.0f;
    if (softmax_all) {
        for (int e = 0; e < experts; ++e) total += expf(l[e] - largest);
    } else {
        for (int j = 0; j < top_k; ++j) total += expf(l[best[j]] - largest);
    }
    for (int j = 0; j < top_k; ++j) {
        chosen[t * top_k + j] = best[j];
        weights[t * top_k + j] = expf(l[best[j]] - largest) / total;
    }
}
TALLOW_EXPORT(route_tokens)

// One thread: a counting sort of the `n_pairs` pairs by expert (in token order within an
// expert) into `pairs`, then each expert's run cut into tiles of `per_tile` pairs, written
// as (expert, first index in pairs, count, 0); the tiles past the last, up to `n_tiles`, are
// empty. `starts` holds experts + 1 counts.
extern "C" __global__ void group_pairs(const uint32_t* chosen, uint32_t* pairs, uint32_t* starts,
                                       uint32_t* tiles, int n_pairs, int experts, int per_tile,
                                       int n_tiles) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int e = 0; e <= experts; ++e) starts[e] = 0;
    for (int i = 0; i < n_pairs; ++i) starts[chosen[i] + 1] += 1;
    int tile = 0;
    for (int e = 0; e < experts; ++e) {
        uint32_t first = starts[e], count = starts[e + 1];
        for (uint32_t s = 0; s < count; s += per_tile) {
            uint32_t* out = tiles + 4 * tile++;
            out[0] = (uint32_t)e;
            out[1] = first + s;
            out[2] = count - s < (uint32_t)per_tile ? count - s : (uint32_t)per_tile;
            out[3] = 0;
        }
        starts[e + 1] = first + count;
    }
    for (; tile < n_tiles; ++tile)
        for (int i = 0; i < 4; ++i) tiles[4 * tile + i] = 0;
    // starts[e] is where expert e's next pair goes, until its run is full.
    for (int i = 0; i < n_pairs; ++i) pairs[starts[chosen[i]]++] = (uint32_t)i;
}
TALLOW_EXPORT(group_pairs)

// Each of the `n` values of the pairs' rows (`width` each) plus its pair's expert's bias
// (`biases`: every expert's, `width` each).
extern "C" __global__ void add_expert_biases(float* rows, const float* biases,
                                             const uint32_t* chosen, int n, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) rows[i] += biases[(size_t)chosen[i / width] * width + i % width];
}
TALLOW_EXPORT(add_expert_biases)

// Each of the `n` values of the output (rows of `width`): the weighted sum of its token's
// `top_k` pairs' values.
extern "C" __global__ void combine_experts(float* out, const float* rows, const float* weights,
                                           int n, int width, int top_k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int t = i / width, c = i % width;
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) {
        int pair = t * top_k + j;
        sum += weights[pair] * rows[(size_t)pair * width + c];
    }
    out[i] = sum;
}
TALLOW_EXPORT(combine_experts)
