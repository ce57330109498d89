// Writing the step's keys and values into the KV pages.
//
// A layer's pages are one buffer: keys then values, each [KV head][page][position] rows of
// the page format (kernels-gpu/formats.h: KvF16, KvQ8_0).

#include "tallow.cuh"
#include "formats.h"

// Token t's keys and values (rows of `n_head_kv * head_dim` values of `k` and `v`) into its
// slot (`slots[2t]`: page, `slots[2t + 1]`: position in it). One block per token; a thread
// per (K or V, head).
template <class Kv>
__device__ void kv_write(const float* k, const float* v, const uint32_t* slots, uint8_t* pages,
                         int n_head_kv, int head_dim, int n_pages, int page_size) {
    int t = blockIdx.x, row = n_head_kv * head_dim;
    size_t page = slots[2 * t], offset = slots[2 * t + 1];
    size_t row_bytes = Kv::row_bytes(head_dim), block = (size_t)page_size * row_bytes;
    for (int i = threadIdx.x; i < 2 * n_head_kv; i += blockDim.x) {
        int kind = i / n_head_kv, head = i % n_head_kv;
        const float* x = (kind ? v : k) + (size_t)t * row + head * head_dim;
        size_t at = (((size_t)kind * n_head_kv + head) * n_pages + page) * block + offset * row_bytes;
        Kv::store(x, head_dim, pages + at);
    }
}

#define KV_WRITE(name, Kv)                                                                     \
    extern "C" __global__ void kv_write_##name(const float* k, const float* v,                 \
                                               const uint32_t* slots, uint8_t* pages,          \
                                               int n_head_kv, int head_dim, int n_pages,       \
                                               int page_size) {                                \
        kv_write<Kv>(k, v, slots, pages, n_head_kv, head_dim, n_pages, page_size);             \
    }                                                                                          \
    TALLOW_EXPORT(kv_write_##name)
FOR_EACH_KV_FORMAT(KV_WRITE)
