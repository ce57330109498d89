// Rotary position embedding.

#include "tallow.cuh"

// Rotates each head (`head_dim` values, `row_len / head_dim` heads a row) of each token's row
// of `x` (one block per token) by the token's angles: `angles` holds, per token, a cosine and
// a sine for each of `pairs` rotated pairs (scaled, as the host's Rope::angles gives them).
// Pair `p` is dimensions (2p, 2p + 1) where `halves` is 0, (p, p + pairs) otherwise;
// dimensions past the pairs are kept.
extern "C" __global__ void rope(float* x, const float* angles, int row_len, int head_dim,
                                int pairs, int halves) {
    float* row = x + (size_t)blockIdx.x * row_len;
    const float* cs = angles + (size_t)blockIdx.x * 2 * pairs;
    int heads = row_len / head_dim;
    for (int i = threadIdx.x; i < heads * pairs; i += blockDim.x) {
        int head = i / pairs, pair = i % pairs;
        float* h = row + head * head_dim;
        int a = halves ? pair : 2 * pair, b = halves ? pair + pairs : 2 * pair + 1;
        float c = cs[2 * pair], s = cs[2 * pair + 1];
        float va = h[a], vb = h[b];
        h[a] = va * c - vb * s;
        h[b] = va * s + vb * c;
    }
}
TALLOW_EXPORT(rope)
