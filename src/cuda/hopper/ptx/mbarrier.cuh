// cuda-hopper: thin wrappers over the shared-memory mbarrier instructions
// (PTX ISA "Parallel Synchronization and Communication Instructions:
// mbarrier") that the TMA pipeline uses. Addresses are 32-bit shared-window
// addresses (__cvta_generic_to_shared). Checked by compiling for sm_90a and by
// tests/gpu/test_hopper_forward.cpp (a wrong phase deadlocks or races there).
//
// Phases: a barrier starts in phase 0; it completes a phase when `count`
// arrivals have happened and every expected transaction byte has landed.
// wait(bar, parity) returns once the phase with that parity has completed;
// on a fresh barrier, wait(bar, 1) returns at once (the "previous" phase),
// which is how a producer passes its first wait on an empty slot.
#pragma once

#include <cstdint>

namespace gqattn::hopper::ptx {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes the initialisations visible to the other threads and to the async
// proxy (TMA); follow it with a CTA barrier.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival, and `bytes` more transaction bytes expected this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Blocks until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

}  // namespace gqattn::hopper::ptx
