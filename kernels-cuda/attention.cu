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
// per (x, h, z)), which attention_merge combines. Block x takes token t = tokens[x] (the
// launch takes the step's tokens that `tokens` lists: those the tiles below do not).
template <class Kv>
__device__ void attention(const float* q, float* out, const uint8_t* pages,
                          const uint32_t* tables, const uint32_t* table_starts,
                          const uint32_t* token_chunks, const uint32_t* positions, int n_head,
                          int n_head_kv, int head_dim, int n_pages, int page_size, float scale,
                          float softcap, int window, const float* sinks, int has_sinks, int span,
                          int n_splits, float* partials, const uint32_t* tokens) {
    __shared__ float query[MAX_HEAD_DIM];
    __shared__ float weights[TILE];
    __shared__ uint32_t tile_pages[TILE];
    int t = (int)tokens[blockIdx.x], h = blockIdx.y, kvh = h / (n_head / n_head_kv);
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
        size_t at = ((size_t)blockIdx.x * n_head + h) * n_splits + blockIdx.z;
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

// Out row t = tokens[x] (head h) from the n_splits partial results of attention's blocks
// (x, h, z): each split's sum and outputs rescaled to the largest maximum, a sink joining the
// sum as above. Block (x, h) of TILE threads.
extern "C" __global__ void __launch_bounds__(TILE)
    attention_merge(const float* partials, float* out, int n_head, int head_dim, int n_splits,
                    const float* sinks, int has_sinks, const uint32_t* tokens) {
    int t = (int)tokens[blockIdx.x], h = blockIdx.y;
    size_t at = ((size_t)blockIdx.x * n_head + h) * n_splits;
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
        float* partials, const uint32_t* tokens) {                                             \
        attention<Kv>(q, out, pages, tables, table_starts, token_chunks, positions, n_head,    \
                      n_head_kv, head_dim, n_pages, page_size, scale, softcap, window, sinks,  \
                      has_sinks, span, n_splits, partials, tokens);                            \
    }                                                                                          \
    TALLOW_EXPORT(attention_##name)
FOR_EACH_KV_FORMAT(ATTENTION)

// ---- Tiles: the attention of prefill steps on the tensor cores (flash attention 2) ----
//
// A block takes up to AttentionShape<D>::ROWS (token, query head) rows: `count` consecutive
// tokens of one chunk (tiles[2 blockIdx.x]: the first, tiles[2 blockIdx.x + 1]: count; the
// other arguments attention's) by the query heads of KV head blockIdx.y, row r being
// token r / group and the group's head r % group. Each warp takes 16 rows through the
// positions the tile's tokens see, AttentionShape<D>::POSITIONS at a time: S = Q · Kᵀ and
// O += softmax(S) · V on mma_f16, with the keys, then the values, of those positions in
// shared memory as f16 (exact for f16 pages; q8_0's values rounded, well within the rounding
// of their blocks). The queries and the softmax's weights are taken as two f16 parts each
// (the value, and what rounding it left, lifted into f16's range) so that the products keep
// f32's precision.

// The shape of a block for heads of at most D dimensions (64, 128 or 256).
template <int D>
struct AttentionShape {
    enum : int {
        // Rows of a block, 16 a warp.
        ROWS = D <= 128 ? 64 : 32,
        // Positions of a pass.
        POSITIONS = 4096 / D,
        // Words (f16 pairs) of a query's or a key's row in shared memory, and of a value
        // dimension's positions: 4 more than they hold, so that the words a warp reads for a
        // fragment (word t of row group, group < 8, t < 4) fall in 32 banks.
        WORDS = D / 2 + 4,
        POSITION_WORDS = POSITIONS / 2 + 4,
        // Words of the keys (POSITIONS rows of WORDS) or the values (D rows of
        // POSITION_WORDS), which take turns in one buffer.
        KV_WORDS = POSITIONS * WORDS > D * POSITION_WORDS ? POSITIONS * WORDS
                                                           : D * POSITION_WORDS,
    };
};

// The queries' lower parts are lifted by Q_LIFT, their products lowered after; the weights
// (at most 1) are lifted by P_LIFT before they are split, the outputs lowered at the end.
#define Q_LIFT 2048.0f
#define P_LIFT 4096.0f

// f16 bits of two floats in a word, `lo`'s in its low half (mma_f16's operands).
__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
#ifdef __CUDACC_RTC__
    uint32_t r;
    asm("{.reg .f16 l, h;\n\tcvt.rn.f16.f32 l, %1;\n\tcvt.rn.f16.f32 h, %2;\n\t"
        "mov.b32 %0, {l, h};}"
        : "=r"(r)
        : "f"(lo), "f"(hi));
    return r;
#else
    return f32_to_f16(lo) | (uint32_t)f32_to_f16(hi) << 16;
#endif
}

// x0, x1 as two f16 pairs: *high their f16 values, *low what rounding left times `lift`.
__device__ __forceinline__ void split_half2(float x0, float x1, float lift, uint32_t* high,
                                            uint32_t* low) {
    uint32_t h = half2_bits(x0, x1);
    *high = h;
    *low = half2_bits((x0 - f16_to_f32((uint16_t)(h & 0xffff))) * lift,
                      (x1 - f16_to_f32((uint16_t)(h >> 16))) * lift);
}

template <class Kv, int D>
__device__ void attention_tile(const float* q, float* out, const uint8_t* pages,
                               const uint32_t* tables, const uint32_t* table_starts,
                               const uint32_t* token_chunks, const uint32_t* positions,
                               int n_head, int n_head_kv, int head_dim, int n_pages,
                               int page_size, float scale, float softcap, int window,
                               const float* sinks, int has_sinks, const uint32_t* tiles) {
    typedef AttentionShape<D> Shape;
    enum : int { ROWS = Shape::ROWS, P = Shape::POSITIONS, WORDS = Shape::WORDS };
    enum : int { POSITION_WORDS = Shape::POSITION_WORDS };
    __shared__ uint32_t q_high[ROWS][WORDS], q_low[ROWS][WORDS];
    __shared__ uint32_t kv[Shape::KV_WORDS];
    int group_size = n_head / n_head_kv, kvh = blockIdx.y;
    int first_token = (int)tiles[2 * blockIdx.x], count = (int)tiles[2 * blockIdx.x + 1];
    int rows = count * group_size;
    const uint32_t* table = tables + table_starts[token_chunks[first_token]];
    size_t row_bytes = Kv::row_bytes(head_dim), block = (size_t)page_size * row_bytes;
    const uint8_t* keys = pages + (size_t)kvh * n_pages * block;
    const uint8_t* values = keys + (size_t)n_head_kv * n_pages * block;
    for (int e = threadIdx.x; e < ROWS * (D / 2); e += blockDim.x) {
        int r = e / (D / 2), w = e % (D / 2), d = 2 * w;
        float x0 = 0.0f, x1 = 0.0f;
        if (r < rows) {
            int head = kvh * group_size + r % group_size;
            const float* row =
                q + ((size_t)(first_token + r / group_size) * n_head + head) * head_dim;
            if (d < head_dim) x0 = row[d];
            if (d + 1 < head_dim) x1 = row[d + 1];
        }
        split_half2(x0, x1, Q_LIFT, &q_high[r][w], &q_low[r][w]);
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, group = lane / 4, t = lane % 4;
    int row0 = 16 * warp + group;
    // The positions rows row0 and row0 + 8 see: first[i]..=last[i] (none past the tile).
    int first[2], last[2];
    for (int i = 0; i < 2; ++i) {
        int r = row0 + 8 * i;
        int pos = r < rows ? (int)positions[first_token + r / group_size] : -1;
        last[i] = pos;
        first[i] = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    }
    // The tile's: from its first token's first to its last token's position.
    int begin = (int)positions[first_token], end = (int)positions[first_token + count - 1];
    begin = window > 0 && begin + 1 > window ? begin + 1 - window : 0;
    int n_chunks = (head_dim + 15) / 16, n_dim_tiles = (head_dim + 7) / 8;
    // This lane's outputs (fragments of D / 8 tiles of 16 x 8), its rows' running maxima and
    // its part of their sums.
    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) o[n][i] = 0.0f;
    }
    for (int start = begin; start <= end; start += P) {
        __syncthreads();  // the last pass has read the values (the first: queries written)
        for (int e = threadIdx.x; e < P * (D / 2); e += blockDim.x) {
            int j = e / (D / 2), w = e % (D / 2), d = 2 * w, p = start + j;
            float x0 = 0.0f, x1 = 0.0f;
            if (p <= end && d < head_dim) {
                const uint8_t* key =
                    keys + table[p / page_size] * block + (size_t)(p % page_size) * row_bytes;
                x0 = Kv::at(key, d);
                if (d + 1 < head_dim) x1 = Kv::at(key, d + 1);
            }
            kv[j * WORDS + w] = half2_bits(x0, x1);
        }
        __syncthreads();
        float s[P / 8][4], s_low[P / 8][4];
#pragma unroll
        for (int j = 0; j < P / 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) s[j][i] = s_low[j][i] = 0.0f;
        }
#pragma unroll
        for (int c = 0; c < D / 16; ++c) {
            if (c >= n_chunks) break;
            int w = 8 * c + t;
            uint32_t a[4] = {q_high[row0][w], q_high[row0 + 8][w], q_high[row0][w + 4],
                             q_high[row0 + 8][w + 4]};
            uint32_t a_low[4] = {q_low[row0][w], q_low[row0 + 8][w], q_low[row0][w + 4],
                                 q_low[row0 + 8][w + 4]};
#pragma unroll
            for (int j = 0; j < P / 8; ++j) {
                const uint32_t* key = &kv[(8 * j + group) * WORDS + w];
                uint32_t b[2] = {key[0], key[4]};
                mma_f16(s[j], a, b);
                mma_f16(s_low[j], a_low, b);
            }
        }
        // Scores, masked; the rows' maxima over the pass (a row's lanes: a quad).
        float pass_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < P / 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int row = i / 2, p = start + 8 * j + 2 * t + i % 2;
                float score = (s[j][i] + s_low[j][i] * (1.0f / Q_LIFT)) * scale;
                if (softcap > 0.0f) score = softcap * tanhf(score / softcap);
                if (p < first[row] || p > last[row]) score = -INFINITY;
                s[j][i] = score;
                pass_max[row] = fmaxf(pass_max[row], score);
            }
        }
        float correction[2];
        for (int row = 0; row < 2; ++row) {
            float pm = pass_max[row];
            pm = fmaxf(pm, __shfl_xor_sync(FULL_WARP, pm, 1));
            pm = fmaxf(pm, __shfl_xor_sync(FULL_WARP, pm, 2));
            float new_max = fmaxf(m[row], pm);
            correction[row] = new_max == -INFINITY ? 1.0f : expf(m[row] - new_max);
            m[row] = new_max;
            l[row] *= correction[row];
        }
