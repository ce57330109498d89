// Mixture-of-experts layers around the products of matmul.metal's matmul_experts:
// route_tokens chooses each token's experts and weights from its router logits, group_pairs
// sorts the (token, expert) pairs by expert and cuts each expert's run into tiles of
// products, and after the products add_expert_biases adds each pair's expert's bias and
// combine_experts sums each token's pairs by their weights. Pair `t * top_k + j` is token t's
// j-th expert.

#include "tallow.h"

// The most experts a token may choose.
#define MAX_TOP_K 32

// One thread per token of `n`: its `top_k` experts, largest logit first (ties to the lower
// index), as tallow_backend::Routing::route chooses them, and their weights: the softmax of
// the chosen logits among themselves, or (softmax_all) their share of a softmax over all
// experts.
kernel void route_tokens(device const float* logits [[buffer(0)]],
                         device uint32_t* chosen [[buffer(1)]],
                         device float* weights [[buffer(2)]], constant int& n [[buffer(3)]],
                         constant int& experts [[buffer(4)]], constant int& top_k [[buffer(5)]],
                         constant int& softmax_all [[buffer(6)]],
                         uint i [[thread_position_in_grid]]) {
    int t = (int)i;
    if (t >= n) return;
    device const float* l = logits + (size_t)t * experts;
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
        for (int e = 0; e < experts; ++e) total += precise::exp(l[e] - largest);
    } else {
        for (int j = 0; j < top_k; ++j) total += precise::exp(l[best[j]] - largest);
    }
    for (int j = 0; j < top_k; ++j) {
        chosen[t * top_k + j] = best[j];
        weights[t * top_k + j] = precise::exp(l[best[j]] - largest) / total;
    }
}

// One thread: a counting sort of the `n_pairs` pairs by expert (in token order within an
// expert) into `pairs`, then each expert's run cut into tiles of `per_tile` pairs, written
// as (expert, first index in pairs, count, 0); the tiles past the last, up to `n_tiles`, are
// empty. `starts` holds experts + 1 counts.
kernel void group_pairs(device const uint32_t* chosen [[buffer(0)]],
                        device uint32_t* pairs [[buffer(1)]],
                        device uint32_t* starts [[buffer(2)]],
                        device uint32_t* tiles [[buffer(3)]], constant int& n_pairs [[buffer(4)]],
                        constant int& experts [[buffer(5)]], constant int& per_tile [[buffer(6)]],
                        constant int& n_tiles [[buffer(7)]],
                        uint i [[thread_position_in_grid]]) {
    if (i != 0) return;
    for (int e = 0; e <= experts; ++e) starts[e] = 0;
    for (int p = 0; p < n_pairs; ++p) starts[chosen[p] + 1] += 1;
    int tile = 0;
    for (int e = 0; e < experts; ++e) {
        uint32_t first = starts[e], count = starts[e + 1];
        for (uint32_t s = 0; s < count; s += per_tile) {
            device uint32_t* out = tiles + 4 * tile++;
            out[0] = (uint32_t)e;
            out[1] = first + s;
            out[2] = count - s < (uint32_t)per_tile ? count - s : (uint32_t)per_tile;
            out[3] = 0;
        }
        starts[e + 1] = first + count;
    }
    for (; tile < n_tiles; ++tile) {
        for (int k = 0; k < 4; ++k) tiles[4 * tile + k] = 0;
    }
    // starts[e] is where expert e's next pair goes, until its run is full.
    for (int p = 0; p < n_pairs; ++p) pairs[starts[chosen[p]]++] = (uint32_t)p;
}

// Each of the `n` values of the pairs' rows (`width` each) plus its pair's expert's bias
// (`biases`: every expert's, `width` each).
kernel void add_expert_biases(device float* rows [[buffer(0)]],
                              device const float* biases [[buffer(1)]],
                              device const uint32_t* chosen [[buffer(2)]],
                              constant int& n [[buffer(3)]], constant int& width [[buffer(4)]],
                              uint i [[thread_position_in_grid]]) {
    if ((int)i < n) rows[i] += biases[(size_t)chosen[i / width] * width + i % width];
}

// Each of the `n` values of the output (rows of `width`): the weighted sum of its token's
// `top_k` pairs' values.
kernel void combine_experts(device float* out [[buffer(0)]], device const float* rows [[buffer(1)]],
                            device const float* weights [[buffer(2)]],
                            constant int& n [[buffer(3)]], constant int& width [[buffer(4)]],
                            constant int& top_k [[buffer(5)]],
                            uint i [[thread_position_in_grid]]) {
    if ((int)i >= n) return;
    int t = i / width, c = i % width;
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) {
        int pair = t * top_k + j;
        sum += weights[pair] * rows[(size_t)pair * width + c];
    }
    out[i] = sum;
}
