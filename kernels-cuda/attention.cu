// Causal attention over KV pages of any page format (see kv.cu for their layout).

#include "tallow.cuh"
#include "formats.h"

// Positions of one tile: one per thread of a block.
#define TILE 128

// Most dimensions of a head: two per thread.
#define MAX_HEAD_DIM 256

// Out row t (head h) = softmax(scores) · V over the positions token t sees: its sequence's
// (chunk token_chunks[t], page table tables[table_starts[c]..]) from the first its window
// lets it see up to positions[t]. Scores are q · k * scale, soft-capped where softcap > 0.
// Where has_sinks, head h's logit sinks[h] joins the softmax's denominator and adds no value
// (gpt-oss).
// Block (t, h, z) of TILE threads: positions a tile at a time, each thread one position's
// score, a running maximum and sum rescaling the outputs (each thread holds two dimensions).
// Where n_splits > 1 (a step of few tokens over long contexts: too few blocks to fill the
// GPU otherwise), block z takes the `span` positions from the first's z * span on and
// writes its maximum, its sum and its unscaled outputs to `partials` (head_dim + 2 values
// per (t, h, z)), which attention_merge combines.
template <class Kv>
__device__ void attention(const float* q, float* out, const uint8_t* pages,
                          const uint32_t* tables, const uint32_t* table_starts,
                          const uint32_t* token_chunks, const uint32_t* positions, int n_head,
                          int n_head_kv, int head_dim, int n_pages, int page_size, float scale,
                          float softcap, int window, const float* sinks, int has_sinks, int span,
                          int n_splits, float* partials) {
    __shared__ float query[MAX_HEAD_DIM];
    __shared__ float weights[TILE];
    __shared__ uint32_t tile_pages[TILE];
    int t = blockIdx.x, h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    int pos = positions[t];
    int first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    // This block's positions: first..=last (none where the token sees fewer).
    first += blockIdx.z * span;
    int last = n_splits > 1 && first + span - 1 < pos ? first + span - 1 : pos;
    const uint32_t* table = tables + table_starts[token_chunks[t]];
    size_t row_bytes = Kv::row_bytes(head_dim), block = (size_t)page_size * row_bytes;
    const uint8_t* keys = pages + (size_t)kvh * n_pages * block;
    const uint8_t* values = keys + (size_t)n_head_kv * n_pages * block;
    for (int d = threadIdx.x; d < head_dim; d += TILE)
        query[d] = q[((size_t)t * n_head + h) * head_dim + d];
    float running_max = -INFINITY, running_sum = 0.0f, acc[2] = {0.0f, 0.0f};
    for (int start = first; start <= last; start += TILE) {
        int p = start + threadIdx.x;
        __syncthreads();  // the last tile's query, weights and pages have been read
        float score = -INFINITY;
        if (p <= last) {
            uint32_t page = table[p / page_size];
            tile_pages[threadIdx.x] = page;
            const uint8_t* key = keys + page * block + (size_t)(p % page_size) * row_bytes;
            float dot = 0.0f;
            for (int d = 0; d < head_dim; ++d) dot += query[d] * Kv::at(key, d);
            score = dot * scale;
            if (softcap > 0.0f) score = softcap * tanhf(score / softcap);
        }
        float new_max = fmaxf(running_max, block_max(score));
        float correction = expf(running_max - new_max);
        float w = p <= last ? expf(score - new_max) : 0.0f;
        weights[threadIdx.x] = w;
        running_sum = running_sum * correction + block_sum(w);
        running_max = new_max;
        int n = last - start + 1 < TILE ? last - start + 1 : TILE;
        for (int i = 0; i < 2; ++i) {
            int d = threadIdx.x + i * TILE;
            if (d >= head_dim) break;
            float sum = 0.0f;
            for (int j = 0; j < n; ++j) {
                int pj = start + j;
                const uint8_t* value =
                    values + tile_pages[j] * block + (size_t)(pj % page_size) * row_bytes;
                sum += weights[j] * Kv::at(value, d);
            }
            acc[i] = acc[i] * correction + sum;
        }
    }
    if (n_splits > 1) {
        size_t at = ((size_t)t * n_head + h) * n_splits + blockIdx.z;
        float* partial = partials + at * (head_dim + 2);
        if (threadIdx.x == 0) {
            partial[0] = running_max;
            partial[1] = running_sum;
        }
        for (int i = 0; i < 2; ++i) {
            int d = threadIdx.x + i * TILE;
            if (d < head_dim) partial[2 + d] = acc[i];
        }
        return;
    }
    // With a sink: acc / (sum + exp(sink - max)), rescaled to the larger of the two maxima.
    float rescale = 1.0f;
    if (has_sinks) {
        float sink = sinks[h], m = fmaxf(running_max, sink);
        rescale = expf(running_max - m);
        running_sum = running_sum * rescale + expf(sink - m);
    }
    for (int i = 0; i < 2; ++i) {
        int d = threadIdx.x + i * TILE;
        if (d < head_dim)
            out[((size_t)t * n_head + h) * head_dim + d] = acc[i] * rescale / running_sum;
    }
}

// Out row t (head h) from the n_splits partial results of attention's blocks (t, h, z): each
// split's sum and outputs rescaled to the largest maximum, a sink joining the sum as above.
// Block (t, h) of TILE threads.
extern "C" __global__ void __launch_bounds__(TILE)
    attention_merge(const float* partials, float* out, int n_head, int head_dim, int n_splits,
                    const float* sinks, int has_sinks) {
    int t = blockIdx.x, h = blockIdx.y;
    size_t at = ((size_t)t * n_head + h) * n_splits;
    const float* partial = partials + at * (head_dim + 2);
    float m = has_sinks ? sinks[h] : -INFINITY;
    for (int z = 0; z < n_splits; ++z) m = fmaxf(m, partial[z * (head_dim + 2)]);
    float sum = has_sinks ? expf(sinks[h] - m) : 0.0f;
    for (int z = 0; z < n_splits; ++z) {
        const float* split = partial + z * (head_dim + 2);
        if (split[1] > 0.0f) sum += split[1] * expf(split[0] - m);
    }
    for (int d = threadIdx.x; d < head_dim; d += TILE) {
        float value = 0.0f;
        for (int z = 0; z < n_splits; ++z) {
            const float* split = partial + z * (head_dim + 2);
            if (split[1] > 0.0f) value += split[2 + d] * expf(split[0] - m);
        }
        out[((size_t)t * n_head + h) * head_dim + d] = value / sum;
    }
}
TALLOW_EXPORT(attention_merge)

#define ATTENTION(name, Kv)                                                                    \
    extern "C" __global__ void __launch_bounds__(TILE) attention_##name(                       \
        const float* q, float* out, const uint8_t* pages, const uint32_t* tables,              \
        const uint32_t* table_starts, const uint32_t* token_chunks, const uint32_t* positions, \
        int n_head, int n_head_kv, int head_dim, int n_pages, int page_size, float scale,      \
        float softcap, int window, const float* sinks, int has_sinks, int span, int n_splits,  \
        float* partials) {                                                                     \
        attention<Kv>(q, out, pages, tables, table_starts, token_chunks, positions, n_head,    \
                      n_head_kv, head_dim, n_pages, page_size, scale, softcap, window, sinks,  \
                      has_sinks, span, n_splits, partials);                                    \
    }                                                                                          \
    TALLOW_EXPORT(attention_##name)
FOR_EACH_KV_FORMAT(ATTENTION)