#pragma unroll
        for (int j = 0; j < P / 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int row = i / 2;
                float w = m[row] == -INFINITY ? 0.0f : expf(s[j][i] - m[row]);
                s[j][i] = w;
                l[row] += w;
            }
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
#pragma unroll
            for (int i = 0; i < 4; ++i) o[n][i] *= correction[i / 2];
        }
        __syncthreads();  // the keys have been read
        // The values transposed (a dimension's positions in a row), neighbouring threads
        // reading neighbouring dimensions of a position.
        for (int e = threadIdx.x; e < D * (P / 2); e += blockDim.x) {
            int d = e % D, w = e / D, p = start + 2 * w;
            float x[2] = {0.0f, 0.0f};
            for (int i = 0; i < 2; ++i) {
                if (p + i <= end && d < head_dim) {
                    const uint8_t* value = values + table[(p + i) / page_size] * block +
                                           (size_t)((p + i) % page_size) * row_bytes;
                    x[i] = Kv::at(value, d);
                }
            }
            kv[d * POSITION_WORDS + w] = half2_bits(x[0], x[1]);
        }
        __syncthreads();
        // The weights of positions 16c.. as A fragments: those of S's tiles 2c and 2c + 1.
        uint32_t a[P / 16][4], a_low[P / 16][4];
