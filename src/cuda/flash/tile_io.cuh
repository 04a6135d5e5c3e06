// cuda-flash: moving [rows x d] tiles of 16-bit elements between global and
// shared memory (cp.async, 16-byte chunks, zero fill past the end) and the
// ldmatrix loads of mma fragments, on the swizzled layout of smem_layout.hpp;
// for a padded head dim, the same loads and stores bounded by the tensors'
// columns (ColumnBound). Checked through the kernels' tests against the f64
// oracle (tests/gpu/test_flash_*.cpp), including T not a multiple of a tile,
// and tests/gpu/test_padded_head_dims.cpp (poisoned columns past d); the
// fragment offsets also on the CPU (tests/cpu/test_flash_smem_layout.cpp).
#pragma once

#include <cstdint>

#include "cuda/flash/smem_layout.hpp"
#include "cuda/fused/fragment.cuh"

namespace gqattn::flash {

// smem_layout.hpp is plain C++ (checked on the CPU), so it spells the
// ldmatrix.x4 pattern's 16 rows itself; they are one mma's M and K.
static_assert(kFragmentRows == fused::kMmaM && kFragmentRows == fused::kMmaK,
              "one ldmatrix.x4 pattern per mma");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (then
// nothing is read from `src`).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? fused::kChunkBytes : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Issues the loads of a [kRows x kCols] tile whose row r starts at
// gmem + r * row_stride (elements); rows >= rows_valid are zero-filled.
// Thread tid loads chunk tid % kChunksPerRow of rows tid / kChunksPerRow +
// kRowsPerPass * it: the source is one per-thread pointer advanced by
// kRowsPerPass rows per chunk (a 64-bit add), the destination one base plus
// constants (the loads sit in the kernels' main loops, where per-chunk
// index arithmetic cost as much issue time as the copies).
template <int kRows, int kCols, int kThreads, typename Elem>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const Elem* gmem, int64_t row_stride,
                                                int rows_valid, int tid) {
  using Tile = SmemTile<kRows, kCols>;
  constexpr int kChunks = kRows * Tile::kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must divide evenly over the threads");
  static_assert(kThreads % Tile::kChunksPerRow == 0, "every pass covers whole rows");
  constexpr int kRowsPerPass = kThreads / Tile::kChunksPerRow;
  const int row0 = int(unsigned(tid) / Tile::kChunksPerRow);
  const int chunk = int(unsigned(tid) % Tile::kChunksPerRow);
  const Elem* src = gmem + row0 * row_stride + chunk * fused::kElemsPerChunk;
  const int64_t pass_stride = kRowsPerPass * row_stride;
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int row = row0 + it * kRowsPerPass;
    const bool valid = row < rows_valid;
    // An invalid row reads nothing: with a source size of 0 the copy only
    // zero-fills, so its address (past the tensor's last row) is never
    // dereferenced (CUTLASS's zfill copies rely on the same; the
    // memcheck runs cover tiles cut by Tq and Tk).
    cp_async_16(smem + Tile::offset(row, chunk), src, valid);
    src += pass_stride;
  }
}

// Copies a [kRows x kCols] tile from shared memory to global rows
// gmem + r * row_stride, for r < rows_valid, 16 bytes per store.
template <int kRows, int kCols, int kThreads, typename Elem>
__device__ __forceinline__ void store_tile(const unsigned char* smem, Elem* gmem,
                                           int64_t row_stride, int rows_valid, int tid) {
  using Tile = SmemTile<kRows, kCols>;
  constexpr int kChunks = kRows * Tile::kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must divide evenly over the threads");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int c = it * kThreads + tid;
    const int row = c / Tile::kChunksPerRow;
    const int chunk = c % Tile::kChunksPerRow;
    if (row < rows_valid) {
      const uint4 value = *reinterpret_cast<const uint4*>(smem + Tile::offset(row, chunk));
      *reinterpret_cast<uint4*>(gmem + row * row_stride + chunk * fused::kElemsPerChunk) = value;
    }
  }
}

// The columns of a tile's rows that exist in the tensors. ColumnBound<false>:
// all kCols (the kernel's own head dim), and the overloads below are the
// loads and stores above, compiled as if called directly (a kernel's dense
// instances pass it). ColumnBound<true>: the first `cols` (a multiple of 8:
// a padded head dim, fused::kernel_head_dim; a kernel's kPadded instances),
// the chunks from `cols` on zero-filled when loaded (cp.async with a source
// size of 0: nothing is read there) and skipped when stored.
template <bool kBounded>
struct ColumnBound {
  int cols;
};

// Every thread copies one chunk column of every row it touches (the passes
// cover whole rows), so the column bound is one compare per tile, folded
// into the row bound: a thread whose chunk lies past `cols` has no valid row.
template <int kCols, int kThreads>
__device__ __forceinline__ int rows_in_columns(int rows_valid, int cols, int tid) {
  constexpr int kChunksPerRow = kCols / fused::kElemsPerChunk;
  static_assert(kThreads % kChunksPerRow == 0, "every thread keeps one chunk column");
  const int chunk = int(unsigned(tid) % kChunksPerRow);
  return chunk * fused::kElemsPerChunk < cols ? rows_valid : 0;
}

