// Writing the step's keys and values into the KV pages.
//
// A layer's pages are one buffer: keys then values, each [KV head][page][position][head_dim]
// f16 values.

#include "tallow.cuh"

// Token t's keys and values (rows of `n_head_kv * head_dim` values of `k` and `v`) into its
// slot (`slots[2t]`: page, `slots[2t + 1]`: position in it). One block per token.
extern "C" __global__ void kv_write_f16(const float* k, const float* v, const uint32_t* slots,
                                        uint16_t* pages, int n_head_kv, int head_dim,
                                        int n_pages, int page_size) {
    int t = blockIdx.x, row = n_head_kv * head_dim;
    size_t page = slots[2 * t], offset = slots[2 * t + 1];
    size_t block = (size_t)page_size * head_dim;
    size_t values = (size_t)n_head_kv * n_pages * block;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        int head = i / head_dim, d = i % head_dim;
        size_t at = ((size_t)head * n_pages + page) * block + offset * head_dim + d;
        pages[at] = f32_to_f16(k[(size_t)t * row + i]);
        pages[values + at] = f32_to_f16(v[(size_t)t * row + i]);
    }
}
TALLOW_EXPORT(kv_write_f16)