#pragma unroll
        for (int c = 0; c < P / 16; ++c) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float* w = &s[2 * c + i / 2][2 * (i % 2)];
                split_half2(w[0] * P_LIFT, w[1] * P_LIFT, 1.0f, &a[c][i], &a_low[c][i]);
            }
        }
        // Each pass's products summed apart and added to the outputs in f32: the tensor
        // cores' sums need not round as f32 does, and a long context adds many passes.
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            if (n >= n_dim_tiles) break;
            float pass[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int c = 0; c < P / 16; ++c) {
                const uint32_t* value = &kv[(8 * n + group) * POSITION_WORDS + 8 * c + t];
                uint32_t b[2] = {value[0], value[4]};
                mma_f16(pass, a[c], b);
                mma_f16(pass, a_low[c], b);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) o[n][i] += pass[i];
        }
    }
    // Each row's sum (its quad's parts), a sink joining it as in attention; then the outputs.
    float factor[2];
    for (int row = 0; row < 2; ++row) {
        float sum = l[row];
        sum += __shfl_xor_sync(FULL_WARP, sum, 1);
        sum += __shfl_xor_sync(FULL_WARP, sum, 2);
        int r = row0 + 8 * row;
        float rescale = 1.0f;
        if (has_sinks && r < rows) {
            float sink = sinks[kvh * group_size + r % group_size], top = fmaxf(m[row], sink);
            rescale = expf(m[row] - top);
            sum = sum * rescale + expf(sink - top);
        }
        factor[row] = rescale / (P_LIFT * sum);
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int r = row0 + 8 * (i / 2), d = 8 * n + 2 * t + i % 2;
            if (r >= rows || d >= head_dim) continue;
            int token = first_token + r / group_size, head = kvh * group_size + r % group_size;
            out[((size_t)token * n_head + head) * head_dim + d] = o[n][i] * factor[i / 2];
        }
    }
}

