// cuda-hopper: which key tile, kv head and batch one dK/dV CTA takes, and
// which (query tile, query head) it visits at each step: computed the same
// way by the producer, the fused dQ's writers and the consumers of
// backward_dkdv_kernel.cuh (and backward_dkdv_split_grad.cuh), so all derive
// the same steps. Checked by tests/gpu/test_hopper_backward.cpp and, for the
// grid order, tests/cpu/test_hopper_tile_order.cpp.
#pragma once

#include "cuda/fused/mask.cuh"
#include "cuda/fused/params.hpp"
#include "cuda/hopper/tile_order.hpp"

namespace gqattn::hopper::bwd {

// The work of one dK/dV CTA, computed identically by producer and consumers.
struct DkdvWork {
  int n_block;  // key tile index
  int n0;       // first key of the tile
  int b, hk;    // batch, kv head
  int group;    // query heads per kv head
  int first;    // first query tile visited
  int num_m;    // query tiles visited per head
  int steps;    // group * num_m, or 0
  // Step t: query tile first + num_m - 1 - t / group (the last first), query
  // head hk * group + t % group. Every key tile that visits a query tile
  // from its last visited query tile on (no mask, causal: all of them)
  // reaches (query tile, head) at the same step; under a window a higher
  // key tile reaches it later. The fused dQ's add order relies on this.
  __device__ int head(int t) const { return hk * group + t % group; }
  __device__ int m0(int t, int block_m) const { return (first + num_m - 1 - t / group) * block_m; }
};

// Grid order (tile_order.hpp key_tile_id): key-tile major, the first key
// tiles (most queries under a causal mask) first, in groups of group_pairs
// (batch, kv head) pairs (0: one group of all). The fused dQ's ordered adds
// make a key tile wait only for lower key tiles of its own (b, kv head),
// which have lower block indices in every grouping, so they were dispatched
// before it (in-order dispatch, as FA3's deterministic mode and CUTLASS's
// stream-K assume): no wait can deadlock.
template <int kBlockN, int kBlockM>
__device__ __forceinline__ DkdvWork dkdv_work(const fused::BackwardParams& p,
                                              const fused::MaskPolicy& mask, int group_pairs) {
  DkdvWork w;
  const int num_pairs = p.B * p.Hkv;
  const KeyTileId id =
      key_tile_id(p.B, p.Hkv, int(gridDim.x) / num_pairs, group_pairs, int(blockIdx.x));
  w.n_block = id.n_block;
  w.b = id.b;
  w.hk = id.hk;
  w.group = p.H / p.Hkv;
  w.n0 = w.n_block * kBlockN;
  const fused::BlockRange range = mask.query_blocks(w.n0, min(kBlockN, mask.tk - w.n0), kBlockM);
  w.first = range.first;
  w.num_m = range.last - range.first + 1;
  w.steps = w.num_m > 0 ? w.group * w.num_m : 0;
  return w;
}

}  // namespace gqattn::hopper::bwd
