#pragma once
// A CPU emulation of the CUDA execution model, just large enough to run kernels/cuda/ and its
// tests where no GPU exists (tests/gpu/emulation/run.sh). It checks the kernels' logic: indexing,
// scans, barriers, warp votes and shuffles, tie handling. It says nothing about speed, and little
// about concurrency between blocks: blocks run one after another.
//
// Within a block every CUDA thread is a fiber on one OS thread. A scheduler resumes the runnable
// fibers in a seeded random order, each running until it reaches a barrier: __syncthreads (block),
// or a warp intrinsic (__ballot_sync, __shfl*_sync, __syncwarp), which exchanges values through
// per-warp slots between two warp barriers. So the threads of a block interleave differently at
// every sync point, and a thread that reads state another thread has already rewritten (a race a
// GPU may or may not show) changes the result. A barrier that not every thread reaches aborts.
// x86-64 only (the context switch is a few lines of assembly).

#include <math.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static  // blocks run one at a time, so a static is the running block's
#define __restrict__ __restrict

struct uint2 {
  unsigned int x, y;
};
struct uint3 {
  unsigned int x = 0, y = 0, z = 0;
};
inline uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
};

// Saves the callee-saved registers on the current stack, stores the stack pointer in *from_sp,
// and resumes the context whose stack pointer is to_sp (System V x86-64).
extern "C" void sparsync_emulation_switch(void** from_sp, void* to_sp);
asm(R"(
.pushsection .text.sparsync_emulation_switch,"axG",@progbits,sparsync_emulation_switch,comdat
.weak sparsync_emulation_switch
.type sparsync_emulation_switch,@function
sparsync_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.popsection
)");

namespace cuda_emulation {

struct Fiber {
  void* sp = nullptr;
  std::vector<char> stack;
  uint3 tid;
  bool done = false;
  bool waiting = false;
};

struct Barrier {
  int count = 0;
  int participants = 0;
  std::vector<Fiber*> parked;
};

struct Runtime {
  void* scheduler_sp = nullptr;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  uint3 block;
  dim3 block_dim, grid_dim;
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<std::array<uint64_t, 32>> slots;
  const std::function<void()>* body = nullptr;
  std::mt19937 rng{12345};
};

inline Runtime& State() {
  static Runtime runtime;
  return runtime;
}

inline void ToScheduler() { sparsync_emulation_switch(&State().current->sp, State().scheduler_sp); }

inline void Arrive(Barrier& b) {
  if (++b.count == b.participants) {
    b.count = 0;
    for (Fiber* f : b.parked) f->waiting = false;
    b.parked.clear();
    ToScheduler();  // let the others run first: more interleavings
  } else {
    b.parked.push_back(State().current);
    State().current->waiting = true;
    ToScheduler();
  }
}

inline void FiberMain() {
  (*State().body)();
  State().current->done = true;
  ToScheduler();
  std::abort();  // a finished fiber is never resumed
}

}  // namespace cuda_emulation

#define threadIdx (::cuda_emulation::State().current->tid)
#define blockIdx (::cuda_emulation::State().block)
#define blockDim (::cuda_emulation::State().block_dim)
#define gridDim (::cuda_emulation::State().grid_dim)

inline void __syncthreads() { cuda_emulation::Arrive(cuda_emulation::State().block_barrier); }
inline void __threadfence() {}

