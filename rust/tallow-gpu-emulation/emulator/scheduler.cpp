// The scheduler of scheduler.h: blocks one after the other, a block's threads as fibers.
//
// On x86-64 a fiber switch saves and restores the callee-saved registers and the stack pointer
// (a few nanoseconds); elsewhere ucontext does it (with a system call for the signal mask on
// every switch; TALLOW_EMU_UCONTEXT picks it on x86-64 too). Fiber stacks are mapped once per OS thread and reused by every launch.

#include "scheduler.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#if !defined(__x86_64__) || defined(TALLOW_EMU_UCONTEXT)
#include <ucontext.h>
#endif

namespace tallow_emu {

thread_local Index3 thread_idx;
thread_local Index3 block_idx;
thread_local Index3 block_dim;
thread_local Index3 grid_dim;

namespace {

#if defined(__x86_64__) && !defined(TALLOW_EMU_UCONTEXT)
// Saves the callee-saved registers, x87 and SSE control words on the current stack, stores
// the stack pointer in *from, and resumes the context saved at `to` (System V ABI).
extern "C" void tallow_emu_switch(void** from, void* to);
asm(R"(
    .text
    .p2align 4
    .type tallow_emu_switch, @function
tallow_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size tallow_emu_switch, .-tallow_emu_switch
)");

// A context where the scheduler or a fiber was suspended: its saved stack pointer.
struct Context {
    void* sp = nullptr;
};

void switch_to(Context& from, Context& to) { tallow_emu_switch(&from.sp, to.sp); }

// Prepares `c` to start `entry` on the stack [base, base + bytes): the frame that
// tallow_emu_switch pops, returning into `entry` as if called (its stack 16-byte aligned
// plus the return address, which is never used: `entry` never returns).
void prepare(Context& c, char* base, size_t bytes, void (*entry)()) {
    uintptr_t top = ((uintptr_t)base + bytes) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)top;
    *--sp = 0;                 // the return address of `entry`
    *--sp = (uint64_t)entry;   // where the switch returns to
    for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp, rbx, r12..r15
    --sp;
    uint32_t control[2] = {0x1f80, 0x037f};  // MXCSR and the x87 control word at start-up
    std::memcpy(sp, control, sizeof control);
    c.sp = sp;
}
#else
struct Context {
    ucontext_t context;
};

void switch_to(Context& from, Context& to) { swapcontext(&from.context, &to.context); }

void prepare(Context& c, char* base, size_t bytes, void (*entry)()) {
    getcontext(&c.context);
    c.context.uc_stack.ss_sp = base;
    c.context.uc_stack.ss_size = bytes;
    c.context.uc_link = nullptr;
    makecontext(&c.context, entry, 0);
}
#endif

enum class State { Runnable, AtBlockBarrier, AtWarpBarrier, Done };

struct Fiber {
    Context context;
    Index3 idx;
    State state = State::Runnable;
    uint64_t published = 0;
};

// Bytes of stack per GPU thread: kernels keep small arrays in registers on a GPU, here on the
// fiber's stack.
constexpr size_t STACK_BYTES = 128 << 10;

// Stacks for up to 1024 fibers, mapped once per OS thread (pages are backed as touched).
char* stacks() {
    thread_local char* mapped = nullptr;
    if (!mapped) {
        void* p = mmap(nullptr, 1024 * STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fault("cannot map the fibers' stacks");
        mapped = (char*)p;
    }
    return mapped;
}

struct Kernel {
    void* function;
    Trampoline call;
    std::vector<unsigned> sizes;
};

struct Block {
    Context scheduler;
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
    switch_to(block->running->context, block->scheduler);
    fault("a finished GPU thread was resumed");
}

// Back to the scheduler, in state `state`, until it runs this fiber again.
void yield(State state) {
    Fiber* self = block->running;
    self->state = state;
    switch_to(self->context, block->scheduler);
    thread_idx = self->idx;
}

// Releases the threads at barriers once all that must meet there have: each warp whose live
// threads all wait at a warp operation, else the block once every live thread waits at
// a block barrier. Returns false where the block can go no further (a divergent warp).
bool release(const char* name) {
    auto& fibers = block->fibers;
    bool released = false;
    for (size_t warp = 0; warp < fibers.size(); warp += 32) {
        size_t end = std::min(warp + 32, fibers.size());
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

// Runs every thread of the block to its end; false (with `failure` set) where it cannot.
bool run_block(Block& b) {
    for (;;) {
        for (auto& f : b.fibers) {
            if (f.state != State::Runnable) continue;
            b.running = &f;
            thread_idx = f.idx;
            switch_to(b.scheduler, f.context);
        }
        bool live = false;
        for (auto& f : b.fibers) live |= f.state != State::Done;
        if (!live) return true;
        if (!release(b.name)) return false;
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
    std::fprintf(stderr, "gpu emulation: %s\n", message);
    std::abort();
}

void register_kernel(const char* name, void* kernel, Trampoline call, const unsigned* sizes,
                     unsigned n_params) {
    kernels()[name] = Kernel{kernel, call, std::vector<unsigned>(sizes, sizes + n_params)};
}

}  // namespace tallow_emu

using namespace tallow_emu;

// Launches kernel `name` ("cuda/rms_norm") over `grid` blocks of `block_shape` threads with
// `params` (a pointer to each argument, as cuLaunchKernel takes them; `sizes` their sizes in
// bytes, checked against the kernel's parameters). Returns null, or a message that stays valid until the
// calling thread's next launch.
extern "C" const char* tallow_emu_launch(const char* name, const unsigned* grid,
                                         const unsigned* block_shape, void** params,
                                         const unsigned* sizes, unsigned n_params) {
    static std::mutex one_launch_at_a_time;  // block-shared statics are global
    std::lock_guard<std::mutex> lock(one_launch_at_a_time);
    auto found = kernels().find(name);
    if (found == kernels().end()) {
        failure = std::string("no kernel named ") + name;
        return failure.c_str();
    }
    const Kernel& k = found->second;
    if (k.sizes.size() != n_params || !std::equal(k.sizes.begin(), k.sizes.end(), sizes)) {
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
    char* stack = stacks();
    block_dim = Index3(block_shape[0], block_shape[1], block_shape[2]);
    grid_dim = Index3(grid[0], grid[1], grid[2]);
    Block* outer = block;
    block = &b;
    const char* result = nullptr;
    for (unsigned z = 0; z < grid[2] && !result; ++z)
        for (unsigned y = 0; y < grid[1] && !result; ++y)
            for (unsigned x = 0; x < grid[0] && !result; ++x) {
                block_idx = Index3(x, y, z);
                size_t i = 0;
                for (unsigned tz = 0; tz < block_shape[2]; ++tz)
                    for (unsigned ty = 0; ty < block_shape[1]; ++ty)
                        for (unsigned tx = 0; tx < block_shape[0]; ++tx, ++i) {
                            Fiber& f = b.fibers[i];
                            f.idx = Index3(tx, ty, tz);
                            f.state = State::Runnable;
                            prepare(f.context, stack + i * STACK_BYTES, STACK_BYTES, fiber_main);
                        }
                if (!run_block(b)) result = failure.c_str();
            }
    block = outer;
    return result;
}
