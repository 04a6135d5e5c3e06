// cuda-hopper: the forward's epilogue: a consumer warpgroup's 64 rows of O
// (already normalised, f32 in the wgmma accumulator layout) rounded to the
// I/O type and stored, and lse (natural log) stored by the lane that owns
// each row (skipped when p.lse is null). Two ways for O:
// - staged (where the tile stages O and ForwardParams::o_by_tma): the
//   warpgroup writes its rows into its own staging area of shared memory,
//   swizzled as the O map expects, and its first thread stores them by
//   TMA, which clips rows past Tq; the consumers go on at once, and only
//   the next tile's epilogue waits until the copy has read the staging
//   area;
// - by warp chunks (where the tile has no room to stage O, without
//   softcap, and ForwardParams::o_by_16_byte_stores): each warp writes 32
//   columns of its 16 rows into its own 1 KB of shared memory and reads
//   them back as 16-byte pieces, four lanes per 64-byte row segment,
//   which it stores; rows past Tq are not written;
// - plain: 32-bit stores from registers, two columns each; rows past Tq are
//   not written.
// A padded head dim (ForwardParams::head_dim < kD): TMA clips the columns
// past it, the other two paths skip them.
// Packed GQA (pack_gqa.hpp): row r of the tile is query r >> pack_shift of
// head tile.h + r % 2^pack_shift; the O map's box then spans those heads and
// 64 >> pack_shift queries, one warpgroup's rows in the same order.
// Split-KV (split_kv.hpp): f32 partials instead (store_split_partial).
// Varlen (tile_schedule.cuh varlen_tile_coord): rows at tile.q_row0 + query
// of the packed tensors; TMA would clip only at the packed end and write
// the next sequence's rows, so the host never sets o_by_tma for varlen and
// O goes by the stores bounded by the sequence's tq (runtime flag: the
// dense kernels' code does not change).
// Why these paths: docs/decisions/hopper-forward-output-stores.md; both
// write shared memory by stmatrix.x4:
// docs/decisions/hopper-forward-stmatrix-staging.md.
// Checked by tests/gpu/test_hopper_forward.cpp (NaN-poisoned outputs catch
// unwritten rows, padded strides catch writes outside the tensor; an o
// stride TMA cannot take runs the plain stores and must give the same bits).
#pragma once

#include <cstdint>

#include "cuda/fused/fragment.cuh"
#include "cuda/hopper/forward/consumer_mainloop.cuh"
#include "cuda/hopper/forward/params.hpp"
#include "cuda/hopper/forward/tile_schedule.cuh"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/operand_layout.hpp"
#include "cuda/hopper/ptx/barrier.cuh"
#include "cuda/hopper/ptx/bulk_reduce.cuh"
#include "cuda/hopper/ptx/stmatrix.cuh"
#include "cuda/hopper/staged_store.cuh"

