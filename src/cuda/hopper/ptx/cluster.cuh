// cuda-hopper: thin wrappers over the thread-block-cluster instructions the
// forward's K/V multicast uses (PTX ISA "Cluster", "mapa", "barrier.cluster",
// mbarrier arrive on a shared::cluster address). Addresses are 32-bit
// shared-window addresses, as in mbarrier.cuh. Checked by compiling for
// sm_90a and by tests/gpu/test_hopper_forward.cpp with K/V multicast
// (tile_sizes.hpp, the default since 2026-12-01; every d128 case without
// softcap and with an even GQA group runs on clusters: 73/73 forward tests
// passed on the H200 and compute-sanitizer memcheck is clean on the 44 d128
// cases, with the default-semantics arrival below).
#pragma once

#include <cstdint>

namespace gqattn::hopper::ptx {

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster: arrive, then wait for all.
// Release/acquire: shared-memory writes before it (barrier initialisation
// included, with mbar_init_fence) are visible to the whole cluster after
// it. Not .aligned, so threads of one warp may reach it apart.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release;\n"
      "barrier.cluster.wait.acquire;\n" ::
          : "memory");
}

// The shared::cluster address of the variable at shared-window address
// `addr` in the CTA of rank `rank` (the same offset in that CTA).
__device__ __forceinline__ uint32_t map_shared_rank(uint32_t addr, uint32_t rank) {
  uint32_t mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(mapped) : "r"(addr), "r"(rank));
  return mapped;
}

// One arrival on the mbarrier at shared::cluster address `bar` (any CTA of
// the cluster), with the instruction's default semantics (release at CTA
// scope), as CUTLASS's cluster barriers arrive: what it orders here are
// reads of a shared-memory slot that completed before it (wgmma.wait_group)
// against the other CTA's later TMA write into the slot. An explicit
// .release.cluster compiles to MEMBAR.ALL.CTA + MEMBAR.ALL.GPU before every
// arrival (ptxas 13.0), four per key tile per consumer warp.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

}  // namespace gqattn::hopper::ptx
