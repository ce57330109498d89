// CUDA's execution model on the CPU, for running tallow's CUDA kernels without a GPU.
//
// A kernel's source compiles unchanged as C++ after this header, on the emulator's scheduler
// (rust/tallow-gpu-emulation/emulator/scheduler.h: each GPU thread a fiber, real barriers and
// warp exchanges): __syncthreads() is its block barrier; __shfl_*_sync, __ballot_sync,
// __any_sync, __all_sync and __syncwarp its warp operations; __shared__ variables statics;
// __dp4a and mma.sync's fragments (m16n8k32 of bytes, m16n8k16 of f16) are computed as PTX
// documents them.
#pragma once

#include <string>

#include "scheduler.h"

#define TALLOW_EMULATION 1

using dim3 = tallow_emu::Index3;
using uint3 = dim3;

namespace tallow_emu {

template <class... A, std::size_t... I>
void call_with(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<A>*>(params[I])...);
}

// Registers a CUDA kernel under "cuda/<name>".
template <class... A>
struct Registration {
    Registration(const char* name, void (*kernel)(A...)) {
        static const unsigned sizes[sizeof...(A) + 1] = {(unsigned)sizeof(A)..., 0};
        register_kernel(
            (std::string("cuda/") + name).c_str(), (void*)kernel,
            [](void* k, void** params) {
                call_with((void (*)(A...))k, params, std::index_sequence_for<A...>{});
            },
            sizes, sizeof...(A));
    }
};

template <class... A>
Registration<A...> registration(const char* name, void (*kernel)(A...)) {
    return Registration<A...>(name, kernel);
}

}  // namespace tallow_emu

#define threadIdx (tallow_emu::thread_idx)
#define blockIdx (tallow_emu::block_idx)
#define blockDim (tallow_emu::block_dim)
#define gridDim (tallow_emu::grid_dim)
#define warpSize 32

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)
// One block runs at a time: a function's static is its block's.
#define __shared__ static

#define TALLOW_EXPORT(kernel) \
    static auto tallow_registration_##kernel = tallow_emu::registration(#kernel, kernel);

inline void __syncthreads() { tallow_emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
    uint64_t lanes[32];
    tallow_emu::warp_exchange(0, lanes);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    return tallow_emu::shuffle(v, tallow_emu::xor_source, mask, width);
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    return tallow_emu::shuffle(v, tallow_emu::down_source, (int)delta, width);
}
template <class T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    return tallow_emu::shuffle(v, tallow_emu::up_source, (int)delta, width);
}
template <class T>
T __shfl_sync(unsigned, T v, int source, int width = 32) {
    return tallow_emu::shuffle(v, tallow_emu::index_source, source, width);
}

// The predicates of the warp's lanes as bits, and the mask of the lanes that exist.
inline unsigned tallow_emu_votes(int predicate, unsigned* live) {
    uint64_t lanes[32];
    *live = tallow_emu::warp_exchange(predicate ? 1 : 0, lanes);
    unsigned bits = 0;
    for (unsigned i = 0; i < 32; ++i) bits |= (unsigned)(lanes[i] & 1) << i;
    return bits;
}
inline unsigned __ballot_sync(unsigned, int predicate) {
    unsigned live;
    return tallow_emu_votes(predicate, &live);
}
inline int __any_sync(unsigned, int predicate) {
    unsigned live;
    return tallow_emu_votes(predicate, &live) != 0;
}
inline int __all_sync(unsigned, int predicate) {
    unsigned live;
    return tallow_emu_votes(predicate, &live) == live;
}

template <class T>
T atomicAdd(T* address, T v) {
    T old = *address;
    *address = old + v;
    return old;
}
template <class T>
T atomicMax(T* address, T v) {
    T old = *address;
    *address = old > v ? old : v;
    return old;
}
template <class T>
T atomicExch(T* address, T v) {
    T old = *address;
    *address = v;
    return old;
}

// Four signed (or unsigned) byte products summed into c.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int8_t)(a >> (8 * i)) * (int8_t)(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; ++i) c += (uint8_t)(a >> (8 * i)) * (uint8_t)(b >> (8 * i));
    return c;
}

