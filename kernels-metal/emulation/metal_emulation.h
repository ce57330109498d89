// Metal's execution model and the part of its standard library tallow's kernels use, on the
// CPU, for running the Metal kernels (kernels-metal/) without a Mac.
//
// The kernels compile as C++17 after this header, on the emulator's scheduler
// (rust/tallow-gpu-emulation/emulator/scheduler.h: a threadgroup's threads are fibers with
// real barriers; a SIMD-group is a warp of 32): threadgroup_barrier is the block barrier,
// simd_* functions exchange values within the SIMD-group (all 32 threads must reach them, a
// stricter rule than Metal's active threads, which tallow's kernels keep). The build script
// (tallow-gpu-emulation's build.rs) does what a header cannot: it makes each `threadgroup`
// array a static (one threadgroup runs at a time) while pointers to threadgroup memory stay
// plain pointers, and it registers each kernel with its parameters' [[buffer(i)]] and
// built-in attributes (threadgroup_position_in_grid, thread_position_in_threadgroup, ...),
// which C++ ignores.
//
// Address spaces are all host memory here, so a kernel that puts a pointer in the wrong one
// compiles; Metal's own compiler catches that on a Mac. Indexing, layouts, reductions and
// tile logic are checked here as the CUDA kernels' are.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "scheduler.h"

#define TALLOW_EMULATION 1
#define __METAL_VERSION__ 310

// Metal's scalar types (those the kernels use).
using ushort = unsigned short;
using uint = unsigned int;
using ulong = uint64_t;

namespace metal {

// Three-component vectors, for the built-in positions and sizes.
template <class T>
struct vec3 {
    T x, y, z;
};

}  // namespace metal

using uint3 = metal::vec3<uint>;

namespace metal {

template <class T, class U>
T as_type(U u) {
    static_assert(sizeof(T) == sizeof(U), "as_type between types of one size");
    T t;
    std::memcpy(&t, &u, sizeof t);
    return t;
}

using std::exp;
using std::fabs;
using std::fmax;
using std::isnan;
using std::ldexp;
using std::round;
using std::sqrt;
using std::tanh;

template <class T>
T min(T a, T b) {
    return b < a ? b : a;
}
template <class T>
T max(T a, T b) {
    return a < b ? b : a;
}
template <class T>
T clamp(T x, T lo, T hi) {
    return min(max(x, lo), hi);
}

// Metal's precise:: variants: the same functions here.
namespace precise {
using std::exp;
using std::log;
using std::tanh;
}  // namespace precise

enum class mem_flags { mem_none, mem_device, mem_threadgroup };

// Waits for every thread of the threadgroup.
inline void threadgroup_barrier(mem_flags) { tallow_emu::sync_block(); }

// Waits for every thread of the SIMD-group.
inline void simdgroup_barrier(mem_flags) {
    uint64_t lanes[32];
    tallow_emu::warp_exchange(0, lanes);
}

// The SIMD-group's values, each lane's, after every lane has published `v`.
template <class T>
void simd_values(T v, T* out) {
    uint64_t lanes[32];
    unsigned live = tallow_emu::warp_exchange(tallow_emu::to_bits(v), lanes);
    for (int i = 0; i < 32; ++i) {
        out[i] = (live >> i) & 1 ? tallow_emu::from_bits<T>(lanes[i]) : T{};
    }
}

template <class T>
T simd_sum(T v) {
    T values[32];
    simd_values(v, values);
    // Pairwise, as a GPU's tree reduction adds.
    for (int width = 16; width > 0; width /= 2) {
        for (int i = 0; i < width; ++i) values[i] = values[i] + values[i + width];
    }
    return values[0];
}

// The largest of the SIMD-group's values, in every lane.
template <class T>
T simd_max(T v) {
    uint64_t lanes[32];
    unsigned live = tallow_emu::warp_exchange(tallow_emu::to_bits(v), lanes);
    T best = v;
    for (int i = 0; i < 32; ++i) {
        if ((live >> i) & 1) best = max(best, tallow_emu::from_bits<T>(lanes[i]));
    }
    return best;
}

template <class T>
T simd_shuffle_xor(T v, ushort mask) {
    return tallow_emu::shuffle(v, tallow_emu::xor_source, mask, 32);
}

// SIMD-group matrices: Metal keeps a matrix spread over the SIMD-group's threads in a layout
// it does not document, and only loads, stores and multiplies it whole, all 32 threads
// together. Here every thread holds the whole matrix, and each operation waits for the
// SIMD-group first, so that one thread missing it is the divergence the emulator reports.
template <class T, int Cols, int Rows>
struct simdgroup_matrix {
    T e[Rows][Cols];
};
using simdgroup_float8x8 = simdgroup_matrix<float, 8, 8>;

template <class T, int Cols, int Rows = Cols>
simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T value) {
    simdgroup_matrix<T, Cols, Rows> m;
    for (auto& row : m.e)
        for (auto& v : row) v = value;
    return m;
}

template <class T, int Cols, int Rows>
void simdgroup_load(simdgroup_matrix<T, Cols, Rows>& d, const T* src,
                    std::size_t elements_per_row = Cols) {
    simdgroup_barrier(mem_flags::mem_none);
    for (int r = 0; r < Rows; ++r)
        for (int c = 0; c < Cols; ++c) d.e[r][c] = src[r * elements_per_row + c];
}

