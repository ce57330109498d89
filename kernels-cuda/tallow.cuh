// What every kernel of tallow's CUDA backend shares. Compiled by NVRTC for the device's exact
// architecture (no CUDA headers: the few types needed are defined here), and as C++ on the
// CPU after emulation/cuda_emulation.h for the conformance suite.
#pragma once

#ifdef __CUDACC_RTC__
#define INFINITY __int_as_float(0x7f800000)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#endif

// Under NVRTC a kernel is found by its name in the module; the emulation registers it.
#ifndef TALLOW_EXPORT
#define TALLOW_EXPORT(kernel)
#endif

#define FULL_WARP 0xffffffffu

// Tokens of one block of matmul.cu's and matvec.cu's products, and so the most pairs of a
// mixture's tiles cut for them (experts.cu's group_pairs; kernels.rs's PRODUCT_TOKENS).
#define PRODUCT_TOKENS 8

// An expert's offset in the table of a launch of experts' products whose buffer does not hold
// the expert (kernels.rs's NO_EXPERT): the tiles of that expert are another launch's.
#define NO_EXPERT 0xffffffffu

// Pair i of a mixture's tile (expert, first index in `pairs`, count, unused: experts.cu's
// group_pairs), the tile's last pair where i is past its count: the row of x it reads
// (pair / divisor) and the row of y it writes.
__device__ __forceinline__ void tile_pair(const uint32_t* pairs, const uint32_t* tile, int i,
                                          int divisor, int* in, int* out) {
    int count = (int)tile[2];
    int pair = (int)pairs[tile[1] + (i < count ? i : count - 1)];
    *in = pair / divisor;
    *out = pair;
}

// c += A · B for a warp's 16 x 8 tile of i32 over 32 bytes of k (mma.sync m16n8k32, s8 by
// s8: tensor cores), its fragments as PTX lays them out (emulation/cuda_emulation.h spells the
// layout out): a[4] of A's 16 x 32, b[2] of B's 32 x 8, c[4] of the tile. Every lane of the
// warp calls it. Turing, which has no m16n8k32, takes it as four m8n8k16.
__device__ __forceinline__ void mma_s8(int* c, const int* a, const int* b) {
#ifdef __CUDACC_RTC__
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    // Rows group (c[0], c[1]) and group + 8 (c[2], c[3]), each over k 0..16 then 16..32.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        asm("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0, %1}, {%2}, {%3}, {%0, %1};"
            : "+r"(c[2 * (i % 2)]), "+r"(c[2 * (i % 2) + 1])
            : "r"(a[i]), "r"(b[i / 2]));
    }
#endif
#else
    tallow_emu::mma_s8_m16n8k32(c, a, b);
#endif
}

// c += A · B for a warp's 16 x 8 tile of f32 over 16 values of k (mma.sync m16n8k16, f16 by
// f16, f32 sums: tensor cores), its fragments as PTX lays them out (emulation/cuda_emulation.h
// spells the layout out): a[4] (two f16 a word) of A's 16 x 16, b[2] of B's 16 x 8, c[4] of
// the tile. Every lane of the warp calls it. Turing takes it as two m16n8k8.
__device__ __forceinline__ void mma_f16(float* c, const uint32_t* a, const uint32_t* b) {
#ifdef __CUDACC_RTC__
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    // k 0..8 (a[0], a[1], b[0]), then 8..16 (a[2], a[3], b[1]).
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
            "{%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[2 * i]), "r"(a[2 * i + 1]), "r"(b[i]));
    }
#endif
#else
    tallow_emu::mma_f16_m16n8k16(c, a, b);
#endif
}

// The sum of `v` over a warp, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
    for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(FULL_WARP, v, mask);
    return v;
}

// The largest `v` of a warp, in every lane.
__device__ __forceinline__ float warp_max(float v) {
    for (int mask = 16; mask > 0; mask >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_WARP, v, mask));
    return v;
}

// The sum of `v` over a block of whole warps (at most 1024 threads), in every thread. Every
// thread of the block must call it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    v = warp_sum(v);
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();  // the partial sums of a previous call have been read
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < blockDim.x / 32 ? partial[lane] : 0.0f;
    return warp_sum(v);
}

// The largest `v` over a block of whole warps, in every thread (as block_sum).
__device__ __forceinline__ float block_max(float v) {
    __shared__ float partial[32];
    v = warp_max(v);
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < blockDim.x / 32 ? partial[lane] : -INFINITY;
    return warp_max(v);
}
