// cuda-hopper: packed GQA in the forward, where it pays: when the queries of
// one head do not fill a query tile (decoding, short chunks), the rows of a
// work tile are (query, head) pairs of all G = H / Hkv query heads of one
// kv head, row r = (i - i0) G + g for query i and head hk G + g, so each K/V
// tile the CTA loads serves G heads and the tile's rows are not mostly
// padding. ForwardParams::pack_shift is log2 G: the mask policy's
// key_blocks and apply take it to map a row to its query (r >> pack_shift),
// and the consumers shift their rows' query range once per tile
// (queries_fully_kept). The Q map's box is 64 columns x G heads x kBlockM / G
// queries and lands in shared memory in exactly that row order; the O map's
// box is 64 columns x G heads x 64 / G queries, one warpgroup's rows
// (hopper_backend.cpp); the plain O stores and lse take each row's head and
// query (epilogue.cuh). Plain C++: the host decides, the kernels read the
// shift from their parameters (the plan, plan.cpp, holds it). Checked by
// tests/cpu/test_hopper_pack_gqa.cpp (the rule) and tests/gpu/test_hopper_forward.cpp (the packed
// cases against the f64 oracle).
#pragma once

#include <cstdint>

namespace gqattn::hopper {

// G must divide one warpgroup's 64 rows (the O box holds 64 / G queries of
// G heads), hence also 128 and 192, every tile's kBlockM.
constexpr int kPackGqaMaxHeads = 64;

// log2 G, the row shift of packed tiles for a forward with query tiles of
// block_m rows, or 0 (not packed). Packed only where it cuts the work
// tiles: the queries of a head fill less than one tile (Tq < block_m) and G
// heads' queries need fewer tiles packed than one tile per head (G tiles);
// where Tq fills tiles anyway the unpacked tiles keep K/V multicast and the
// end-aligned causal tiles. G a power of two, 2 <= G <= kPackGqaMaxHeads.
constexpr int pack_gqa_shift(int block_m, int64_t Tq, int64_t H, int64_t Hkv) {
  if (Hkv <= 0 || H % Hkv != 0 || Tq <= 0 || Tq >= block_m) return 0;
  const int64_t G = H / Hkv;
  if (G < 2 || G > kPackGqaMaxHeads || (G & (G - 1)) != 0) return 0;
  const int64_t packed_tiles = (Tq * G + block_m - 1) / block_m;
  if (packed_tiles >= G) return 0;
  int shift = 0;
  while ((int64_t(1) << shift) < G) ++shift;
  return shift;
}

}  // namespace gqattn::hopper
