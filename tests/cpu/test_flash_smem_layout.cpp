// cuda-flash's fragment addresses (src/cuda/flash/smem_layout.hpp): the fast
// per-lane addresses the kernels give ldmatrix (one XOR per load) against the
// layout's definition, SmemTile::offset of the (row, chunk) each lane of an
// ldmatrix.x4 must address, for every lane, k-step and tile offset of the
// tile shapes the kernels use; likewise the C-fragment store offsets. Plain
// integer code, so checked without a GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/flash/smem_layout.hpp"

namespace {

using gqattn::flash::a_fragment_address;
using gqattn::flash::a_trans_fragment_address;
using gqattn::flash::b_fragment_address;
using gqattn::flash::b_trans_fragment_address;
using gqattn::flash::c_fragment_offset;
using gqattn::flash::c_fragment_offset_at;
using gqattn::flash::SmemTile;
using gqattn::fused::kElemsPerChunk;

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

// The C-fragment store offsets (P^T, dS^T of the dK/dV kernel) against the
// element offsets they stand for: every lane, every row step of 8, and for
// each column base col0 every n8 tile nt below the largest power of two
// dividing col0 / 8 (that stays in the tile).
template <int kRows, int kCols>
void check_c_fragments() {
  using Tile = SmemTile<kRows, kCols>;
  SCOPED_TRACE(::testing::Message() << "tile " << kRows << " x " << kCols);
  int checked = 0;
  for (int lane = 0; lane < kLanes; ++lane)
    for (int row0 = 0; row0 < kRows; row0 += 8)
      for (int col0 = 0; col0 < kCols; col0 += 8) {
        const uint32_t base = c_fragment_offset<Tile>(row0, col0, lane);
        EXPECT_EQ(base, Tile::elem_offset(row0 + lane / 4, col0 + 2 * (lane % 4)));
        int span = 1;  // n8 tiles nt < span are allowed at col0
        while (span < Tile::kChunksPerRow && (col0 / 8) % (2 * span) == 0) span *= 2;
        for (int dr = 0; row0 + dr < kRows; dr += 8)
          for (int nt = 0; nt < span && col0 + 8 * nt < kCols; ++nt) {
            const int row = row0 + dr + lane / 4, col = col0 + 8 * nt + 2 * (lane % 4);
            EXPECT_EQ(c_fragment_offset_at<Tile>(base, dr, nt), Tile::elem_offset(row, col))
                << "lane " << lane << " row0 " << row0 << " col0 " << col0 << " dr " << dr << " nt "
                << nt;
            ++checked;
          }
      }
  EXPECT_GT(checked, 0);
}

TEST(FlashSmemLayout, CFragmentOffsetsMatchTheSwizzle) {
  check_c_fragments<128, 64>();  // d64 / d128 P^T, dS^T: 128 keys x 64 queries
  check_c_fragments<64, 64>();   // d256 P^T, dS^T
  check_c_fragments<64, 128>();
  check_c_fragments<128, 256>();
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