template <int kRows, int kCols, int kThreads, typename Elem, bool kBounded>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const Elem* gmem, int64_t row_stride,
                                                int rows_valid, ColumnBound<kBounded> cols,
                                                int tid) {
  if constexpr (kBounded) rows_valid = rows_in_columns<kCols, kThreads>(rows_valid, cols.cols, tid);
  load_tile_async<kRows, kCols, kThreads>(smem, gmem, row_stride, rows_valid, tid);
}

template <int kRows, int kCols, int kThreads, typename Elem, bool kBounded>
__device__ __forceinline__ void store_tile(const unsigned char* smem, Elem* gmem,
                                           int64_t row_stride, int rows_valid,
                                           ColumnBound<kBounded> cols, int tid) {
  if constexpr (kBounded) rows_valid = rows_in_columns<kCols, kThreads>(rows_valid, cols.cols, tid);
  store_tile<kRows, kCols, kThreads>(smem, gmem, row_stride, rows_valid, tid);
}

// Writes one C fragment (16 x 8, f32) of the warp into a shared tile as
// 16-bit values, rows row0.., columns col0.., optionally scaled.
template <typename Tile, typename Elem>
__device__ __forceinline__ void store_acc_frag(unsigned char* smem, const float (&c)[4], int row0,
                                               int col0, float scale, int lane) {
  const int row = row0 + fused::frag_row(lane);
  const int col = col0 + fused::frag_col(lane);
  *reinterpret_cast<uint32_t*>(smem + Tile::elem_offset(row, col)) =
      fused::pack2<Elem>(c[0] * scale, c[1] * scale);
  *reinterpret_cast<uint32_t*>(smem + Tile::elem_offset(row + fused::kFragRowHalf, col)) =
      fused::pack2<Elem>(c[2] * scale, c[3] * scale);
}

// Writes one C fragment as 16-bit values at byte `offset` of a shared tile
// (smem_layout.hpp's c_fragment_offset*): rows g and g + 8.
template <typename Tile, typename Elem>
__device__ __forceinline__ void store_acc_frag_at(unsigned char* tile, uint32_t offset,
                                                  const float (&c)[4]) {
  *reinterpret_cast<uint32_t*>(tile + offset) = fused::pack2<Elem>(c[0], c[1]);
  *reinterpret_cast<uint32_t*>(tile + offset + fused::kFragRowHalf * Tile::kRowBytes) =
      fused::pack2<Elem>(c[2], c[3]);
}

// ---- fragment loads (see mma.cuh for the register layouts) ------------------
// Addresses: smem_layout.hpp's *_fragment_address (one XOR per load).

// A fragment (16 rows x k16) at rows row0..row0+15 (row0 a multiple of 8),
// k-step kk, of a tile stored [row][k].
template <typename Tile>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t tile, int row0, int kk,
                                       int lane) {
  fused::ldsm_x4(a, a_fragment_address<Tile>(tile, row0, kk, lane));
}

// A fragment (16 rows x k16) at rows row0..row0+15 (row0 a multiple of 16),
// k-step kk, of a tile stored transposed, [k][row] (dS^T in the dK/dV
// kernel's dQ partial), via ldmatrix.trans. Matrix i = lane / 8 is a0..a3:
// odd i are rows + 8 (the next chunk), i >= 2 are k + 8 (the next 8 rows).
template <typename Tile>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], uint32_t tile, int row0, int kk,
                                             int lane) {
  fused::ldsm_x4_trans(a, a_trans_fragment_address<Tile>(tile, row0, kk, lane));
}

// B fragments of two n8 tiles (n = n0..n0+15, n0 a multiple of 8) at k-step
// kk, from a tile stored [n][k] (K in S = Q K^T). b[0], b[1]: n-tile n0;
// b[2], b[3]: n0 + 8.
template <typename Tile>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], uint32_t tile, int n0, int kk, int lane) {
  fused::ldsm_x4(b, b_fragment_address<Tile>(tile, n0, kk, lane));
}

// B fragments of two n8 tiles (n = n0..n0+15, n0 a multiple of 16) at
// k-step kk, from a tile stored [k][n] (V in O = P V), via ldmatrix.trans.
// b[0], b[1]: n-tile n0; b[2], b[3]: n0 + 8.
template <typename Tile>
__device__ __forceinline__ void load_b_trans(uint32_t (&b)[4], uint32_t tile, int n0, int kk,
                                             int lane) {
  fused::ldsm_x4_trans(b, b_trans_fragment_address<Tile>(tile, n0, kk, lane));
}

}  // namespace gqattn::flash