namespace gqattn::hopper {

// Named barriers of the staged epilogue, one per consumer warpgroup, after
// the ping-pong's (consumer_mainloop.cuh PingPong).
constexpr uint32_t kOutputBarrier = ptx::kFirstNamedBarrier + kMaxConsumerWarpgroups;
static_assert(kOutputBarrier + kMaxConsumerWarpgroups <= ptx::kNamedBarrierCount,
              "epilogue barrier IDs out of range");

template <class Tile, typename Elem>
__device__ __forceinline__ void store_output_staged(const ForwardParams& p, const TileCoord& tile,
                                                    int wg, const ConsumerResult<Tile::kD>& r,
                                                    uint32_t smem) {
  constexpr int kD = Tile::kD;
  using L = SmemLayout<Tile>;
  const uint32_t barrier = kOutputBarrier + uint32_t(wg);
  const uint32_t staging = smem + L::kOut + uint32_t(wg) * L::kOutWarpgroupBytes;
  const bool issuer = staged_store_issuer();
  // The previous tile's copy must have read the staging area before it is
  // overwritten; only its issuer can wait for that.
  if (issuer) ptx::bulk_wait_read_all();
  ptx::named_barrier_sync(barrier, kWarpgroupThreads);

  stage_rows<kD, Elem, /*kByStmatrix=*/true>(staging, r.o[0], 1.0f);
  // Every thread's writes, then the barrier, then the copy reads them.
  ptx::fence_proxy_async_shared();
  ptx::named_barrier_sync(barrier, kWarpgroupThreads);
  if (issuer) {
    store_staged_tile<kD>(&p.o_map, staging,
                          tile.q_row0 + ((tile.m0 + wg * kWgmmaM) >> p.pack_shift), 0, tile.h,
                          tile.tb);
    ptx::bulk_commit();
  }
}

// The query and the head of a tile row (packed or not).
struct RowTarget {
  int query, head;
};
__device__ __forceinline__ RowTarget row_target(const ForwardParams& p, const TileCoord& tile,
                                                int row) {
  const int shift = p.pack_shift;
  return {row >> shift, tile.h + (row & ((1 << shift) - 1))};
}

// The first element of O's row `at` of the tile's sequence.
template <typename Elem>
__device__ __forceinline__ Elem* output_row(const ForwardParams& p, const TileCoord& tile,
                                            RowTarget at) {
  return static_cast<Elem*>(p.o) + tile.tb * p.o_stride.batch + int64_t(at.head) * p.o_stride.head +
         int64_t(tile.q_row0 + at.query) * p.o_stride.row;
}

template <int kD, typename Elem>
__device__ __forceinline__ void store_output_plain(const ForwardParams& p, const TileCoord& tile,
                                                   int tq, int wg, const ConsumerResult<kD>& r) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int row0 = tile.m0 + wg * kWgmmaM + warp * fused::kMmaM + fused::frag_row(lane);
  const int col0 = fused::frag_col(lane);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const RowTarget at = row_target(p, tile, row0 + half * fused::kFragRowHalf);
    if (at.query >= tq) continue;
    Elem* o_row = output_row<Elem>(p, tile, at) + col0;
#pragma unroll
    for (int i = 0; i < kD / 8; ++i)
      if (i * 8 < p.head_dim)
        *reinterpret_cast<uint32_t*>(o_row + i * 8) =
            fused::pack2<Elem>(r.o[0][i][2 * half], r.o[0][i][2 * half + 1]);
  }
}

// Whether the epilogue of the kernel of `Tile` and `kScores` passes O
// through per-warp chunks (where it does not stage O): not under softcap,
// whose d256 kernel ran slower with them
// (docs/decisions/hopper-forward-output-stores.md).
template <class Tile, ScoreMode kScores>
constexpr bool chunks_output() {
  return !stages_output<Tile>() && kScores == ScoreMode::plain;
}

template <class Tile, typename Elem>
__device__ __forceinline__ void store_output_by_warp_chunks(const ForwardParams& p,
                                                            const TileCoord& tile, int tq, int wg,
                                                            const ConsumerResult<Tile::kD>& r,
                                                            uint32_t smem) {
  constexpr int kD = Tile::kD;
  constexpr int kPiecesPerRow = kOutChunkCols * kElemBytes / fused::kChunkBytes;  // 4
  constexpr int kBlocksPerChunk = kOutChunkCols / 8;  // 8-column accumulator blocks
  constexpr int kReadsPerLane = kOutChunkRows * kPiecesPerRow / kWarpSize;  // 2
  static_assert(kPiecesPerRow == 4 && kD % kOutChunkCols == 0, "chunk swizzle assumes 4 pieces");
  using L = SmemLayout<Tile>;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const uint32_t chunk = smem + L::kOut + uint32_t(wg * kWarpsPerWarpgroup + warp) * kOutChunkBytes;
  const int warp_row0 = tile.m0 + wg * kWgmmaM + warp * fused::kMmaM;
  // The rows this lane stores (fixed for every chunk): piece lane % 4 of
  // rows lane / 4 and lane / 4 + 8.
  Elem* o_rows[kReadsPerLane];
  const int piece = lane % kPiecesPerRow;
#pragma unroll
  for (int k = 0; k < kReadsPerLane; ++k) {
    const RowTarget at =
        row_target(p, tile, warp_row0 + k * kWarpSize / kPiecesPerRow + lane / kPiecesPerRow);
    o_rows[k] = at.query < tq ? output_row<Elem>(p, tile, at) + piece * 8 : nullptr;
  }
#pragma unroll
  for (int c = 0; c < kD / kOutChunkCols; ++c) {
#pragma unroll
    for (int j = 0; j < kBlocksPerChunk; j += 2) {
      const int i = c * kBlocksPerChunk + j;
      const auto& a = r.o[0];
      ptx::stmatrix_x4(chunk + chunk_stmatrix_offset(j, lane), fused::pack2<Elem>(a[i][0], a[i][1]),
                       fused::pack2<Elem>(a[i][2], a[i][3]),
                       fused::pack2<Elem>(a[i + 1][0], a[i + 1][1]),
                       fused::pack2<Elem>(a[i + 1][2], a[i + 1][3]));
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kReadsPerLane; ++k) {
      const int row = k * kWarpSize / kPiecesPerRow + lane / kPiecesPerRow;
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(chunk + out_chunk_offset(row, piece))
                   : "memory");
      if (o_rows[k] != nullptr && c * kOutChunkCols + piece * 8 < p.head_dim)
        *reinterpret_cast<uint4*>(o_rows[k] + c * kOutChunkCols) = v;
    }
    // Every lane has read the chunk before the next one overwrites it.
    __syncwarp();
  }
}

