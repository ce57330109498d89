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
// Block (t, h) of TILE threads: positions a tile at a time, each thread one position's score,
// a running maximum and sum rescaling the outputs (each thread holds two dimensions).
template <class Kv>
__device__ void attention(const float* q, float* out, const uint8_t* pages,
                          const uint32_t* tables, const uint32_t* table_starts,
                          const uint32_t* token_chunks, const uint32_t* positions, int n_head,
                          int n_head_kv, int head_dim, int n_pages, int page_size, float scale,
                          float softcap, int window, const float* sinks, int has_sinks) {
    __shared__ float query[MAX_HEAD_DIM];
    __shared__ float weights[TILE];
    __shared__ uint32_t tile_pages[TILE];
    int t = blockIdx.x, h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    int pos = positions[t];
    int first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    const uint32_t* table = tables + table_starts[token_chunks[t]];
    size_t row_bytes = Kv::row_bytes(head_dim), block = (size_t)page_size * row_bytes;
    const uint8_t* keys = pages + (size_t)kvh * n_pages * block;
    const uint8_t* values = keys + (size_t)n_head_kv * n_pages * block;
    for (int d = threadIdx.x; d < head_dim; d += TILE)
        query[d] = q[((size_t)t * n_head + h) * head_dim + d];
    float running_max = -INFINITY, running_sum = 0.0f, acc[2] = {0.0f, 0.0f};
    for (int start = first; start <= pos; start += TILE) {
        int p = start + threadIdx.x;
        __syncthreads();  // the last tile's query, weights and pages have been read
        float score = -INFINITY;
        if (p <= pos) {
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
        float w = p <= pos ? expf(score - new_max) : 0.0f;
        weights[threadIdx.x] = w;
        running_sum = running_sum * correction + block_sum(w);
        running_max = new_max;
        int n = pos - start + 1 < TILE ? pos - start + 1 : TILE;
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

#define ATTENTION(name, Kv)                                                                    \
    extern "C" __global__ void __launch_bounds__(TILE) attention_##name(                       \
        const float* q, float* out, const uint8_t* pages, const uint32_t* tables,              \
        const uint32_t* table_starts, const uint32_t* token_chunks, const uint32_t* positions, \
        int n_head, int n_head_kv, int head_dim, int n_pages, int page_size, float scale,      \
        float softcap, int window, const float* sinks, int has_sinks) {                        \
        attention<Kv>(q, out, pages, tables, table_starts, token_chunks, positions, n_head,    \
                      n_head_kv, head_dim, n_pages, page_size, scale, softcap, window, sinks,  \
                      has_sinks);                                                              \
    }                                                                                          \
    TALLOW_EXPORT(attention_##name)
FOR_EACH_KV_FORMAT(ATTENTION)
