// cuda-hopper: the fused dQ's writers (backward_dkdv_kernel.cuh, threads of
// the producer warpgroup): each moves the dQ partials the consumer
// warpgroups staged (backward_dq_fused.cuh stage_dq) into the f32
// accumulator by bulk copies, in a fixed order across the key tiles that
// visit a query tile, which semaphores in global memory enforce. The
// conversion kernel (backward_dq_convert.cuh) reads the accumulator back
// once the semaphore of a block says every add has landed. Checked by
// tests/gpu/test_hopper_backward.cpp (dq against the f64 oracle, bitwise
// determinism over two runs).
#pragma once

#include <cstdint>

#include "cuda/fused/mask.cuh"
#include "cuda/hopper/backward/dkdv_work.cuh"
#include "cuda/hopper/backward/dq_fused.cuh"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/backward/tile_sizes.hpp"
#include "cuda/hopper/ptx/bulk_reduce.cuh"
#include "cuda/hopper/ptx/mbarrier.cuh"

namespace gqattn::hopper::bwd {

// Fused dQ: run by kDqWriters threads of the producer warpgroup; writer
// `writer` takes the steps t = writer mod kDqWriters, each announced on its
// own dq_full barrier (phase t / kDqWriters). The staging is one buffer, so
// the writers' reads, and their dq_empty arrivals, come in step order; by
// turns (dq_by_turns) writer b reads buffer b, where consumer warpgroup b
// stages the steps t = b mod 2, and arrives on that buffer's dq_empty.
// Per step, once the consumer warpgroups have staged their partial, the
// writer moves it into the accumulator in a fixed order: the key tiles that
// visit a query tile form an interval [first, last] of tile indices (the
// mask's bounds are monotone); key tile first stores (so the accumulator
// needs no zeroing), key tile n > first waits until the block's semaphore
// reads n - first (the number of lower tiles that have written) and adds.
// Each frees the staging once the copy has read it, waits for its write to
// complete, then increments the semaphore. Key tiles walk the query tiles
// last first (DkdvWork), so a lower key tile reaches a (query tile, head)
// no later than a higher one: the CTAs that start together queue once, by
// one add's latency each, and then keep that offset. The same adds in the
// same order on every run: dq is bitwise reproducible. (Unordered adds
// into a zeroed accumulator measured slower: the adds of all key tiles to
// one block then arrive together.)
template <int kD, bool kVarlen>
__device__ __forceinline__ void dkdv_write_dq(const BackwardParams& p, const DkdvWork& w,
                                              const fused::MaskPolicy& mask, uint32_t smem,
                                              int writer) {
  using Tile = DkdvTile<kD>;
  using L = DkdvSmem<kD, true>;
  constexpr int kBM = Tile::kBlockM;
  const uint32_t full = smem + L::kDqFull + uint32_t(writer) * L::kBarrierBytes;
  // By turns, writer b's steps are staged in buffer b (DkdvSmem).
  const uint32_t buffer = Tile::kDqByTurns ? uint32_t(writer) : 0u;
  const uint32_t staging = smem + L::kDqStage + buffer * L::kDqStageBytes;
  const uint32_t empty = smem + L::kDqEmpty + buffer * L::kBarrierBytes;
  for (int t = writer; t < w.steps; t += kDqWriters) {
    const int m0 = w.m0(t, kBM);
    // Varlen: the sequence's workspace block starts at a multiple of kBM
    // rows (dense, the same as dq_accum_block).
    const int64_t block = kVarlen
                              ? (workspace_row<true>(p.c, w.b, w.head(t), w.ws_row0) + m0) / kBM
                              : dq_accum_block(w.b, w.head(t), m0 / kBM, p.c.H, p.c.tq_padded, kBM);
    float* dst = p.dq_accum + block * (int64_t(kBM) * kD);
    int* sem = p.dq_semaphores + block;
    ptx::mbar_wait(full, uint32_t((t / kDqWriters) & 1));
    // The key tile of rank 0 (the first that visits this query tile) stores,
    // which is why the accumulator is not zeroed; rank r adds once rank
    // r - 1's write has completed.
    const int first = mask.key_blocks(m0, min(kBM, mask.tq - m0), Tile::kBlockN).first;
    const int rank = w.n_block - first;
    if (rank == 0) {
      ptx::bulk_store(dst, staging, L::kDqStageBytes);
    } else {
      while (ptx::ld_acquire_gpu(sem) != rank) __nanosleep(kDqSpinNs);
      ptx::fence_proxy_async_global();
      ptx::bulk_reduce_add_f32(dst, staging, L::kDqStageBytes);
    }
    ptx::bulk_commit();
    // The staging buffer is free once read: the consumers may stage the
    // next step while this write travels to L2 (its completion takes
    // longer than a step's matrix products).
    ptx::bulk_wait_read_all();
    ptx::mbar_arrive(empty);
    ptx::bulk_wait_all();
    ptx::fence_proxy_async_global();
    ptx::red_release_gpu_add(sem, 1);
  }
}

}  // namespace gqattn::hopper::bwd