template <class T, int Cols, int Rows>
void simdgroup_store(const simdgroup_matrix<T, Cols, Rows>& m, T* dst,
                     std::size_t elements_per_row = Cols) {
    simdgroup_barrier(mem_flags::mem_none);
    for (int r = 0; r < Rows; ++r)
        for (int c = 0; c < Cols; ++c) dst[r * elements_per_row + c] = m.e[r][c];
    simdgroup_barrier(mem_flags::mem_none);
}

// d = a · b + c.
template <class T, int K, int Rows, int Cols>
void simdgroup_multiply_accumulate(simdgroup_matrix<T, Cols, Rows>& d,
                                   const simdgroup_matrix<T, K, Rows>& a,
                                   const simdgroup_matrix<T, Cols, K>& b,
                                   const simdgroup_matrix<T, Cols, Rows>& c) {
    simdgroup_barrier(mem_flags::mem_none);
    simdgroup_matrix<T, Cols, Rows> out;
    for (int r = 0; r < Rows; ++r) {
        for (int col = 0; col < Cols; ++col) {
            T sum = c.e[r][col];
            for (int k = 0; k < K; ++k) sum += a.e[r][k] * b.e[k][col];
            out.e[r][col] = sum;
        }
    }
    d = out;
}

}  // namespace metal

// Built-in kernel inputs, and how the emulator hands them to a kernel.
namespace tallow_emu {

// What a kernel parameter receives: an argument the host bound, or a built-in input.
enum class Input {
    Buffer,
    ThreadgroupPositionInGrid,
    ThreadPositionInThreadgroup,
    ThreadsPerThreadgroup,
    ThreadgroupsPerGrid,
    ThreadPositionInGrid,
    ThreadIndexInThreadgroup,
    ThreadIndexInSimdgroup,
    SimdgroupIndexInThreadgroup,
};

inline Index3 builtin_position(Input input) {
    switch (input) {
        case Input::ThreadgroupPositionInGrid:
            return block_idx;
        case Input::ThreadPositionInThreadgroup:
            return thread_idx;
        case Input::ThreadsPerThreadgroup:
            return block_dim;
        case Input::ThreadgroupsPerGrid:
            return grid_dim;
        case Input::ThreadPositionInGrid:
            return Index3(block_idx.x * block_dim.x + thread_idx.x,
                          block_idx.y * block_dim.y + thread_idx.y,
                          block_idx.z * block_dim.z + thread_idx.z);
        case Input::ThreadIndexInThreadgroup:
            return Index3(linear_id(), 0, 0);
        case Input::ThreadIndexInSimdgroup:
            return Index3(linear_id() % 32, 0, 0);
        case Input::SimdgroupIndexInThreadgroup:
            return Index3(linear_id() / 32, 0, 0);
        case Input::Buffer:
            break;
    }
    fault("a buffer is not a built-in input");
}

template <class T>
struct Builtin {
    static T of(Input input) { return (T)builtin_position(input).x; }
};
template <class T>
struct Builtin<metal::vec3<T>> {
    static metal::vec3<T> of(Input input) {
        Index3 p = builtin_position(input);
        return metal::vec3<T>{(T)p.x, (T)p.y, (T)p.z};
    }
};

// Parameter `A` of a kernel: the buffer argument `params[buffer]` (a pointer's or a
// reference's: Metal binds every argument as a buffer), or a built-in input by value.
template <class A>
A parameter(void** params, Input input, unsigned buffer) {
    if constexpr (std::is_pointer<A>::value || std::is_reference<A>::value) {
        if (input != Input::Buffer) fault("a built-in input of a pointer or reference type");
        return *static_cast<std::remove_reference_t<A>*>(params[buffer]);
    } else {
        return Builtin<A>::of(input);
    }
}

template <class... A, std::size_t... I>
void call_metal(void (*function)(A...), void** params, const Input* inputs,
                std::index_sequence<I...>) {
    unsigned buffers[sizeof...(A) + 1] = {};
    for (std::size_t i = 0, b = 0; i < sizeof...(A); ++i) {
        buffers[i] = (unsigned)b;
        b += inputs[i] == Input::Buffer;
    }
    function(parameter<A>(params, inputs[I], buffers[I])...);
}

// Registers a Metal kernel under "metal/<name>": its buffer parameters are the launch's
// arguments in order, sized as their types.
template <class... A>
void register_metal(const char* name, void (*function)(A...), Trampoline call,
                    const Input (&inputs)[sizeof...(A)]) {
    const unsigned sizes[] = {(unsigned)sizeof(std::remove_reference_t<A>)..., 0};
    std::vector<unsigned> buffers;
    for (std::size_t i = 0; i < sizeof...(A); ++i) {
        if (inputs[i] == Input::Buffer) buffers.push_back(sizes[i]);
    }
    register_kernel((std::string("metal/") + name).c_str(), (void*)function, call,
                    buffers.data(), (unsigned)buffers.size());
}

}  // namespace tallow_emu

// Address spaces: all memory is the host's (`threadgroup` is the build script's). A kernel is
// a function of the translation unit, which registers it.
#define device
#define constant const
#define thread
#define kernel static
