// cuda-hopper: which work tile a CTA owns — (query tile, head, batch) from
// the 1-D grid, the kv head of its GQA group, and the key tiles the mask
// policy says it visits. The grid is 1-D (B*H may exceed grid.y's limit)
// and ordered so that the last query tiles, which visit the most keys under
// a causal mask, are scheduled first. Checked through
// tests/gpu/test_hopper_forward.cpp.
#pragma once

#include "cuda/flash/mask.cuh"
#include "cuda/hopper/params.hpp"

namespace gqattn::hopper {

using flash::BlockRange;
using flash::MaskPolicy;

struct TileCoord {
  int m0;           // first query row of the tile
  int rows;         // query rows of the tile that exist (< kBlockM at the Tq edge)
  int b, h, hk;     // batch, query head, kv head (h / (H / Hkv))
  BlockRange keys;  // key tiles visited, walked from keys.last down to keys.first
};

template <int kBlockM, int kBlockN>
__device__ __forceinline__ TileCoord tile_coord(const ForwardParams& p, const MaskPolicy& mask) {
  TileCoord c;
  const int num_bh = p.B * p.H;
  const int num_m = int(gridDim.x) / num_bh;
  const int m_block = num_m - 1 - int(blockIdx.x) / num_bh;
  const int bh = int(blockIdx.x) % num_bh;
  c.b = bh / p.H;
  c.h = bh % p.H;
  c.hk = c.h / (p.H / p.Hkv);
  c.m0 = m_block * kBlockM;
  c.rows = min(kBlockM, mask.tq - c.m0);
  c.keys = mask.key_blocks(c.m0, c.rows, kBlockN);
  return c;
}

}  // namespace gqattn::hopper
