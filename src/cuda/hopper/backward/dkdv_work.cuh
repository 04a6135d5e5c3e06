// cuda-hopper: which key tile, kv head and batch one dK/dV CTA takes, and
// which (query tile, query head) it visits at each step: computed the same
// way by the producer, the fused dQ's writers and the consumers of
// backward_dkdv_kernel.cuh (and backward_dkdv_split_grad.cuh), so all derive
// the same steps. Checked by tests/gpu/test_hopper_backward.cpp and, for the
// grid order, tests/cpu/test_hopper_tile_order.cpp.
#pragma once

#include "cuda/fused/mask.cuh"
#include "cuda/fused/params.hpp"
#include "cuda/fused/sequence.hpp"
#include "cuda/hopper/backward/sequence.cuh"
#include "cuda/hopper/tile_order.hpp"

namespace gqattn::hopper::bwd {

// The work of one dK/dV CTA, computed identically by producer and consumers.
struct DkdvWork {
  int n_block;  // key tile index
  int n0;       // first key of the tile
  int b, hk;    // batch (varlen: sequence), kv head
  int tb;       // the tensors' batch coordinate: b, or 0 for a varlen batch's packed tensors
  // Sequence b's rows (fused::Sequence; dense: 0, 0, unused, Tk): TMA row
  // coordinates q_row0 + m0 and k_row0 + n0, workspace blocks from ws_row0,
  // dK/dV stored for keys < k_rows (zeros past seqused_k).
  int q_row0, k_row0, ws_row0, k_rows;
  int group;  // query heads per kv head
  int first;  // first query tile visited
  int num_m;  // query tiles visited per head
  int steps;  // group * num_m, or 0
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
__device__ __forceinline__ KeyTileId dkdv_tile(const fused::BackwardParams& p, int group_pairs) {
  const int num_pairs = p.B * p.Hkv;
  return key_tile_id(p.B, p.Hkv, int(gridDim.x) / num_pairs, group_pairs, int(blockIdx.x));
}

// `seq` is backward_sequence<kVarlen>(p, id.b) and `mask` its MaskPolicy: a
// key tile at or past the sequence's tk (or of a sequence without queries)
// gets no step, and its consumers store zeros over its rows below k_rows.
template <int kBlockN, int kBlockM, bool kVarlen>
__device__ __forceinline__ DkdvWork dkdv_work(const fused::BackwardParams& p, const KeyTileId& id,
                                              const fused::Sequence& seq,
                                              const fused::MaskPolicy& mask) {
  DkdvWork w;
  w.n_block = id.n_block;
  w.b = id.b;
  w.tb = kVarlen ? 0 : id.b;
  w.hk = id.hk;
  w.q_row0 = seq.q_row0;
  w.k_row0 = seq.k_row0;
  w.ws_row0 = seq.ws_row0;
  w.k_rows = kVarlen ? seq.k_rows : mask.tk;  // dense: the same value as before
  w.group = p.H / p.Hkv;
  w.n0 = w.n_block * kBlockN;
  // A varlen sequence's key tiles reach past its tk (the grid is sized for
  // the longest); query_blocks would see them as unmasked keys.
  const fused::BlockRange range =
      !kVarlen || w.n0 < mask.tk ? mask.query_blocks(w.n0, min(kBlockN, mask.tk - w.n0), kBlockM)
                                 : fused::BlockRange{};
  w.first = range.first;
  w.num_m = range.last - range.first + 1;
  w.steps = w.num_m > 0 ? w.group * w.num_m : 0;
  return w;
}

}  // namespace gqattn::hopper::bwd
