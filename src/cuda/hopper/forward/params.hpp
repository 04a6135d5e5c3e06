// cuda-hopper: the kernel parameters of the forward, built on the host by
// hopper_backend.cpp and passed by value as a __grid_constant__ (the TMA
// descriptors must live in parameter memory). Mask and score arguments are
// cuda-flash's (the mask policy and the softmax are shared). Checked through
// tests/gpu/test_hopper_forward.cpp.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/fused/params.hpp"
#include "cuda/fused/score_mode.hpp"

namespace gqattn::hopper {

using fused::ElemType;
using fused::MaskArgs;
using fused::RowStrides;
using fused::ScoreArgs;
using fused::ScoreMode;

struct ForwardParams {
  // Maps of q [B, Tq, H, d], k and v [B, Tk, Hkv, d], dimensions innermost
  // first (d, heads, T, B); boxes of 64 columns x 1 head x rows x 1 batch
  // (tma_desc.hpp), 128-byte swizzled, zero fill out of bounds.
  CUtensorMap q_map;
  CUtensorMap k_map;
  CUtensorMap v_map;
  // o [B, Tq, H, d]: by TMA through the map (boxes of 64 columns x 64 rows)
  // where o_by_tma and the tile stages O (ForwardTile::kStageOutputAllowed),
  // else by plain stores through the pointer and strides.
  CUtensorMap o_map;
  bool o_by_tma = false;
  // Every row of o starts 16-byte aligned: the epilogue may store O in
  // 16-byte pieces where the tile passes it through per-warp chunks
  // (the tiles that do not stage O), else two elements per 32-bit store.
  bool o_by_16_byte_stores = false;
  void* o = nullptr;
  RowStrides o_stride;
  float* lse = nullptr;  // may be null: then lse is not written
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;
  int B = 0, H = 0, Hkv = 0;
  // The tensors' head dim: the kernel's kD, or less where the problem's d
  // is padded to it (fused/problem_args.hpp kernel_head_dim): the TMA maps
  // (built on the tensors) fill the columns past it with zeros on loads
  // and clip them on stores, the plain stores skip them.
  int head_dim = 0;
  // Tasks of the grid: work tiles, (query tiles) x B x tile_heads
  // (forward_blocks), times num_splits; the launcher sets it.
  int num_tiles = 0;
  // > 1: split-KV (split_kv.hpp): each work tile's key tiles in num_splits
  // ranges, task index = tile index * num_splits + split; the tasks write
  // f32 partials, [split][B][H][Tq][d] at o_part and [split][B][H][Tq] at
  // lse_part (workspace), which forward_combine.cuh merges into o and lse.
  int num_splits = 1;
  float* o_part = nullptr;
  float* lse_part = nullptr;
  MaskArgs mask;
  ScoreArgs score;
  // > 0: packed GQA (pack_gqa.hpp): row r of a tile is query r >>
  // pack_shift of head tile.h + r % 2^pack_shift, and the q and o maps'
  // boxes span the 2^pack_shift query heads of a kv head.
  int pack_shift = 0;
  // A varlen batch's offsets (null: dense). B is then the number of
  // sequences, mask.tq and mask.tk the longest lengths, and q, k, v, o, lse
  // the packed batch-of-one views (tile_schedule.cuh varlen_tile_coord).
  fused::SequenceArgs seq;
};

// The heads work tiles are dealt over: the query heads, or packed (each
// tile holding all query heads of one kv head) the kv heads.
GQATTN_HD int tile_heads(const ForwardParams& p) { return p.pack_shift > 0 ? p.Hkv : p.H; }

}  // namespace gqattn::hopper
