// cuda-hopper: the forward kernel (sm_90a): warp-specialised, FlashAttention-3
// style, instantiated per tile shape (Tile = ForwardTile<kD, kShape>,
// tile_sizes.hpp), element type and ScoreMode (fused/score_mode.hpp). A CTA
// of 384 threads (512 on the tall d64 tile) works through the work tiles
// (query tile of kBlockM rows, head, batch) its TileSchedule deals it, one
// CTA per SM looping over tiles (the persistent grid,
// docs/decisions/hopper-forward-persistent-grid.md):
//   warpgroup 0 (producer, setmaxnreg 24; 32 beside three consumers): one
//     thread issues every TMA copy of every tile (producer_loads.cuh); the
//     other producer threads exit at once;
//   warpgroups 1.. (consumers, setmaxnreg 240; 160 for three): 64 query rows
//     each, wgmma main loop (consumer_mainloop.cuh; GEMM issues go round the
//     warpgroups through named barriers 8.. where the tile ping-pongs), then
//     the epilogue (epilogue.cuh: O by TMA from a staging area where the
//     tile has one), per tile; the producer meanwhile loads the next tile's
//     Q (once every consumer warpgroup released Q) and K/V.
// kCluster 2 (K/V multicast, docs/decisions/hopper-forward-multicast-kv.md):
// the kernel runs in clusters of two CTAs on two query heads of one kv
// head; each producer copies half of every K/V tile into both CTAs, so the
// K/V empty barriers count both CTAs' consumer warps, barrier
// initialisation is made visible cluster-wide before any copy, and no
// thread leaves before the whole cluster is done (the other CTA may still copy into, or arrive on,
// this CTA's shared memory until then). Checked against the f64 oracle by
// tests/gpu/test_hopper_forward.cpp.
//
// kVarlen: the kernel of varlen batches (tile_schedule.cuh
// varlen_tile_coord, docs/decisions/hopper-varlen-forward.md), each tile
// with its sequence's rows and mask, the tiles without rows skipped; only
// its kCluster 1 instances on the default tile are compiled (plan.cpp).
// Only the sm_90a compilation pass has a body: wgmma and setmaxnreg exist
// nowhere else. Other passes (sm_80 in the default 80;90a build) compile a
// stub that traps; the backend never launches it (why_not refuses devices
// other than sm_90 and builds without sm_90a code).
#pragma once

#include <cstdint>

#include "cuda/fused/mask.cuh"
#include "cuda/hopper/forward/consumer_mainloop.cuh"
#include "cuda/hopper/forward/epilogue.cuh"
#include "cuda/hopper/forward/params.hpp"
#include "cuda/hopper/forward/producer_loads.cuh"
#include "cuda/hopper/forward/split_kv.hpp"
#include "cuda/hopper/forward/tile_schedule.cuh"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/ptx/bulk_reduce.cuh"
#include "cuda/hopper/ptx/cluster.cuh"
#include "cuda/hopper/ptx/grid_dependency.cuh"
#include "cuda/hopper/ptx/mbarrier.cuh"
#include "cuda/hopper/ptx/warpgroup.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GQATTN_HOPPER_DEVICE_CODE 1
#endif

