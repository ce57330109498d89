// Causal attention over KV pages of any page format (see kv.metal for their layout).

#include "tallow.h"

// Positions of one tile: one per thread of a threadgroup.
#define TILE 128

// Most dimensions of a head: two per thread.
#define MAX_HEAD_DIM 256

// The threadgroup memory of one attention threadgroup.
struct AttentionShared {
    float query[MAX_HEAD_DIM];
    float weights[TILE];
    uint32_t tile_pages[TILE];
    float partial[32];
};

// Out row t (head h) = softmax(scores) · V over the positions token t sees: its sequence's
// (chunk token_chunks[t], page table tables[table_starts[c]..]) from the first its window
// lets it see up to positions[t]. Scores are q · k * scale, soft-capped where softcap > 0.
// Where has_sinks, head h's logit sinks[h] joins the softmax's denominator and adds no value
// (gpt-oss).
// Threadgroup (t, h) of TILE threads: positions a tile at a time, each SIMD-group scoring 32
// of them (a key a step, read by the whole SIMD-group), each thread holding one position's
// score, a running maximum and sum rescaling the outputs (each thread holds two dimensions
// of them, and sums its dimension of the tile's values).
template <class Kv>
inline void attention(device const float* q, device float* out, device const uint8_t* pages,
                      device const uint32_t* tables, device const uint32_t* table_starts,
                      device const uint32_t* token_chunks, device const uint32_t* positions,
                      int n_head, int n_head_kv, int head_dim, int n_pages, int page_size,
                      float scale, float softcap, int window, device const float* sinks,
                      int has_sinks, threadgroup AttentionShared& shared, int t, int h,
                      uint tid) {
    int kvh = h / (n_head / n_head_kv);
    int pos = positions[t];
    int first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    device const uint32_t* table = tables + table_starts[token_chunks[t]];
    size_t row_bytes = Kv::row_bytes(head_dim), block = (size_t)page_size * row_bytes;
    device const uint8_t* keys = pages + (size_t)kvh * n_pages * block;
    device const uint8_t* values = keys + (size_t)n_head_kv * n_pages * block;
    for (int d = tid; d < head_dim; d += TILE) {
        shared.query[d] = q[((size_t)t * n_head + h) * head_dim + d];
    }
    float running_max = -INFINITY, running_sum = 0.0f, acc[2] = {0.0f, 0.0f};
    for (int start = first; start <= pos; start += TILE) {
        int p = start + tid;
        // The last tile's query, weights and pages have been read.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (p <= pos) shared.tile_pages[tid] = table[p / page_size];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // SIMD-group s scores positions start + 32 s + j, its lanes splitting each key's
        // dimensions (neighbouring lanes read neighbouring values); lane j keeps the score.
        uint lane = tid % 32, simd = tid / 32;
        float score = -INFINITY;
        for (int j = 0; j < 32; ++j) {
            int pj = start + 32 * (int)simd + j;
            if (pj > pos) break;  // the whole SIMD-group
            device const uint8_t* key = keys + shared.tile_pages[32 * simd + j] * block +
                                        (size_t)(pj % page_size) * row_bytes;
            float dot = 0.0f;
            for (int d = lane; d < head_dim; d += 32) dot += shared.query[d] * Kv::at(key, d);
            dot = simd_sum(dot);
            if ((int)lane == j) score = dot * scale;
        }
        if (p <= pos && softcap > 0.0f) score = softcap * precise::tanh(score / softcap);
        float new_max = max(running_max, group_max(score, shared.partial, tid, TILE));
        float correction = precise::exp(running_max - new_max);
        float w = p <= pos ? precise::exp(score - new_max) : 0.0f;
        shared.weights[tid] = w;
        running_sum = running_sum * correction + group_sum(w, shared.partial, tid, TILE);
        running_max = new_max;
        int n = pos - start + 1 < TILE ? pos - start + 1 : TILE;
        for (int i = 0; i < 2; ++i) {
            int d = tid + i * TILE;
            if (d >= head_dim) break;
            float sum = 0.0f;
            for (int j = 0; j < n; ++j) {
                int pj = start + j;
                device const uint8_t* value =
                    values + shared.tile_pages[j] * block + (size_t)(pj % page_size) * row_bytes;
                sum += shared.weights[j] * Kv::at(value, d);
            }
            acc[i] = acc[i] * correction + sum;
        }
    }
    // With a sink: acc / (sum + exp(sink - max)), rescaled to the larger of the two maxima.
    float rescale = 1.0f;
    if (has_sinks) {
        float sink = sinks[h], m = max(running_max, sink);
        rescale = precise::exp(running_max - m);
        running_sum = running_sum * rescale + precise::exp(sink - m);
    }
    for (int i = 0; i < 2; ++i) {
        int d = tid + i * TILE;
        if (d < head_dim) {
            out[((size_t)t * n_head + h) * head_dim + d] = acc[i] * rescale / running_sum;
        }
    }
}

#define ATTENTION(name, Kv)                                                                 \
    kernel void attention_##name(                                                           \
        device const float* q [[buffer(0)]], device float* out [[buffer(1)]],               \
        device const uint8_t* pages [[buffer(2)]], device const uint32_t* tables [[buffer(3)]], \
        device const uint32_t* table_starts [[buffer(4)]],                                  \
        device const uint32_t* token_chunks [[buffer(5)]],                                  \
        device const uint32_t* positions [[buffer(6)]], constant int& n_head [[buffer(7)]], \
        constant int& n_head_kv [[buffer(8)]], constant int& head_dim [[buffer(9)]],        \
        constant int& n_pages [[buffer(10)]], constant int& page_size [[buffer(11)]],       \
        constant float& scale [[buffer(12)]], constant float& softcap [[buffer(13)]],       \
        constant int& window [[buffer(14)]], device const float* sinks [[buffer(15)]],      \
        constant int& has_sinks [[buffer(16)]], uint3 group [[threadgroup_position_in_grid]], \
        uint tid [[thread_index_in_threadgroup]]) {                                         \
        threadgroup AttentionShared shared;                                                 \
        attention<Kv>(q, out, pages, tables, table_starts, token_chunks, positions, n_head, \
                      n_head_kv, head_dim, n_pages, page_size, scale, softcap, window,      \
                      sinks, has_sinks, shared, group.x, group.y, tid);                      \
    }
FOR_EACH_KV_FORMAT(ATTENTION)