// Split-KV (split_kv.hpp): the task's rows, normalised over its range of
// key tiles, as f32 O and lse into the workspace partials (ForwardParams
// o_part, lse_part) that split_combine.cuh merges into o and lse, laid out
// by part_tq rows per (batch, head): the batch's Tq (a varlen batch's
// max_seqlen_q), while tq bounds the rows stored (the sequence's). A row
// with no kept key in the range has O 0 and lse -inf (the softmax's
// finalize), so it weighs nothing there.
template <int kD>
__device__ __forceinline__ void store_split_partial(const ForwardParams& p, const TileCoord& tile,
                                                    int tq, int part_tq, int wg,
                                                    const ConsumerResult<kD>& r) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int row0 = tile.m0 + wg * kWgmmaM + warp * fused::kMmaM + fused::frag_row(lane);
  const int col0 = fused::frag_col(lane);  // even: 8-byte aligned pairs
  const int64_t split_rows = int64_t(p.B) * p.H * part_tq;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const RowTarget at = row_target(p, tile, row0 + half * fused::kFragRowHalf);
    if (at.query >= tq) continue;
    const int64_t row =
        tile.split * split_rows + (int64_t(tile.b) * p.H + at.head) * part_tq + at.query;
    float* o = p.o_part + row * kD + col0;
#pragma unroll
    for (int i = 0; i < kD / 8; ++i)
      *reinterpret_cast<float2*>(o + i * 8) =
          make_float2(r.o[0][i][2 * half], r.o[0][i][2 * half + 1]);
    if (col0 == 0) p.lse_part[row] = r.lse[half];
  }
}

template <class Tile, typename Elem, ScoreMode kScores>
// tq: the rows of the tile's sequence; part_tq: the batch's (split-KV
// partials' layout, store_split_partial).
__device__ __forceinline__ void store_output(const ForwardParams& p, const TileCoord& tile, int tq,
                                             int part_tq, int wg, const ConsumerResult<Tile::kD>& r,
                                             uint32_t smem) {
  // A warpgroup whose rows all lie before row 0 (the first tile of an
  // end-aligned causal problem, tile_schedule.cuh query_tile_shift) has nothing
  // to store; no warpgroup has only some of its rows there.
  if (tile.m0 + wg * kWgmmaM < 0) return;
  if (p.num_splits > 1) {
    store_split_partial<Tile::kD>(p, tile, tq, part_tq, wg, r);
    return;
  }
  if (stages_output<Tile>() && p.o_by_tma)
    store_output_staged<Tile, Elem>(p, tile, wg, r, smem);
  else if (chunks_output<Tile, kScores>() && p.o_by_16_byte_stores)
    store_output_by_warp_chunks<Tile, Elem>(p, tile, tq, wg, r, smem);
  else
    store_output_plain<Tile::kD, Elem>(p, tile, tq, wg, r);

  const int lane = int(threadIdx.x) % kWarpSize;
  if (p.lse == nullptr || fused::frag_col(lane) != 0) return;
  const int warp = (int(threadIdx.x) / kWarpSize) % kWarpsPerWarpgroup;
  const int row0 = tile.m0 + wg * kWgmmaM + warp * fused::kMmaM + fused::frag_row(lane);
  float* lse = p.lse + tile.tb * p.lse_batch_stride + tile.q_row0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const RowTarget at = row_target(p, tile, row0 + half * fused::kFragRowHalf);
    if (at.query < tq) lse[at.head * p.lse_head_stride + at.query] = r.lse[half];
  }
}

// After the CTA's last tile: the TMA stores have completed (their source,
// shared memory, must stay valid until they have read it).
template <class Tile>
__device__ __forceinline__ void finish_output(const ForwardParams& p) {
  if (stages_output<Tile>() && p.o_by_tma && staged_store_issuer()) ptx::bulk_wait_all();
}

}  // namespace gqattn::hopper