#define ATTENTION_TILES(name, Kv, D)                                                           \
    extern "C" __global__ void __launch_bounds__(2 * AttentionShape<D>::ROWS)                  \
        attention_tiles_##name##_##D(const float* q, float* out, const uint8_t* pages,         \
                                     const uint32_t* tables, const uint32_t* table_starts,     \
                                     const uint32_t* token_chunks, const uint32_t* positions,  \
                                     int n_head, int n_head_kv, int head_dim, int n_pages,     \
                                     int page_size, float scale, float softcap, int window,    \
                                     const float* sinks, int has_sinks,                        \
                                     const uint32_t* tiles) {                                  \
        attention_tile<Kv, D>(q, out, pages, tables, table_starts, token_chunks, positions,    \
                              n_head, n_head_kv, head_dim, n_pages, page_size, scale, softcap, \
                              window, sinks, has_sinks, tiles);                                \
    }                                                                                          \
    TALLOW_EXPORT(attention_tiles_##name##_##D)
#define ATTENTION_TILES_OF(name, Kv) \
    ATTENTION_TILES(name, Kv, 64)    \
    ATTENTION_TILES(name, Kv, 128)   \
    ATTENTION_TILES(name, Kv, 256)
FOR_EACH_KV_FORMAT(ATTENTION_TILES_OF)
