// cuda-hopper: the fused dQ's key-tile pairs (backward_tile_sizes.hpp
// kBwdDqPairSum). The dK/dV grid then runs in clusters of two CTAs on the
// adjacent key tiles 2i and 2i + 1 of one (batch, kv head); on every step
// whose (query tile, query head) both visit, each CTA adds the other's dQ
// partial of one column half (over distributed shared memory) to its own
// and writes that half of the sum, so the f32 accumulator receives one add
// per pair instead of one per key tile. Plain integer code for host and
// device: which key tile a block index names, and which steps of a CTA's
// walk its pair shares. tests/cpu/test_hopper_tile_order.cpp checks both on
// the CPU; the kernel's use of them, tests/gpu/test_hopper_backward.cpp.
#pragma once

#include "cuda/flash/smem_layout.hpp"  // GQATTN_FLASH_HD
#include "cuda/hopper/tile_order.hpp"

namespace gqattn::hopper::bwd {

constexpr int kDqPairCtas = 2;
static_assert(kDqPairCtas == 2, "a key tile's partner is n_block ^ 1");

// Block `index` of the paired grid of kDqPairCtas * ceil(num_n / 2) * B *
// Hkv blocks: pair index / 2 in key_tile_id's order over the ceil(num_n / 2)
// pair positions of each (batch, kv head), rank index % 2 within the pair
// (the CTA's rank in its cluster of two consecutive blocks). With num_n odd
// the last pair's second CTA gets n_block = num_n, no key tile. Pairs keep
// key_tile_id's property: the lower key tiles of a (batch, kv head) have
// lower block indices, which the ordered adds rely on.
GQATTN_FLASH_HD KeyTileId paired_key_tile_id(int B, int Hkv, int num_n, int pairs, int index) {
  const KeyTileId pair =
      key_tile_id(B, Hkv, (num_n + kDqPairCtas - 1) / kDqPairCtas, pairs, index / kDqPairCtas);
  return KeyTileId{kDqPairCtas * pair.n_block + index % kDqPairCtas, pair.b, pair.hk};
}

// Steps [begin, end) of a walk; empty when end <= begin.
struct StepRange {
  int begin = 0;
  int end = 0;
};

// The steps of a CTA's walk whose (query tile, head) the other CTA of its
// pair visits too. Both walk their query tiles [first, last] last first,
// `group` heads per query tile (DkdvWork), so the query tiles both visit,
// [max(firsts), min(lasts)], are consecutive steps of each walk, in the same
// order in both. A range with last < first is empty (no step).
GQATTN_FLASH_HD StepRange shared_steps(int own_first, int own_last, int peer_first, int peer_last,
                                       int group) {
  const int lo = own_first > peer_first ? own_first : peer_first;
  const int hi = own_last < peer_last ? own_last : peer_last;
  if (hi < lo) return {};
  return StepRange{(own_last - hi) * group, (own_last - lo + 1) * group};
}

}  // namespace gqattn::hopper::bwd
