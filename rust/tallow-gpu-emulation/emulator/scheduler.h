// The GPU execution model on the CPU, shared by the CUDA and Metal dialects' headers
// (kernels-cuda/emulation/cuda_emulation.h, kernels-metal/emulation/metal_emulation.h), which
// compile each API's kernels unchanged as C++.
//
// A launch runs its blocks (Metal: threadgroups) one after the other; within a block, each GPU
// thread is a fiber on the calling OS thread, switched only where the kernel synchronizes, so
// a block's threads really interleave at barriers:
// - a block barrier waits until every thread of the block that has not returned arrives;
// - warp operations (Metal: SIMD-group functions) exchange values between the threads of a
//   warp (32 consecutive thread ids), all of which must reach the same operation: a warp that
//   diverges there is reported, not guessed at;
// - block-shared variables (__shared__, threadgroup) are statics: one block runs at a time;
// - atomics are plain read-modify-writes (one fiber runs at a time).
// Bugs that only a real GPU's memory model shows (missing fences between blocks, races that
// the interleaving here happens to order) are out of its reach; indexing, layouts, reductions
// and tile logic are not.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace tallow_emu {

// A block's or grid's position or size along x, y and z.
struct Index3 {
    unsigned x, y, z;
    constexpr Index3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
};

// The GPU thread running now, and its block's geometry.
extern thread_local Index3 thread_idx;
extern thread_local Index3 block_idx;
extern thread_local Index3 block_dim;
extern thread_local Index3 grid_dim;

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

// Registers a kernel under its dialect and name ("cuda/rms_norm", "metal/rms_norm") for
// launches by name: `call` runs `kernel` with the launch's arguments (`params`, a pointer to
// each), whose sizes in bytes are `sizes`.
using Trampoline = void (*)(void* kernel, void** params);
void register_kernel(const char* name, void* kernel, Trampoline call, const unsigned* sizes,
                     unsigned n_params);

}  // namespace tallow_emu