namespace tallow_emu {

// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 over the warp, its fragments laid out as
// PTX lays them (lane: group = lane / 4, t = lane % 4; bytes in order within a register):
//   a[0] = A[group][4t..4t + 4]   a[1] = A[group + 8][4t..]   a[2] = A[group][16 + 4t..]
//   a[3] = A[group + 8][16 + 4t..]   (A: 16 x 32, rows by k)
//   b[0] = B[4t..4t + 4][group]   b[1] = B[16 + 4t..][group]   (B: 32 x 8, k by columns)
//   c[i] += (A · B)[group + 8 (i / 2)][2t + i % 2]
inline void mma_s8_m16n8k32(int* c, const int* a, const int* b) {
    uint64_t a_lanes[4][32], b_lanes[2][32];
    for (int i = 0; i < 4; ++i) warp_exchange((uint32_t)a[i], a_lanes[i]);
    for (int i = 0; i < 2; ++i) warp_exchange((uint32_t)b[i], b_lanes[i]);
    auto byte = [](uint64_t word, int k) { return (int)(int8_t)(word >> (8 * (k % 4))); };
    unsigned lane = linear_id() % 32, group = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        int row = (int)group + 8 * (i / 2), column = (int)(2 * t) + i % 2, sum = 0;
        for (int k = 0; k < 32; ++k) {
            uint64_t a_word = a_lanes[(row / 8) + 2 * (k / 16)][(row % 8) * 4 + (k % 16) / 4];
            uint64_t b_word = b_lanes[k / 16][column * 4 + (k % 16) / 4];
            sum += byte(a_word, k) * byte(b_word, k);
        }
        c[i] += sum;
    }
}

// An f16's value (IEEE binary16 bits).
inline float half_value(uint32_t bits) {
    uint32_t sign = bits >> 15 & 1, exponent = bits >> 10 & 0x1f, mantissa = bits & 0x3ff;
    float v = exponent == 0    ? ldexpf((float)mantissa, -24)
              : exponent == 31 ? (mantissa ? NAN : INFINITY)
                               : ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
    return sign ? -v : v;
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 over the warp, its fragments laid out as
// PTX lays them (lane: group = lane / 4, t = lane % 4; two f16 a word, the lower index in the
// low half):
//   a[0] = A[group][2t..2t + 2]   a[1] = A[group + 8][2t..]   a[2] = A[group][8 + 2t..]
//   a[3] = A[group + 8][8 + 2t..]   (A: 16 x 16, rows by k)
//   b[0] = B[2t..2t + 2][group]   b[1] = B[8 + 2t..][group]   (B: 16 x 8, k by columns)
//   c[i] += (A · B)[group + 8 (i / 2)][2t + i % 2], the products summed in f32
inline void mma_f16_m16n8k16(float* c, const uint32_t* a, const uint32_t* b) {
    uint64_t a_lanes[4][32], b_lanes[2][32];
    for (int i = 0; i < 4; ++i) warp_exchange(a[i], a_lanes[i]);
    for (int i = 0; i < 2; ++i) warp_exchange(b[i], b_lanes[i]);
    auto half = [](uint64_t word, int k) { return half_value((uint32_t)(word >> (16 * (k % 2))) & 0xffff); };
    unsigned lane = linear_id() % 32, group = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        int row = (int)group + 8 * (i / 2), column = (int)(2 * t) + i % 2;
        float sum = c[i];
        for (int k = 0; k < 16; ++k) {
            uint64_t a_word = a_lanes[(row / 8) + 2 * (k / 8)][(row % 8) * 4 + (k % 8) / 2];
            uint64_t b_word = b_lanes[k / 8][column * 4 + (k % 8) / 2];
            sum += half(a_word, k) * half(b_word, k);
        }
        c[i] = sum;
    }
}

}  // namespace tallow_emu

template <class T>
T __ldg(const T* p) {
    return *p;
}

// CUDA's device math functions (those not in C's global namespace).
using std::isnan;

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline unsigned __float_as_uint(float x) { return tallow_emu::from_bits<unsigned>(tallow_emu::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return tallow_emu::from_bits<float>(x); }
inline int __float_as_int(float x) { return tallow_emu::from_bits<int>(tallow_emu::to_bits(x)); }
inline float __int_as_float(int x) { return tallow_emu::from_bits<float>((uint64_t)(uint32_t)x); }
