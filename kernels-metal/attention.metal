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
// Threadgroup (t, h, z) of TILE threads: positions a tile at a time, each SIMD-group scoring
// 32 of them (a key a step, read by the whole SIMD-group), each thread holding one position's
// score, a running maximum and sum rescaling the outputs (each thread holds two dimensions
// of them, and sums its dimension of the tile's values). Where n_splits > 1 (a step of few
// tokens over long contexts: too few threadgroups to fill the GPU otherwise), threadgroup z
// takes the `span` positions from the first's z * span on and writes its maximum, its sum
// and its unscaled outputs to `partials` (head_dim + 2 values per (x, h, z)), which
// attention_merge combines. Threadgroup x takes token t = tokens[x] (the launch takes the
// step's tokens that `tokens` lists: those the tiles below do not).
template <class Kv>
inline void attention(device const float* q, device float* out, device const uint8_t* pages,
                      device const uint32_t* tables, device const uint32_t* table_starts,
                      device const uint32_t* token_chunks, device const uint32_t* positions,
                      int n_head, int n_head_kv, int head_dim, int n_pages, int page_size,
                      float scale, float softcap, int window, device const float* sinks,
                      int has_sinks, int span, int n_splits, device float* partials,
                      device const uint32_t* tokens, threadgroup AttentionShared& shared,
                      int x, int h, int z, uint tid) {
    int t = (int)tokens[x], kvh = h / (n_head / n_head_kv);
    int pos = positions[t];
    int first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    // This threadgroup's positions: first..=last (none where the token sees fewer).
    first += z * span;
    int last = n_splits > 1 && first + span - 1 < pos ? first + span - 1 : pos;
    device const uint32_t* table = tables + table_starts[token_chunks[t]];
    size_t row_bytes = Kv::row_bytes(head_dim), block = (size_t)page_size * row_bytes;
    device const uint8_t* keys = pages + (size_t)kvh * n_pages * block;
    device const uint8_t* values = keys + (size_t)n_head_kv * n_pages * block;
    for (int d = tid; d < head_dim; d += TILE) {
        shared.query[d] = q[((size_t)t * n_head + h) * head_dim + d];
    }
    float running_max = -INFINITY, running_sum = 0.0f, acc[2] = {0.0f, 0.0f};
    for (int start = first; start <= last; start += TILE) {
        int p = start + tid;
        // The last tile's query, weights and pages have been read.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (p <= last) shared.tile_pages[tid] = table[p / page_size];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // SIMD-group s scores positions start + 32 s + j, its lanes splitting each key's
        // dimensions (neighbouring lanes read neighbouring values); lane j keeps the score.
        uint lane = tid % 32, simd = tid / 32;
        float score = -INFINITY;
        for (int j = 0; j < 32; ++j) {
            int pj = start + 32 * (int)simd + j;
            if (pj > last) break;  // the whole SIMD-group
            device const uint8_t* key = keys + shared.tile_pages[32 * simd + j] * block +
                                        (size_t)(pj % page_size) * row_bytes;
            float dot = 0.0f;
            for (int d = lane; d < head_dim; d += 32) dot += shared.query[d] * Kv::at(key, d);
            dot = simd_sum(dot);
            if ((int)lane == j) score = dot * scale;
        }
        if (p <= last && softcap > 0.0f) score = softcap * precise::tanh(score / softcap);
        float new_max = max(running_max, group_max(score, shared.partial, tid, TILE));
        float correction = precise::exp(running_max - new_max);
        float w = p <= last ? precise::exp(score - new_max) : 0.0f;
        shared.weights[tid] = w;
        running_sum = running_sum * correction + group_sum(w, shared.partial, tid, TILE);
        running_max = new_max;
        int n = last - start + 1 < TILE ? last - start + 1 : TILE;
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
    if (n_splits > 1) {
        size_t at = ((size_t)x * n_head + h) * n_splits + z;
        device float* partial = partials + at * (head_dim + 2);
        if (tid == 0) {
            partial[0] = running_max;
            partial[1] = running_sum;
        }
        for (int i = 0; i < 2; ++i) {
            int d = tid + i * TILE;
            if (d < head_dim) partial[2 + d] = acc[i];
        }
        return;
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
        constant int& has_sinks [[buffer(16)]], constant int& span [[buffer(17)]],          \
        constant int& n_splits [[buffer(18)]], device float* partials [[buffer(19)]],       \
        device const uint32_t* tokens [[buffer(20)]],                                       \
        uint3 group [[threadgroup_position_in_grid]],                                       \
        uint tid [[thread_index_in_threadgroup]]) {                                         \
        threadgroup AttentionShared shared;                                                 \
        attention<Kv>(q, out, pages, tables, table_starts, token_chunks, positions, n_head, \
                      n_head_kv, head_dim, n_pages, page_size, scale, softcap, window,      \
                      sinks, has_sinks, span, n_splits, partials, tokens, shared, group.x,  \
                      group.y, group.z, tid);                                               \
    }
FOR_EACH_KV_FORMAT(ATTENTION)

// Out row t = tokens[x] (head h) from the n_splits partial results of attention's
// threadgroups (x, h, z): each split's sum and outputs rescaled to the largest maximum, a
// sink joining the sum as above. Threadgroup (x, h) of TILE threads.
kernel void attention_merge(device const float* partials [[buffer(0)]],
                            device float* out [[buffer(1)]], constant int& n_head [[buffer(2)]],
                            constant int& head_dim [[buffer(3)]],
                            constant int& n_splits [[buffer(4)]],
                            device const float* sinks [[buffer(5)]],
                            constant int& has_sinks [[buffer(6)]],
                            device const uint32_t* tokens [[buffer(7)]],
                            uint3 group [[threadgroup_position_in_grid]],
                            uint tid [[thread_index_in_threadgroup]]) {
    int t = (int)tokens[group.x], h = group.y;
    size_t at = ((size_t)group.x * n_head + h) * n_splits;
    device const float* partial = partials + at * (head_dim + 2);
    float m = has_sinks ? sinks[h] : -INFINITY;
    for (int z = 0; z < n_splits; ++z) m = max(m, partial[z * (head_dim + 2)]);
    float sum = has_sinks ? precise::exp(sinks[h] - m) : 0.0f;
    for (int z = 0; z < n_splits; ++z) {
        device const float* split = partial + z * (head_dim + 2);
        if (split[1] > 0.0f) sum += split[1] * precise::exp(split[0] - m);
    }
    for (int d = tid; d < head_dim; d += TILE) {
        float value = 0.0f;
        for (int z = 0; z < n_splits; ++z) {
            device const float* split = partial + z * (head_dim + 2);
            if (split[1] > 0.0f) value += split[2 + d] * precise::exp(split[0] - m);
        }
        out[((size_t)t * n_head + h) * head_dim + d] = value / sum;
    }
}

// ---- Tiles: the attention of prefill steps on the SIMD-groups' matrix units ----
//
// A threadgroup takes up to AttentionShape<D>::ROWS (token, query head) rows: `count`
// consecutive tokens of one chunk (tiles[2 group.x]: the first, tiles[2 group.x + 1]: count;
// the other arguments attention's) by the query heads of KV head group.y, row r being
// token r / group and the group's head r % group. Each SIMD-group takes 8 rows through the
// positions the tile's tokens see, AttentionShape<D>::POSITIONS at a time (flash attention
// 2): S = Q · Kᵀ and O += softmax(S) · V in simdgroup_float8x8 products, the keys
// (transposed), then the values, of those positions in threadgroup memory as f32.

// The shape of a threadgroup for heads of at most D dimensions (64, 128 or 256).
template <int D>
struct AttentionShape {
    enum : int {
        // Rows of a threadgroup, 8 a SIMD-group.
        ROWS = D <= 128 ? 32 : 16,
        // Positions of a pass.
        POSITIONS = 2048 / D,
    };
};

// The threadgroup memory of one tile: the queries (q[r * D + d]; at the end, the outputs),
// the keys (kv[d * POSITIONS + j]) or the values (kv[j * D + d]) of a pass, its scores and
// then weights (s[r * POSITIONS + j]), and for each SIMD-group the 8 x 8 diagonal matrix of
// its rows' rescalings.
template <int D>
struct AttentionTileShared {
    float q[AttentionShape<D>::ROWS * D];
    float kv[AttentionShape<D>::POSITIONS * D];
    float s[AttentionShape<D>::ROWS * AttentionShape<D>::POSITIONS];
    float rescale[AttentionShape<D>::ROWS / 8][64];
};

template <class Kv, int D>
inline void attention_tile(device const float* q, device float* out,
                           device const uint8_t* pages, device const uint32_t* tables,
                           device const uint32_t* table_starts,
                           device const uint32_t* token_chunks,
                           device const uint32_t* positions, int n_head, int n_head_kv,
                           int head_dim, int n_pages, int page_size, float scale, float softcap,
                           int window, device const float* sinks, int has_sinks,
                           device const uint32_t* tiles,
                           threadgroup AttentionTileShared<D>& shared, int tile, int kvh,
                           uint tid) {
    const int ROWS = AttentionShape<D>::ROWS, P = AttentionShape<D>::POSITIONS;
    const int THREADS = 4 * ROWS;
    int group_size = n_head / n_head_kv;
    int first_token = (int)tiles[2 * tile], count = (int)tiles[2 * tile + 1];
    int rows = count * group_size;
    device const uint32_t* table = tables + table_starts[token_chunks[first_token]];
    size_t row_bytes = Kv::row_bytes(head_dim), block = (size_t)page_size * row_bytes;
    device const uint8_t* keys = pages + (size_t)kvh * n_pages * block;
    device const uint8_t* values = keys + (size_t)n_head_kv * n_pages * block;
    for (int e = tid; e < ROWS * D; e += THREADS) {
        int r = e / D, d = e % D;
        float x = 0.0f;
        if (r < rows && d < head_dim) {
            int head = kvh * group_size + r % group_size;
            x = q[((size_t)(first_token + r / group_size) * n_head + head) * head_dim + d];
        }
        shared.q[e] = x;
    }
    // SIMD-group simd's rows are 8 simd..; lane 4 i + part takes row 8 simd + i's scores
    // part, part + 4, ... of a pass.
    uint lane = tid % 32, simd = tid / 32;
    int row = 8 * (int)simd + (int)lane / 4, part = (int)lane % 4;
    int pos = row < rows ? (int)positions[first_token + row / group_size] : -1;
    int row_first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    // The tile's positions: from its first token's first to its last token's position.
    int begin = (int)positions[first_token], end = (int)positions[first_token + count - 1];
    begin = window > 0 && begin + 1 > window ? begin + 1 - window : 0;
    // Blocks of 8 dimensions the heads fill: loops run to D / 8 and stop there, so that the
    // compiler can unroll them and keep `o` in registers.
    int n_blocks = (head_dim + 7) / 8;
    // The SIMD-group's outputs, its rows' running maxima and (this lane's part of) their sums.
    simdgroup_float8x8 o[D / 8];
    for (int n = 0; n < D / 8; ++n) o[n] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    float m = -INFINITY, l = 0.0f;
    threadgroup float* scores = shared.s + 8 * simd * P;
    threadgroup float* rescale = shared.rescale[simd];
    for (int start = begin; start <= end; start += P) {
        // The last pass has read the values (the first: the queries have been written).
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // Neighbouring threads read neighbouring values of a key.
        for (int e = tid; e < P * D; e += THREADS) {
            int j = e / D, d = e % D, p = start + j;
            float x = 0.0f;
            if (p <= end && d < head_dim) {
                x = Kv::at(keys + table[p / page_size] * block +
                               (size_t)(p % page_size) * row_bytes,
                           d);
            }
            shared.kv[d * P + j] = x;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int j = 0; j < P / 8; ++j) {
            simdgroup_float8x8 s = make_filled_simdgroup_matrix<float, 8, 8>(0.0f), a, b;
            for (int k = 0; k < D / 8; ++k) {
                if (k >= n_blocks) break;
                simdgroup_load(a, &shared.q[8 * simd * D + 8 * k], D);
                simdgroup_load(b, &shared.kv[8 * k * P + 8 * j], P);
                simdgroup_multiply_accumulate(s, a, b, s);
            }
            simdgroup_store(s, &scores[8 * j], P);
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        // Scores, masked; the rows' maxima over the pass (a row's lanes: four neighbours).
        float pass_max = -INFINITY;
        for (int j = part; j < P; j += 4) {
            int p = start + j;
            float score = scores[(lane / 4) * P + j] * scale;
            if (softcap > 0.0f) score = softcap * precise::tanh(score / softcap);
            if (p < row_first || p > pos) score = -INFINITY;
            scores[(lane / 4) * P + j] = score;
            pass_max = max(pass_max, score);
        }
        pass_max = max(pass_max, simd_shuffle_xor(pass_max, 1));
        pass_max = max(pass_max, simd_shuffle_xor(pass_max, 2));
        float new_max = max(m, pass_max);
        float correction = new_max == -INFINITY ? 1.0f : precise::exp(m - new_max);
        m = new_max;
        l *= correction;
        for (int j = part; j < P; j += 4) {
            threadgroup float* w = &scores[(lane / 4) * P + j];
            *w = m == -INFINITY ? 0.0f : precise::exp(*w - m);
            l += *w;
        }
        // The diagonal of the rows' corrections: lane 4 i + part writes row i's columns
        // 2 part, 2 part + 1.
        for (int c = 2 * part; c < 2 * part + 2; ++c) {
            rescale[(lane / 4) * 8 + c] = c == (int)lane / 4 ? correction : 0.0f;
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        simdgroup_float8x8 diagonal, zero = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
        simdgroup_load(diagonal, rescale, 8);
        for (int n = 0; n < D / 8; ++n) {
            if (n >= n_blocks) break;
            simdgroup_multiply_accumulate(o[n], diagonal, o[n], zero);
        }
        // Every SIMD-group has read the keys.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int e = tid; e < P * D; e += THREADS) {
            int j = e / D, d = e % D, p = start + j;
            float x = 0.0f;
            if (p <= end && d < head_dim) {
                x = Kv::at(values + table[p / page_size] * block +
                               (size_t)(p % page_size) * row_bytes,
                           d);
            }
            shared.kv[e] = x;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int k = 0; k < P / 8; ++k) {
            simdgroup_float8x8 a, b;
            simdgroup_load(a, &scores[8 * k], P);
            for (int n = 0; n < D / 8; ++n) {
                if (n >= n_blocks) break;
                simdgroup_load(b, &shared.kv[8 * k * D + 8 * n], D);
                simdgroup_multiply_accumulate(o[n], a, b, o[n]);
            }
        }
    }
    // The outputs into the SIMD-group's rows of the queries (only it reads them).
    for (int n = 0; n < D / 8; ++n) {
        if (n >= n_blocks) break;
        simdgroup_store(o[n], &shared.q[8 * simd * D + 8 * n], D);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    // Each row's sum (its lanes' parts), a sink joining it as in attention.
    l += simd_shuffle_xor(l, 1);
    l += simd_shuffle_xor(l, 2);
    if (row >= rows) return;
    int head = kvh * group_size + row % group_size;
    float factor = 1.0f / l;
    if (has_sinks) {
        float sink = sinks[head], top = max(m, sink), r = precise::exp(m - top);
        factor = r / (l * r + precise::exp(sink - top));
    }
    device float* y = out + ((size_t)(first_token + row / group_size) * n_head + head) * head_dim;
    for (int d = part; d < head_dim; d += 4) y[d] = shared.q[row * D + d] * factor;
}

#define ATTENTION_TILES(name, Kv, D)                                                        \
    kernel void attention_tiles_##name##_##D(                                               \
        device const float* q [[buffer(0)]], device float* out [[buffer(1)]],               \
        device const uint8_t* pages [[buffer(2)]], device const uint32_t* tables [[buffer(3)]], \
        device const uint32_t* table_starts [[buffer(4)]],                                  \
        device const uint32_t* token_chunks [[buffer(5)]],                                  \
        device const uint32_t* positions [[buffer(6)]], constant int& n_head [[buffer(7)]], \
        constant int& n_head_kv [[buffer(8)]], constant int& head_dim [[buffer(9)]],        \
        constant int& n_pages [[buffer(10)]], constant int& page_size [[buffer(11)]],       \
        constant float& scale [[buffer(12)]], constant float& softcap [[buffer(13)]],       \
        constant int& window [[buffer(14)]], device const float* sinks [[buffer(15)]],      \
        constant int& has_sinks [[buffer(16)]], device const uint32_t* tiles [[buffer(17)]], \
        uint3 group [[threadgroup_position_in_grid]],                                       \
        uint tid [[thread_index_in_threadgroup]]) {                                         \
        threadgroup AttentionTileShared<D> shared;                                          \
        attention_tile<Kv, D>(q, out, pages, tables, table_starts, token_chunks, positions, \
                              n_head, n_head_kv, head_dim, n_pages, page_size, scale,       \
                              softcap, window, sinks, has_sinks, tiles, shared, group.x,    \
                              group.y, tid);                                                \
    }
#define ATTENTION_TILES_OF(name, Kv) \
    ATTENTION_TILES(name, Kv, 64)    \
    ATTENTION_TILES(name, Kv, 128)   \
    ATTENTION_TILES(name, Kv, 256)
FOR_EACH_KV_FORMAT(ATTENTION_TILES_OF)
