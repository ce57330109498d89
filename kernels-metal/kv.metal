// Writing the step's keys and values into the KV pages.
//
// A layer's pages are one buffer: keys then values, each [KV head][page][position] rows of
// the page format (kernels-gpu/formats.h: KvF16, KvQ8_0).

#include "tallow.h"

// Token t's keys and values (rows of `n_head_kv * head_dim` values of `k` and `v`) into its
// slot (`slots[2t]`: page, `slots[2t + 1]`: position in it). One threadgroup per token; a
// thread per (K or V, head).
template <class Kv>
inline void kv_write(device const float* k, device const float* v,
                     device const uint32_t* slots, device uint8_t* pages, int n_head_kv,
                     int head_dim, int n_pages, int page_size, uint t, uint tid, uint threads) {
    int row = n_head_kv * head_dim;
    size_t page = slots[2 * t], offset = slots[2 * t + 1];
    size_t row_bytes = Kv::row_bytes(head_dim), block = (size_t)page_size * row_bytes;
    for (int i = tid; i < 2 * n_head_kv; i += threads) {
        int kind = i / n_head_kv, head = i % n_head_kv;
        device const float* x = (kind ? v : k) + (size_t)t * row + head * head_dim;
        size_t at = (((size_t)kind * n_head_kv + head) * n_pages + page) * block +
                    offset * row_bytes;
        Kv::store(x, head_dim, pages + at);
    }
}

#define KV_WRITE(name, Kv)                                                                  \
    kernel void kv_write_##name(                                                            \
        device const float* k [[buffer(0)]], device const float* v [[buffer(1)]],           \
        device const uint32_t* slots [[buffer(2)]], device uint8_t* pages [[buffer(3)]],    \
        constant int& n_head_kv [[buffer(4)]], constant int& head_dim [[buffer(5)]],        \
        constant int& n_pages [[buffer(6)]], constant int& page_size [[buffer(7)]],         \
        uint t [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],  \
        uint threads [[threads_per_threadgroup]]) {                                         \
        kv_write<Kv>(k, v, slots, pages, n_head_kv, head_dim, n_pages, page_size, t, tid,   \
                     threads);                                                              \
    }
FOR_EACH_KV_FORMAT(KV_WRITE)
