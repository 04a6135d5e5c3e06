// cuda-hopper: named CTA barriers (PTX ISA "bar.sync / bar.arrive"), used by
// the consumer warpgroups' ping-pong schedule (consumer.cuh). Checked by
// compiling for sm_90a and by tests/gpu/test_hopper_forward.cpp (an
// unbalanced barrier deadlocks there).
//
// A barrier completes when `threads` threads (a multiple of the warp size;
// every thread of an arriving warp counts) have arrived; bar.sync arrives
// and waits, bar.arrive only arrives. Both must be executed by whole warps.
// IDs 0..15 exist; 0 is __syncthreads'; the forward uses IDs from
// kFirstNamedBarrier on, clear of the low IDs libraries like CUTLASS reserve.
#pragma once

#include <cstdint>

namespace gqattn::hopper::ptx {

constexpr uint32_t kFirstNamedBarrier = 8;
constexpr uint32_t kNamedBarrierCount = 16;

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace gqattn::hopper::ptx
