// What every kernel of tallow's CUDA backend shares. Compiled by NVRTC for the device's exact
// architecture (no CUDA headers: the few types needed are defined here), and as C++ on the
// CPU after emulation/cuda_emulation.h for the conformance suite.
#pragma once

#ifdef __CUDACC_RTC__
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

// An f16's bits as f32 (no cuda_fp16.h: NVRTC's wheel ships no headers).
__device__ __forceinline__ float f16_to_f32(uint16_t h) {
#ifdef __CUDACC_RTC__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    if (exponent == 0) {
        // Zero or subnormal: mantissa * 2^-24.
        float v = ldexpf((float)mantissa, -24);
        return sign ? -v : v;
    }
    uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                   : sign | ((exponent + 112) << 23) | (mantissa << 13);
    return __uint_as_float(bits);
#endif
}

// A bf16's bits as f32.
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
