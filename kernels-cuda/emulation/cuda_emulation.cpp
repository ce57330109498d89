// The scheduler of cuda_emulation.h: blocks one after the other, a block's threads as fibers.

#include "cuda_emulation.h"

#include <ucontext.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tallow_emu {

thread_local uint3 thread_idx;
thread_local uint3 block_idx;
thread_local dim3 block_dim;
thread_local dim3 grid_dim;

namespace {

enum class State { Runnable, AtBlockBarrier, AtWarpBarrier, Done };

struct Fiber {
    ucontext_t context;
    std::vector<char> stack;
    uint3 idx;
    State state = State::Runnable;
    uint64_t published = 0;
};

// Bytes of stack per GPU thread: kernels keep small arrays in registers on a GPU, here on the
// fiber's stack.
constexpr size_t STACK_BYTES = 256 << 10;

struct Kernel {
    void* function;
    Trampoline call;
    std::vector<unsigned> sizes;
};

struct Block {
    ucontext_t scheduler;
    std::vector<Fiber> fibers;
    Fiber* running = nullptr;
    void* kernel = nullptr;
    Trampoline call = nullptr;
    void** params = nullptr;
    const char* name = "";
};

thread_local Block* block = nullptr;
thread_local std::string failure;

std::map<std::string, Kernel>& kernels() {
    static std::map<std::string, Kernel> table;
    return table;
}

// Where a fiber starts: the kernel, then back to the scheduler for good.
void fiber_main() {
    block->call(block->kernel, block->params);
    block->running->state = State::Done;
    swapcontext(&block->running->context, &block->scheduler);
}

// Back to the scheduler, in state `state`, until it runs this fiber again.
void yield(State state) {
    Fiber* self = block->running;
    self->state = state;
    swapcontext(&self->context, &block->scheduler);
    thread_idx = self->idx;
}

// Releases the threads at barriers once all that must meet there have: each warp whose live
// threads all wait at a warp operation, else the block once every live thread waits at
// __syncthreads. Returns false where the block can go no further (a divergent warp).
bool release(const char* name) {
    auto& fibers = block->fibers;
    bool released = false;
    for (size_t warp = 0; warp < fibers.size(); warp += 32) {
        size_t end = warp + 32 < fibers.size() ? warp + 32 : fibers.size();
        bool waiting = false, all = true;
        for (size_t i = warp; i < end; ++i) {
            waiting |= fibers[i].state == State::AtWarpBarrier;
            all &= fibers[i].state == State::AtWarpBarrier;
        }
        if (!waiting) continue;
        if (!all) {
            failure = std::string("kernel ") + name +
                      ": a warp operation that not every thread of its warp reached "
                      "(divergent, or past a return)";
            return false;
        }
        for (size_t i = warp; i < end; ++i) fibers[i].state = State::Runnable;
        released = true;
    }
    if (released) return true;
    for (auto& f : fibers) {
        if (f.state == State::AtBlockBarrier) f.state = State::Runnable;
    }
    return true;
}

bool run_block(Block& b) {
    for (;;) {
        bool ran = false;
        for (auto& f : b.fibers) {
            if (f.state != State::Runnable) continue;
            ran = true;
            b.running = &f;
            thread_idx = f.idx;
            swapcontext(&b.scheduler, &f.context);
        }
        bool live = false;
        for (auto& f : b.fibers) live |= f.state != State::Done;
        if (!live) return true;
        if (!release(b.name)) return false;
        if (!ran) {
            bool runnable = false;
            for (auto& f : b.fibers) runnable |= f.state == State::Runnable;
            if (!runnable) {
                failure = std::string("kernel ") + b.name + ": the block cannot go on";
                return false;
            }
        }
    }
}

}  // namespace

unsigned linear_id() {
    return thread_idx.x + block_dim.x * (thread_idx.y + block_dim.y * thread_idx.z);
}

void sync_block() { yield(State::AtBlockBarrier); }

unsigned warp_exchange(uint64_t bits, uint64_t* out) {
    block->running->published = bits;
    yield(State::AtWarpBarrier);
    size_t first = linear_id() / 32 * 32;
    unsigned live = 0;
    for (size_t i = 0; i < 32; ++i) {
        bool exists = first + i < block->fibers.size();
        out[i] = exists ? block->fibers[first + i].published : 0;
        live |= (unsigned)exists << i;
    }
    // Everyone has read before anyone publishes again.
    yield(State::AtWarpBarrier);
    return live;
}

void fault(const char* message) {
    std::fprintf(stderr, "cuda emulation: %s\n", message);
    std::abort();
}

void register_kernel(const char* name, void* kernel, Trampoline call, const unsigned* sizes,
                     unsigned n_params) {
    kernels()[name] = Kernel{kernel, call, std::vector<unsigned>(sizes, sizes + n_params)};
}

}  // namespace tallow_emu

using namespace tallow_emu;

// Launches kernel `name` over `grid` blocks of `block_shape` threads with `params` (a pointer
// to each argument, as cuLaunchKernel takes them; `sizes` their sizes in bytes, checked
// against the kernel's parameters). Returns null, or a message that stays valid until the
// calling thread's next launch.
extern "C" const char* tallow_emu_launch(const char* name, const unsigned* grid,
                                         const unsigned* block_shape, void** params,
                                         const unsigned* sizes, unsigned n_params) {
    static std::mutex one_launch_at_a_time;  // __shared__ statics are global
    std::lock_guard<std::mutex> lock(one_launch_at_a_time);
    auto found = kernels().find(name);
    if (found == kernels().end()) {
        failure = std::string("no kernel named ") + name;
        return failure.c_str();
    }
    const Kernel& k = found->second;
    if (k.sizes.size() != n_params ||
        !std::equal(k.sizes.begin(), k.sizes.end(), sizes)) {
        failure = std::string("kernel ") + name + ": the arguments do not match its parameters";
        return failure.c_str();
    }
    size_t threads = (size_t)block_shape[0] * block_shape[1] * block_shape[2];
    if (threads == 0 || threads > 1024) {
        failure = std::string("kernel ") + name + ": a block of 1 to 1024 threads";
        return failure.c_str();
    }
    Block b;
    b.kernel = k.function;
    b.call = k.call;
    b.params = params;
    b.name = found->first.c_str();
    b.fibers.resize(threads);
    for (auto& f : b.fibers) f.stack.resize(STACK_BYTES);
    block_dim = dim3(block_shape[0], block_shape[1], block_shape[2]);
    grid_dim = dim3(grid[0], grid[1], grid[2]);
    Block* outer = block;
    block = &b;
    const char* result = nullptr;
    for (unsigned z = 0; z < grid[2] && !result; ++z)
        for (unsigned y = 0; y < grid[1] && !result; ++y)
            for (unsigned x = 0; x < grid[0] && !result; ++x) {
                block_idx = dim3(x, y, z);
                size_t i = 0;
                for (unsigned tz = 0; tz < block_shape[2]; ++tz)
                    for (unsigned ty = 0; ty < block_shape[1]; ++ty)
                        for (unsigned tx = 0; tx < block_shape[0]; ++tx, ++i) {
                            Fiber& f = b.fibers[i];
                            f.idx = dim3(tx, ty, tz);
                            f.state = State::Runnable;
                            getcontext(&f.context);
                            f.context.uc_stack.ss_sp = f.stack.data();
                            f.context.uc_stack.ss_size = f.stack.size();
                            f.context.uc_link = nullptr;
                            makecontext(&f.context, fiber_main, 0);
                        }
                if (!run_block(b)) result = failure.c_str();
            }
    block = outer;
    return result;
}
