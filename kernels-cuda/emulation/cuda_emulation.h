// CUDA's execution model on the CPU, for running tallow's kernels without a GPU.
//
// A kernel's source compiles unchanged as C++ after this header. A launch runs its blocks one
// after the other; within a block, each GPU thread is a fiber (ucontext) on the calling OS
// thread, switched only where the kernel synchronizes, so a block's threads really interleave
// at barriers:
// - __syncthreads() waits until every thread of the block that has not returned arrives;
// - warp operations (__shfl_*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp)
//   exchange values between the threads of a warp (32 consecutive thread ids), all of which
//   must reach the same operation: a warp that diverges there is reported, not guessed at;
// - __shared__ variables are shared by the block's threads (one block runs at a time);
// - atomics are plain read-modify-writes (one fiber runs at a time).
// Bugs that only a real GPU's memory model shows (missing fences between blocks, races that
// the interleaving here happens to order) are out of its reach; indexing, layouts, reductions
// and tile logic are not.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
};
using uint3 = dim3;

namespace tallow_emu {

// The GPU thread running now, and its block's geometry.
struct Lanes;
extern thread_local uint3 thread_idx;
extern thread_local uint3 block_idx;
extern thread_local dim3 block_dim;
extern thread_local dim3 grid_dim;

// The calling thread's linear id within its block.
unsigned linear_id();

// Waits for every live thread of the block.
void sync_block();

// Publishes `bits` as this lane's value and waits for the warp; writes the lanes' values
// to `out` (32 of them; a lane past the block's end holds 0) and returns the mask of the
// lanes that exist.
unsigned warp_exchange(uint64_t bits, uint64_t* out);

// Aborts the process with a message naming the kernel's fault.
[[noreturn]] void fault(const char* message);

template <class T>
uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffled value");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
}

template <class T>
T from_bits(uint64_t bits) {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}

// The lane that `lane` reads from in a shuffle within segments of `width` lanes, or `lane`
// itself where the source falls outside its segment.
inline unsigned shuffle_source(unsigned lane, int source, int width) {
    unsigned segment = lane / width * width;
    if (source < (int)segment || source >= (int)(segment + width)) return lane;
    return (unsigned)source;
}

template <class T>
T shuffle(T v, int source_of_lane(unsigned lane, int arg), int arg, int width) {
    uint64_t lanes[32];
    warp_exchange(to_bits(v), lanes);
    unsigned lane = linear_id() % 32;
    return from_bits<T>(lanes[shuffle_source(lane, source_of_lane(lane, arg), width)]);
}

inline int xor_source(unsigned lane, int mask) { return (int)(lane ^ (unsigned)mask); }
inline int down_source(unsigned lane, int delta) { return (int)lane + delta; }
inline int up_source(unsigned lane, int delta) { return (int)lane - delta; }
inline int index_source(unsigned, int source) { return source; }

// Registers a kernel under its name for launches by name (see TALLOW_EXPORT).
using Trampoline = void (*)(void* kernel, void** params);
void register_kernel(const char* name, void* kernel, Trampoline call, const unsigned* sizes,
                     unsigned n_params);

template <class... A, std::size_t... I>
void call_with(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<A>*>(params[I])...);
}

template <class... A>
struct Registration {
    Registration(const char* name, void (*kernel)(A...)) {
        static const unsigned sizes[sizeof...(A) + 1] = {(unsigned)sizeof(A)..., 0};
        register_kernel(
            name, (void*)kernel,
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

}  // namespace tallow_emu

template <class T>
T __ldg(const T* p) {
    return *p;
}

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
