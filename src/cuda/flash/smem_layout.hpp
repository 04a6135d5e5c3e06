// cuda-flash: the XOR-swizzled shared-memory tile layout and the per-lane
// ldmatrix address offsets of the four fragment patterns, as plain integer
// functions (host and device), so the fast offsets the kernels use are
// checked against the layout's definition on the CPU
// (tests/cpu/test_flash_smem_layout.cpp) as well as through the kernels'
// GPU tests.
//
// Layout invariant: a tile is row-major with rows of kCols 16-bit elements;
// each row is split into 16-byte chunks and chunk c of row r is stored at
// chunk position c ^ (r % 8). ldmatrix reads 8 rows at one logical chunk:
// after the swizzle those are 8 distinct 16-byte bank groups (rows are a
// multiple of 128 bytes), so loads and the 16-byte cp.async stores are free of
// bank conflicts.
//
// Fast offsets: every lane addresses rows congruent to lane mod 8 (the tile
// offsets row0 / n0 / k are multiples of 8; the transposed patterns' column
// offsets multiples of 16), so the swizzled chunk of logical chunk c is
// c ^ (lane % 8). With c = 2 kk + h (h in {0, 1}) that is
// (h ^ lane % 8) ^ 2 kk: the k-step enters as an XOR of kk << 5 on a
// per-lane offset, one instruction per load; it touches only bits below the
// row size (2 kk < kChunksPerRow, rows a power of two of bytes), so it never
// carries into the row part.
#pragma once

#include <cstdint>

#include "cuda/fused/host_device.hpp"
#include "cuda/fused/params.hpp"

namespace gqattn::flash {

constexpr int kSwizzleRows = 8;    // rows after which the XOR pattern repeats
constexpr int kFragmentRows = 16;  // rows (or k) of one ldmatrix.x4 pattern

template <int kRows, int kCols>
struct SmemTile {
  static constexpr int kRowBytes = kCols * 2;
  static constexpr int kChunksPerRow = kCols / fused::kElemsPerChunk;
  static constexpr int kBytes = kRows * kRowBytes;
  static_assert(kRowBytes % (kSwizzleRows * fused::kChunkBytes) == 0,
                "rows must span whole 128-byte swizzle atoms");
  static_assert((kRowBytes & (kRowBytes - 1)) == 0,
                "rows must be a power of two of bytes (the fast offsets XOR below the row)");
  static_assert(kRows % kSwizzleRows == 0, "rows must be a multiple of the swizzle period");

  // Byte offset of chunk `chunk` of row `row`: the layout's definition.
  GQATTN_HD static uint32_t offset(int row, int chunk) {
    return uint32_t(row * kRowBytes + ((chunk ^ (row % kSwizzleRows)) * fused::kChunkBytes));
  }
  // Byte offset of element (row, col).
  GQATTN_HD static uint32_t elem_offset(int row, int col) {
    return offset(row, col / fused::kElemsPerChunk) + uint32_t((col % fused::kElemsPerChunk) * 2);
  }
};

// Per-lane offset of the A pattern (rows lane % 16, chunk lane / 16).
template <typename Tile>
GQATTN_HD uint32_t a_lane_offset(int lane) {
  return uint32_t((lane & 15) * Tile::kRowBytes + (((lane >> 4) ^ (lane & 7)) << 4));
}
// Per-lane offset of the B pattern (rows lane % 8 + 8 (lane / 16), chunk
// (lane / 8) % 2).
template <typename Tile>
GQATTN_HD uint32_t b_lane_offset(int lane) {
  return uint32_t(((lane & 7) + ((lane >> 4) << 3)) * Tile::kRowBytes +
                  ((((lane >> 3) & 1) ^ (lane & 7)) << 4));
}
// Per-lane offset of the transposed B pattern (rows lane % 8 + 8 ((lane / 8)
// % 2), chunk lane / 16).
template <typename Tile>
GQATTN_HD uint32_t b_trans_lane_offset(int lane) {
  return uint32_t(((lane & 7) + (((lane >> 3) & 1) << 3)) * Tile::kRowBytes +
                  (((lane >> 4) ^ (lane & 7)) << 4));
}

// The row address each lane gives ldmatrix.x4 in a tile at shared address
// `tile`, for the four fragment patterns (tile_io.cuh's load_*):
// A: rows row0..row0+15 (row0 a multiple of 8) at k-step kk, tile [row][k].
template <typename Tile>
GQATTN_HD uint32_t a_fragment_address(uint32_t tile, int row0, int kk, int lane) {
  return tile + uint32_t(row0 * Tile::kRowBytes) + (a_lane_offset<Tile>(lane) ^ uint32_t(kk << 5));
}
// A transposed: rows row0..row0+15 (row0 a multiple of 16) at k-step kk, tile
// [k][row]: the B pattern's lane offset with the column block row0 / 8 (even)
// XORed in.
template <typename Tile>
GQATTN_HD uint32_t a_trans_fragment_address(uint32_t tile, int row0, int kk, int lane) {
  return tile + uint32_t(kk * kFragmentRows * Tile::kRowBytes) +
         (b_lane_offset<Tile>(lane) ^ uint32_t(row0 << 1));
}
// B: n = n0..n0+15 (n0 a multiple of 8) at k-step kk, tile [n][k].
template <typename Tile>
GQATTN_HD uint32_t b_fragment_address(uint32_t tile, int n0, int kk, int lane) {
  return tile + uint32_t(n0 * Tile::kRowBytes) + (b_lane_offset<Tile>(lane) ^ uint32_t(kk << 5));
}
// B transposed: n = n0..n0+15 (n0 a multiple of 16) at k-step kk, tile
// [k][n]; the column block n0 / 8 (even) enters as an XOR, like kk above.
template <typename Tile>
GQATTN_HD uint32_t b_trans_fragment_address(uint32_t tile, int n0, int kk, int lane) {
  return tile + uint32_t(kk * kFragmentRows * Tile::kRowBytes) +
         (b_trans_lane_offset<Tile>(lane) ^ uint32_t(n0 << 1));
}

// C fragments (mma.cuh: lane holds row lane / 4, columns 2 (lane % 4) and
// + 1, and the same columns 8 rows down) stored as 16-bit values into a
// tile [row][col]. The offset of a fragment at rows row0.. (a multiple of 8)
// and columns col0.. (a multiple of 8):
template <typename Tile>
GQATTN_HD uint32_t c_fragment_offset(int row0, int col0, int lane) {
  return Tile::elem_offset(row0 + (lane >> 2), col0 + 2 * (lane & 3));
}
// ... and of the fragment dr rows (a multiple of 8) and nt n8 tiles further,
// from `base` = c_fragment_offset(row0, col0, lane), when col0 / 8 is a
// multiple of a power of two above nt: the chunk col0 / 8 + nt is then
// col0 / 8 ^ nt, so nt enters as an XOR on the chunk bits and dr as a
// whole number of rows (same swizzle phase): two instructions, no
// per-store index arithmetic.
template <typename Tile>
GQATTN_HD uint32_t c_fragment_offset_at(uint32_t base, int dr, int nt) {
  return (base ^ uint32_t(nt << 4)) + uint32_t(dr * Tile::kRowBytes);
}

}  // namespace gqattn::flash
