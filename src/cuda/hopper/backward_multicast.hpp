// cuda-hopper: Q / dO multicast in the backward's dK/dV grid
// (backward_tile_sizes.hpp kBwdMulticastQdo). The grid then runs in clusters
// of two CTAs on the neighbouring key tiles 2i and 2i + 1 of one (batch, kv
// head). Both walk their query tiles last first (DkdvWork), so where both
// walks end at the same query tile (no window: the last query sees every
// key) their first steps visit the same (query tile, head) in the same
// order; on those steps each CTA copies half of the Q and dO tiles into
// both CTAs' ring slots, which halves the loads from L2. Plain integer code
// for host and device: which key tile a block index names, and how many
// steps the two walks share. tests/cpu/test_hopper_bwd_multicast.cpp checks
// both on the CPU; the kernel's use of them, tests/gpu/test_hopper_backward.cpp.
#pragma once

#include "cuda/flash/smem_layout.hpp"  // GQATTN_FLASH_HD
#include "cuda/hopper/tile_order.hpp"

namespace gqattn::hopper::bwd {

constexpr int kBwdClusterCtas = 2;
static_assert(kBwdClusterCtas == 2, "a key tile's partner is n_block ^ 1");

// Block `index` of the clustered grid of kBwdClusterCtas * ceil(num_n / 2) *
// B * Hkv blocks: cluster index / 2 in key_tile_id's order over the
// ceil(num_n / 2) positions of each (batch, kv head), rank index % 2 within
// the cluster. With num_n odd the last cluster's second CTA gets n_block =
// num_n, no key tile (it visits nothing and stores nothing). The lower key
// tiles of a (batch, kv head) keep lower block indices, which the fused dQ's
// ordered adds rely on.
GQATTN_FLASH_HD KeyTileId clustered_key_tile_id(int B, int Hkv, int num_n, int pairs, int index) {
  const KeyTileId pair = key_tile_id(B, Hkv, (num_n + kBwdClusterCtas - 1) / kBwdClusterCtas, pairs,
                                     index / kBwdClusterCtas);
  return KeyTileId{kBwdClusterCtas * pair.n_block + index % kBwdClusterCtas, pair.b, pair.hk};
}

// The steps t < returned count at which two walks over the query tiles
// [own_first, own_last] and [peer_first, peer_last] (last first, `group`
// heads per query tile) visit the same (query tile, head): all steps of the
// shorter walk where both end at the same query tile, else none (an empty
// walk has last < first). The copies of a step land in slot t % stages of
// both CTAs, so only a common prefix can be shared.
GQATTN_FLASH_HD int multicast_steps(int own_first, int own_last, int peer_first, int peer_last,
                                    int group) {
  if (own_last < own_first || peer_last < peer_first || own_last != peer_last) return 0;
  const int own = own_last - own_first + 1;
  const int peer = peer_last - peer_first + 1;
  return (own < peer ? own : peer) * group;
}

}  // namespace gqattn::hopper::bwd
