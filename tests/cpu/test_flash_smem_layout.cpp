// cuda-flash's fragment addresses (src/cuda/flash/smem_layout.hpp): the fast
// per-lane addresses the kernels give ldmatrix (one XOR per load) against the
// layout's definition, SmemTile::offset of the (row, chunk) each lane of an
// ldmatrix.x4 must address, for every lane, k-step and tile offset of the
// tile shapes the kernels use. Plain integer code, so checked without a GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/flash/smem_layout.hpp"

namespace {

using gqattn::flash::a_fragment_address;
using gqattn::flash::a_trans_fragment_address;
using gqattn::flash::b_fragment_address;
using gqattn::flash::b_trans_fragment_address;
using gqattn::flash::kElemsPerChunk;
using gqattn::flash::SmemTile;

constexpr int kLanes = 32;
// A tile at some shared address: every address is that base plus the offset.
constexpr uint32_t kTile = 0x12000;

// Every pattern of one tile shape; rows of the tile are kRows, so the row
// offsets (multiples of 8, or 16 for the column offsets of the transposed
// patterns) stay inside it.
template <int kRows, int kCols>
void check_tile() {
  using Tile = SmemTile<kRows, kCols>;
  SCOPED_TRACE(::testing::Message() << "tile " << kRows << " x " << kCols);
  int checked = 0;
  for (int lane = 0; lane < kLanes; ++lane) {
    // ldmatrix.x4: lane l gives row l % 8 of matrix l / 8.
    const int matrix = lane / 8, row_in = lane % 8;
    for (int kk = 0; 2 * kk < Tile::kChunksPerRow; ++kk) {
      for (int row0 = 0; row0 + 16 <= kRows; row0 += 8) {
        // A [row][k]: matrices (rows +0, k +0), (rows +8, k +0), (+0, +8), (+8, +8).
        const int a_row = row0 + row_in + (matrix & 1) * 8, a_chunk = 2 * kk + matrix / 2;
        EXPECT_EQ(a_fragment_address<Tile>(kTile, row0, kk, lane),
                  kTile + Tile::offset(a_row, a_chunk))
            << "A lane " << lane << " kk " << kk << " row0 " << row0;
        // B [n][k]: matrices (n +0, k +0), (n +0, k +8), (n +8, k +0), (n +8, k +8).
        const int b_row = row0 + row_in + (matrix / 2) * 8, b_chunk = 2 * kk + (matrix & 1);
        EXPECT_EQ(b_fragment_address<Tile>(kTile, row0, kk, lane),
                  kTile + Tile::offset(b_row, b_chunk))
            << "B lane " << lane << " kk " << kk << " n0 " << row0;
        checked += 2;
      }
    }
    // The transposed patterns step k over rows and take column offsets.
    for (int kk = 0; 16 * (kk + 1) <= kRows; ++kk) {
      for (int col0 = 0; col0 + 16 <= kCols; col0 += 16) {
        // B^T [k][n]: matrices (k +0, n +0), (k +8, n +0), (k +0, n +8), (k +8, n +8).
        const int bt_row = 16 * kk + row_in + (matrix & 1) * 8;
        const int bt_chunk = col0 / kElemsPerChunk + matrix / 2;
        EXPECT_EQ(b_trans_fragment_address<Tile>(kTile, col0, kk, lane),
                  kTile + Tile::offset(bt_row, bt_chunk))
            << "B^T lane " << lane << " kk " << kk << " n0 " << col0;
        // A^T [k][row]: matrices (rows +0, k +0), (rows +8, k +0), (+0, +8), (+8, +8).
        const int at_row = 16 * kk + row_in + (matrix / 2) * 8;
        const int at_chunk = col0 / kElemsPerChunk + (matrix & 1);
        EXPECT_EQ(a_trans_fragment_address<Tile>(kTile, col0, kk, lane),
                  kTile + Tile::offset(at_row, at_chunk))
            << "A^T lane " << lane << " kk " << kk << " row0 " << col0;
        checked += 2;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(FlashSmemLayout, FastFragmentOffsetsMatchTheSwizzle) {
  check_tile<64, 64>();    // Q / dO / P^T tiles, d64 K/V
  check_tile<64, 128>();   // d128 Q, dO, K/V of 64 rows
  check_tile<128, 128>();  // d128 Q of the forward, dK/dV key tiles
  check_tile<32, 128>();   // d128 dQ kernel's 32-key tiles
  check_tile<64, 256>();   // d256
  check_tile<128, 64>();   // d64 forward Q, dK/dV P^T of 128 keys
}

// The swizzle spreads the 8 rows one ldmatrix phase reads at one logical
// chunk over 8 distinct 16-byte bank groups (no bank conflicts).
TEST(FlashSmemLayout, EightRowsAtOneChunkHitEightBankGroups) {
  using Tile = SmemTile<64, 128>;
  for (int chunk = 0; chunk < Tile::kChunksPerRow; ++chunk) {
    unsigned groups = 0;
    for (int row = 0; row < 8; ++row) groups |= 1u << ((Tile::offset(row, chunk) / 16) % 8);
    EXPECT_EQ(groups, 0xffu) << "chunk " << chunk;
  }
}

}  // namespace
