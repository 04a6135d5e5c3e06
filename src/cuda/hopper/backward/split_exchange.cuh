// cuda-hopper: what the two consumer warpgroups of the backward's
// split-over-d form (d = 256, backward_tile_sizes.hpp) trade through shared
// memory. Both own the same 64 rows and need all of P and dS for their half
// of the d columns, but each computes only one of the two products S and dP:
// - exchange (no softcap, split_exchange): warpgroup 0 computes S and P,
//   warpgroup 1 dP and dP - D, and each hands its f32 tile to the other;
//   both then form dS = P (dP - D) from the same f32 values;
// - handover (softcap, split_handover): dS also needs 1 - tanh(S)^2, which
//   only warpgroup 0 has. Warpgroup 1 hands dP - D to warpgroup 0, which
//   forms P and dS and hands back their packed 16-bit A fragments, exactly
//   the registers its own wgmma read: both warpgroups multiply the same bits.
// Used by the dK/dV and the dQ kernel alike. Checked by
// tests/gpu/test_hopper_backward.cpp (the d = 256 cases with and without
// softcap, against the f64 oracle and a bitwise rerun) and compute-sanitizer.
//
// Both warpgroups hold the same (row, column) elements in the same fragment
// layout, so thread i of one warpgroup reads exactly what thread i of the
// other wrote: 16-byte group j of thread i at (j * 128 + i) * 16 bytes (a
// warp's 32 groups are 512 contiguous bytes: no bank conflicts). Buffer w
// (16 KB: 32 words per thread) is written by warpgroup w only.
//
// Named barriers (256 threads: both warpgroups):
//   ready            exchange: both buffers written (bar.sync by both);
//   sent[w]          handover: warpgroup w has written buffer w (bar.sync
//                    by both, twice a step: sent[1], then sent[0]). No free
//                    barrier is needed: a writer passes the other buffer's
//                    sync of a step only after the reader has finished
//                    reading its own buffer of the step before (program
//                    order), so sent[0] of step t orders warpgroup 0's reads
//                    of buffer 1 before warpgroup 1's write of step t + 1,
//                    and sent[1] of step t + 1 orders warpgroup 1's reads of
//                    buffer 0 before warpgroup 0's write of step t + 1;
//   free[w]          exchange: warpgroup 1 - w has read buffer w: it
//                    arrives after its read of step t (t < steps - 1), and
//                    warpgroup w syncs before its write of step t + 1, so
//                    every phase has 128 + 128 threads and none is left
//                    open at exit.
// (A handover whose writer only arrived on sent[w] made compute-sanitizer
// racecheck report every read of the tile as a race with its write.)
#pragma once

#include <cstdint>

#include "cuda/hopper/backward/dq_fused.cuh"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/ptx/barrier.cuh"

namespace gqattn::hopper::bwd {

// After kDsReadyBarrier (the fused dQ's, d <= 128 only; never in the same
// kernel instance, but kept apart anyway).
constexpr uint32_t kXchgReadyBarrier = kDsReadyBarrier + 1;
constexpr uint32_t kXchgFreeBarrier = kXchgReadyBarrier + 1;  // buffer w: + w
constexpr uint32_t kXchgSentBarrier = kXchgFreeBarrier + 2;   // buffer w: + w
static_assert(kXchgSentBarrier + 1 < ptx::kNamedBarrierCount, "named barrier IDs run out");

constexpr uint32_t kXchgThreads = 2 * kWarpgroupThreads;
constexpr uint32_t kXchgGroupBytes = 16;  // one st/ld.shared.v4 per thread

__device__ __forceinline__ uint32_t xchg_group_addr(uint32_t buffer, int j) {
  return buffer + (uint32_t(j) * kWarpgroupThreads + uint32_t(threadIdx.x) % kWarpgroupThreads) *
                      kXchgGroupBytes;
}

// One 16-byte group of four floats to / from shared address `addr`.
__device__ __forceinline__ void store_group_f32(uint32_t addr, const float (&v)[4]) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v[0]), "f"(v[1]),
               "f"(v[2]), "f"(v[3])
               : "memory");
}
__device__ __forceinline__ void load_group_f32(uint32_t addr, float (&v)[4]) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
               : "r"(addr)
               : "memory");
}

