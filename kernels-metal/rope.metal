// Rotary position embedding.

#include "tallow.h"

// Rotates each head (`head_dim` values, `row_len / head_dim` heads a row) of each token's row
// of `x` (one threadgroup per token) by the token's angles: `angles` holds, per token, a
// cosine and a sine for each of `pairs` rotated pairs (scaled, as the host's Rope::angles
// gives them). Pair `p` is dimensions (2p, 2p + 1) where `halves` is 0, (p, p + pairs)
// otherwise; dimensions past the pairs are kept.
kernel void rope(device float* x [[buffer(0)]], device const float* angles [[buffer(1)]],
                 constant int& row_len [[buffer(2)]], constant int& head_dim [[buffer(3)]],
                 constant int& pairs [[buffer(4)]], constant int& halves [[buffer(5)]],
                 uint token [[threadgroup_position_in_grid]],
                 uint tid [[thread_index_in_threadgroup]],
                 uint threads [[threads_per_threadgroup]]) {
    device float* row = x + (size_t)token * row_len;
    device const float* cs = angles + (size_t)token * 2 * pairs;
    int heads = row_len / head_dim;
    for (int i = tid; i < heads * pairs; i += threads) {
        int head = i / pairs, pair = i % pairs;
        device float* h = row + head * head_dim;
        int a = halves ? pair : 2 * pair, b = halves ? pair + pairs : 2 * pair + 1;
        float c = cs[2 * pair], s = cs[2 * pair + 1];
        float va = h[a], vb = h[b];
        h[a] = va * c - vb * s;
        h[b] = va * s + vb * c;
    }
}