namespace cuda_emulation {

inline int Lane() { return threadIdx.x & 31; }
inline int Warp() { return threadIdx.x >> 5; }
inline void WarpBarrier() { Arrive(State().warp_barriers[Warp()]); }

template <typename T>
T Exchange(T v, int source_lane) {
  auto& slot = State().slots[Warp()];
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slot[Lane()] = bits;
  WarpBarrier();
  T got;
  std::memcpy(&got, &slot[source_lane & 31], sizeof(T));
  WarpBarrier();
  return got;
}

inline void CheckFullMask(unsigned mask) {
  if (mask != 0xFFFFFFFFu) {
    std::fprintf(stderr, "cuda emulation: only full-warp masks are emulated\n");
    std::abort();
  }
}

// Runs `body` for every thread of every block of the grid.
inline void Launch(dim3 grid, dim3 block, const std::function<void()>& body) {
  Runtime& r = State();
  const unsigned threads = block.x;
  r.body = &body;
  r.block_dim = block;
  r.grid_dim = grid;
  r.fibers.resize(threads);
  r.warp_barriers.assign((threads + 31) / 32, Barrier{});
  for (Barrier& w : r.warp_barriers) w.participants = 32;
  r.slots.assign((threads + 31) / 32, {});
  std::vector<unsigned> order(threads);
  for (unsigned b = 0; b < grid.x * grid.y; ++b) {
    r.block.x = b % grid.x;
    r.block.y = b / grid.x;
    r.block_barrier = Barrier{};
    r.block_barrier.participants = static_cast<int>(threads);
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = r.fibers[t];
      f.stack.resize(256 * 1024);
      f.done = f.waiting = false;
      f.tid = uint3{t, 0, 0};
      // A stack that "returns" into FiberMain through the switch's ret, 16-byte aligned.
      auto top = reinterpret_cast<uintptr_t>(f.stack.data() + f.stack.size()) & ~uintptr_t{15};
      auto* frame = reinterpret_cast<void**>(top);
      frame[-1] = nullptr;                               // FiberMain's return address
      frame[-2] = reinterpret_cast<void*>(&FiberMain);   // popped by ret
      for (int q = 3; q <= 8; ++q) frame[-q] = nullptr;  // the six saved registers
      f.sp = &frame[-8];
    }
    for (;;) {
      for (unsigned t = 0; t < threads; ++t) order[t] = t;
      std::shuffle(order.begin(), order.end(), r.rng);
      bool ran = false, all_done = true;
      for (unsigned t : order) {
        Fiber& f = r.fibers[t];
        if (f.done) continue;
        all_done = false;
        if (f.waiting) continue;
        ran = true;
        r.current = &f;
        sparsync_emulation_switch(&r.scheduler_sp, f.sp);
      }
      if (all_done) break;
      if (!ran) {
        std::fprintf(stderr,
                     "cuda emulation: deadlock in block %u: a barrier that not every "
                     "thread of the block reaches\n",
                     b);
        std::abort();
      }
    }
  }
}

}  // namespace cuda_emulation

inline unsigned __ballot_sync(unsigned mask, bool predicate) {
  cuda_emulation::CheckFullMask(mask);
  auto& slot = cuda_emulation::State().slots[cuda_emulation::Warp()];
  slot[cuda_emulation::Lane()] = predicate ? 1 : 0;
  cuda_emulation::WarpBarrier();
  unsigned votes = 0;
  for (int l = 0; l < 32; ++l) votes |= (slot[l] ? 1u : 0u) << l;
  cuda_emulation::WarpBarrier();
  return votes;
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int source) {
  cuda_emulation::CheckFullMask(mask);
  return cuda_emulation::Exchange(v, source);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, int delta) {
  cuda_emulation::CheckFullMask(mask);
  const int l = cuda_emulation::Lane();
  return cuda_emulation::Exchange(v, l >= delta ? l - delta : l);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, int delta) {
  cuda_emulation::CheckFullMask(mask);
  const int l = cuda_emulation::Lane();
  return cuda_emulation::Exchange(v, l + delta < 32 ? l + delta : l);
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
  cuda_emulation::CheckFullMask(mask);
  cuda_emulation::WarpBarrier();
}

// One OS thread: atomics are plain read-modify-writes.
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const auto old = *p;
  *p = old + v;
  return old;
}
template <typename T>
T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
template <typename T>
T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
template <typename T>
T __ldcg(const T* p) {
  return *p;
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(unsigned v) { return __builtin_ffs(static_cast<int>(v)); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __double2float_rn(double d) { return static_cast<float>(d); }