// Hands `mine` (warpgroup wg's product of step t of `steps`) to the other
// warpgroup and returns its product in `theirs`. `xchg` is the shared
// address of buffer 0 (buffer w at + w * bytes).
template <int kNT>
__device__ __forceinline__ void exchange_with_other_warpgroup(uint32_t xchg, int wg, int t,
                                                              int steps,
                                                              const float (&mine)[1][kNT][4],
                                                              float (&theirs)[1][kNT][4]) {
  constexpr uint32_t kBytes = uint32_t(kWarpgroupThreads) * kNT * kXchgGroupBytes;
  const uint32_t own = xchg + uint32_t(wg) * kBytes;
  const uint32_t other = xchg + uint32_t(1 - wg) * kBytes;
  // Buffer `own` is free once the other warpgroup has read step t - 1's.
  if (t > 0) ptx::named_barrier_sync(kXchgFreeBarrier + uint32_t(wg), kXchgThreads);
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) store_group_f32(xchg_group_addr(own, nt), mine[0][nt]);
  ptx::named_barrier_sync(kXchgReadyBarrier, kXchgThreads);
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) load_group_f32(xchg_group_addr(other, nt), theirs[0][nt]);
  if (t + 1 < steps) ptx::named_barrier_arrive(kXchgFreeBarrier + uint32_t(1 - wg), kXchgThreads);
}

// Groups [j0, j0 + kGroups) of a handover buffer from / into `words`.
template <int kGroups>
__device__ __forceinline__ void store_groups(uint32_t buffer, int j0,
                                             const uint32_t (&words)[kGroups][4]) {
#pragma unroll
  for (int j = 0; j < kGroups; ++j)
    asm volatile(
        "st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(xchg_group_addr(buffer, j0 + j)),
        "r"(words[j][0]), "r"(words[j][1]), "r"(words[j][2]), "r"(words[j][3])
        : "memory");
}
template <int kGroups>
__device__ __forceinline__ void load_groups(uint32_t buffer, int j0,
                                            uint32_t (&words)[kGroups][4]) {
#pragma unroll
  for (int j = 0; j < kGroups; ++j)
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(words[j][0]), "=r"(words[j][1]), "=r"(words[j][2]), "=r"(words[j][3])
                 : "r"(xchg_group_addr(buffer, j0 + j))
                 : "memory");
}

// Handover, writer side: warpgroup `wg` puts the 16-byte groups of its
// arrays `words` (in order) into its buffer (`xchg` + wg kBytes) for the
// other warpgroup's receive_from_other_warpgroup. Every step of both
// warpgroups makes the same sequence of handovers (see sent[w] above).
template <uint32_t kBytes, int... kGroups>
__device__ __forceinline__ void send_to_other_warpgroup(uint32_t xchg, int wg,
                                                        const uint32_t (&... words)[kGroups][4]) {
  static_assert(uint32_t((kGroups + ...)) * kWarpgroupThreads * kXchgGroupBytes <= kBytes,
                "the words fit the warpgroup's buffer");
  const uint32_t own = xchg + uint32_t(wg) * kBytes;
  int j0 = 0;
  ((store_groups(own, j0, words), j0 += kGroups), ...);
  ptx::named_barrier_sync(kXchgSentBarrier + uint32_t(wg), kXchgThreads);
}

// Handover, reader side: warpgroup `wg` waits for the other warpgroup's
// groups and copies them into `words` (the arrays the writer sent, in the
// same order).
template <uint32_t kBytes, int... kGroups>
__device__ __forceinline__ void receive_from_other_warpgroup(uint32_t xchg, int wg,
                                                             uint32_t (&... words)[kGroups][4]) {
  static_assert(uint32_t((kGroups + ...)) * kWarpgroupThreads * kXchgGroupBytes <= kBytes,
                "the words fit the other warpgroup's buffer");
  const uint32_t writer = uint32_t(1 - wg);
  const uint32_t other = xchg + writer * kBytes;
  ptx::named_barrier_sync(kXchgSentBarrier + writer, kXchgThreads);
  int j0 = 0;
  ((load_groups(other, j0, words), j0 += kGroups), ...);
}

// The f32 accumulator tile as the 16-byte groups of a handover (bit casts).
template <int kNT>
__device__ __forceinline__ void floats_to_words(const float (&acc)[1][kNT][4],
                                                uint32_t (&words)[kNT][4]) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) words[nt][e] = __float_as_uint(acc[0][nt][e]);
}
template <int kNT>
__device__ __forceinline__ void words_to_floats(const uint32_t (&words)[kNT][4],
                                                float (&acc)[1][kNT][4]) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][nt][e] = __uint_as_float(words[nt][e]);
}

}  // namespace gqattn::hopper::bwd