namespace gqattn::hopper {

constexpr uint32_t kFullArrivals = 1;  // the producer's arrive.expect_tx

template <class Tile, typename Elem, ScoreMode kScores, int kCluster, bool kVarlen = false>
__global__ void __launch_bounds__(forward_threads<Tile>(), 1)
    forward_kernel(const __grid_constant__ ForwardParams p) {
#ifdef GQATTN_HOPPER_DEVICE_CODE
  constexpr int kD = Tile::kD;
  constexpr int kThreads = forward_threads<Tile>();
  // One mbarrier arrival per consumer warp releases a K, V or Q slot.
  constexpr uint32_t kEmptyArrivals = consumer_warpgroups<Tile>() * kWarpsPerWarpgroup;
  using L = SmemLayout<Tile>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Swizzled tiles need 1024-byte alignment (SmemLayout allots the slack).
  const uint32_t smem_unaligned = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (smem_unaligned + kSwizzleAtomBytes - 1) & ~uint32_t(kSwizzleAtomBytes - 1);

  if (threadIdx.x == 0) {
    ptx::mbar_init(smem + L::kQFull, kFullArrivals);
#pragma unroll
    for (int s = 0; s < Tile::kStages; ++s) {
      const uint32_t off = uint32_t(s) * L::kBarrierBytes;
      ptx::mbar_init(smem + L::kKFull + off, kFullArrivals);
      ptx::mbar_init(smem + L::kKEmpty + off, kCluster * kEmptyArrivals);
      ptx::mbar_init(smem + L::kVFull + off, kFullArrivals);
      ptx::mbar_init(smem + L::kVEmpty + off, kCluster * kEmptyArrivals);
    }
    ptx::mbar_init(smem + L::kQEmpty, kEmptyArrivals);
    ptx::mbar_init_fence();
  }
  if constexpr (uses_tensor_row_sums(kScores)) {
    // The tile of ones (consumer_mainloop.cuh's row sums of P), written
    // once; the fence makes these generic-proxy writes visible to wgmma
    // (async proxy) after the barrier.
    constexpr int kWords = int(L::kOnesBytes / sizeof(uint32_t));
    uint32_t* ones = reinterpret_cast<uint32_t*>(smem_raw + (smem - smem_unaligned) + L::kOnes);
    for (int i = int(threadIdx.x); i < kWords; i += kThreads)
      ones[i] = fused::pack2<Elem>(1.0f, 1.0f);
    ptx::fence_proxy_async_shared();
  }
  if constexpr (kCluster > 1)
    ptx::cluster_sync();
  else
    __syncthreads();

  // A split-KV forward's combine kernel (split_combine.cuh) may be
  // scheduled once every CTA of this grid has got here: it waits for this
  // grid's completion (griddepcontrol.wait) before it reads the partials,
  // so only its launch overlaps.
  if (p.num_splits > 1) ptx::launch_dependents();

  const MaskPolicy mask(p.mask);
  const TileSchedule<kCluster> schedule{p.num_tiles};
  const int warpgroup = ptx::warp_uniform(int(threadIdx.x) / kWarpgroupThreads);

  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<TileRegisters<Tile>::kProducer>();
    if (threadIdx.x == 0) produce<Tile, kCluster, kVarlen>(p, mask, schedule, smem);
    if constexpr (kCluster > 1) ptx::cluster_sync();
    return;
  }
  ptx::setmaxnreg_inc<TileRegisters<Tile>::kConsumer>();
  const int wg = warpgroup - 1;
  PingPong<consumer_warpgroups<Tile>()> pp{Tile::kPingPongAllowed, wg};
  int kv_base = 0;  // K/V visits of the earlier tiles, as the producer counts
  int loaded = 0;   // varlen: the tiles not skipped so far, as the producer counts
  for (int k = 0; schedule.valid(k); ++k) {
    MaskPolicy tile_mask = mask;
    const TileCoord tile = work_tile<Tile, kVarlen>(p, int(schedule.index(k)), tile_mask);
    if constexpr (kVarlen) {
      if (tile.empty) continue;
    }
    const int t = kVarlen ? loaded++ : k;
    ConsumerResult<kD> result;
    consume<Tile, Elem, kScores, kCluster, !kVarlen>(p, tile, tile_mask, smem, wg, t, kv_base, pp,
                                                     result);
    store_output<Tile, Elem, kScores>(p, tile, tile_mask.tq, mask.tq, wg, result, smem);
    kv_base += max(0, tile.keys.last - tile.keys.first + 1);
  }
  pp.drain();
  finish_output<Tile>(p);
  if constexpr (kCluster > 1) ptx::cluster_sync();
#else
  (void)p;
  __trap();  // no sm_90a code in this pass: never launched (see why_not)
#endif
}

}  // namespace gqattn::hopper
