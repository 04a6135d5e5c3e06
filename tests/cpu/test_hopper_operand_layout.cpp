// cuda-hopper's K-major operand layout and Q's register fragments
// (src/cuda/hopper/operand_layout.hpp), without a GPU: the layout against
// the TMA's 128-byte swizzle written as bit operations (Swizzle<3, 4, 3>:
// address bits 4-6 XOR bits 7-9), and the ldmatrix addresses of
// load_q_fragments by simulating ldmatrix.x4 on a tile whose every element
// holds its own (row, column): each thread must receive the m16n8k16 A
// fragment that wgmma's register A operand expects.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/hopper/operand_layout.hpp"

namespace {

using gqattn::hopper::a_fragment_ldmatrix_offset;
using gqattn::hopper::accumulator_stmatrix_offset;
using gqattn::hopper::chunk_stmatrix_offset;
using gqattn::hopper::k_major_offset;
using gqattn::hopper::kOutChunkBytes;
using gqattn::hopper::kOutChunkRows;
using gqattn::hopper::out_chunk_offset;

constexpr int kRows = 128;  // the forward's kBlockM

uint32_t tma_swizzle_128b(int row, int col, int rows) {
  const uint32_t linear = uint32_t((col / 64) * rows * 128 + row * 128 + (col % 64) * 2);
  return linear ^ (((linear >> 7) & 7u) << 4);
}

uint16_t element_id(int row, int col) { return uint16_t(row * 256 + col); }

TEST(HopperOperandLayout, KMajorOffsetIsTheTma128ByteSwizzle) {
  for (int d : {64, 128, 256})
    for (int row = 0; row < kRows; ++row)
      for (int col = 0; col < d; ++col)
        ASSERT_EQ(k_major_offset(row, col, kRows), tma_swizzle_128b(row, col, kRows))
            << "row " << row << " col " << col << " d " << d;
}

// ldmatrix.x4 as the PTX ISA defines it: matrix i's eight rows come from the
// addresses of lanes 8i .. 8i + 7 (16 bytes each); thread t receives in
// register i the two elements 2 (t % 4), + 1 of row t / 4 of matrix i.
TEST(HopperOperandLayout, QFragmentsAreTheWgmmaAFragment) {
  for (int d : {64, 128}) {
    std::vector<uint8_t> tile(std::size_t(kRows) * d * 2);
    for (int row = 0; row < kRows; ++row)
      for (int col = 0; col < d; ++col) {
        const uint16_t id = element_id(row, col);
        std::memcpy(&tile[k_major_offset(row, col, kRows)], &id, sizeof id);
      }
    for (int warp_row0 : {0, 64})  // the two consumer warpgroups' rows
      for (int warp = 0; warp < 4; ++warp)
        for (int kk = 0; kk < d / 16; ++kk)
          for (int t = 0; t < 32; ++t)
            for (int i = 0; i < 4; ++i) {
              const int source_lane = 8 * i + t / 4;
              const uint32_t row_address = uint32_t(warp_row0 * 128) +
                                           a_fragment_ldmatrix_offset(kk, warp, source_lane, kRows);
              for (int half = 0; half < 2; ++half) {
                uint16_t got;
                std::memcpy(&got, &tile[row_address + 4 * (t % 4) + 2 * half], sizeof got);
                const int row = warp_row0 + 16 * warp + t / 4 + 8 * (i % 2);
                const int col = 16 * kk + 8 * (i / 2) + 2 * (t % 4) + half;
                ASSERT_EQ(got, element_id(row, col))
                    << "d " << d << " warp " << warp << " kk " << kk << " thread " << t
                    << " register " << i << " half " << half;
              }
            }
  }
}

// Each lane's ldmatrix source is one whole 16-byte row chunk: aligned, and
// all 8 elements of a matrix row contiguous in it.
TEST(HopperOperandLayout, LdmatrixRowsAreAligned16ByteChunks) {
  for (int kk = 0; kk < 8; ++kk)
    for (int warp = 0; warp < 4; ++warp)
      for (int lane = 0; lane < 32; ++lane) {
        const uint32_t at = a_fragment_ldmatrix_offset(kk, warp, lane, kRows);
        EXPECT_EQ(at % 16, 0u);
        const int row = 16 * warp + (lane / 8) % 2 * 8 + lane % 8;
        const int col0 = 16 * kk + 8 * (lane / 16);
        for (int e = 0; e < 8; ++e)
          EXPECT_EQ(k_major_offset(row, col0 + e, kRows), at + uint32_t(2 * e));
      }
}

// stage_rows's stmatrix.x4, simulated: register m of
// thread t goes to row t / 4 of matrix m, at the row address that lane
// 8 m + t / 4 supplies, 4 (t % 4) bytes in. Each thread's pair of the wgmma
// accumulator (block i, rows g and g + 8, columns 8 i + 2 (t % 4), + 1) must
// land where the K-major layout puts that row and column, as the 32-bit
// stores put it; the row addresses must be 16-byte aligned.
TEST(HopperOperandLayout, AccumulatorStmatrixPutsEachPairAtItsKMajorPlace) {
  constexpr int kTileRows = 64;  // a warpgroup's staging tile
  for (int cols : {64, 128, 256})
    for (int warp = 0; warp < 4; ++warp)
      for (int block = 0; block < cols / 8; block += 2) {
        for (int lane = 0; lane < 32; ++lane)
          ASSERT_EQ(accumulator_stmatrix_offset(block, warp, lane, kTileRows) % 16, 0u);
        for (int t = 0; t < 32; ++t)
          for (int m = 0; m < 4; ++m) {
            const uint32_t got =
                accumulator_stmatrix_offset(block, warp, 8 * m + t / 4, kTileRows) + 4 * (t % 4);
            const int row = 16 * warp + t / 4 + 8 * (m % 2);
            const int col = 8 * (block + m / 2) + 2 * (t % 4);
            ASSERT_EQ(got, k_major_offset(row, col, kTileRows))
                << "cols " << cols << " warp " << warp << " block " << block << " thread " << t
                << " register " << m;
          }
      }
}

// The fused dQ's dS^T stores (backward_dq_fused.cuh store_ds_rows) by
// stmatrix.x4 (docs/decisions/hopper-backward-stmatrix-ds.md): register j of k-step kk's A fragment
// (row g + 8 (j & 1), columns 16 kk + 8 (j >> 1) + 2t of the warp's 16
// rows) must land where the 32-bit form stores it: row r at r * 128 bytes,
// its 16-byte chunk c at c ^ (r % 8), the pair at 4t within the chunk.
TEST(HopperOperandLayout, DsStmatrixPutsEachPairWhereThe32BitStoresDo) {
  constexpr int kDsRows = 64;  // a warpgroup's keys
  constexpr int kSteps = 4;    // k-steps of 16 queries: one 128-byte row
  for (int warp = 0; warp < 4; ++warp)
    for (int kk = 0; kk < kSteps; ++kk)
      for (int lane = 0; lane < 32; ++lane)
        for (int j = 0; j < 4; ++j) {
          const int g = lane / 4, t = lane % 4;
          const uint32_t r = uint32_t(warp * 16 + g + 8 * (j & 1));
          const uint32_t chunk = uint32_t(2 * kk + (j >> 1));
          const uint32_t want = r * 128 + ((chunk ^ (r % 8)) << 4) + uint32_t(4 * t);
          const uint32_t got =
              accumulator_stmatrix_offset(2 * kk, warp, 8 * j + g, kDsRows) + uint32_t(4 * t);
          ASSERT_EQ(got, want) << "warp " << warp << " kk " << kk << " lane " << lane << " j " << j;
        }
}

// store_output_by_warp_chunks's stmatrix.x4, simulated
// as above: each thread's pair (piece j, rows t / 4 and t / 4 + 8, columns
// 2 (t % 4), + 1 of the piece) must land where the 32-bit stores put it,
// out_chunk_offset(row, j) + 4 (t % 4); and each matrix's 8 row addresses
// must take 8 distinct 16-byte bank groups.
TEST(HopperOperandLayout, ChunkStmatrixPutsEachPairWhereThe32BitStoresDo) {
  constexpr int kPieces = 4;
  for (int piece = 0; piece < kPieces; piece += 2) {
    for (int t = 0; t < 32; ++t)
      for (int m = 0; m < 4; ++m) {
        const uint32_t got = chunk_stmatrix_offset(piece, 8 * m + t / 4) + 4 * (t % 4);
        const uint32_t want = out_chunk_offset(t / 4 + 8 * (m % 2), piece + m / 2) + 4 * (t % 4);
        ASSERT_EQ(got, want) << "piece " << piece << " thread " << t << " register " << m;
      }
    for (int m = 0; m < 4; ++m) {
      std::vector<bool> group(8, false);
      for (int lane = 8 * m; lane < 8 * m + 8; ++lane) {
        const uint32_t at = chunk_stmatrix_offset(piece, lane);
        ASSERT_EQ(at % 16, 0u);
        EXPECT_FALSE(group[at / 16 % 8]) << "piece " << piece << " lane " << lane;
        group[at / 16 % 8] = true;
      }
    }
  }
}

// The epilogue's per-warp chunk of O (out_chunk_offset, epilogue.cuh
// store_output_by_warp_chunks): every (row, piece) has its own aligned 16
// bytes inside the chunk; the accumulator's 32-bit stores (lane: row
// lane / 4 + 8 half, column 2 (lane % 4) of piece j) hit 32 distinct
// banks per instruction; and the 16-byte reads (lane: row 8 k + lane / 4,
// piece lane % 4), served 8 lanes at a time, hit 32 distinct banks per 8
// lanes.
TEST(HopperOperandLayout, OutputChunkIsABijectionWithoutBankConflicts) {
  constexpr int kPieces = 4, kBanks = 32, kWordBytes = 4;
  std::vector<int> owner(kOutChunkBytes / 16, -1);
  for (int row = 0; row < kOutChunkRows; ++row)
    for (int piece = 0; piece < kPieces; ++piece) {
      const uint32_t at = out_chunk_offset(row, piece);
      ASSERT_EQ(at % 16, 0u);
      ASSERT_LT(at, kOutChunkBytes);
      ASSERT_EQ(owner[at / 16], -1) << "row " << row << " piece " << piece;
      owner[at / 16] = row * kPieces + piece;
    }
  for (int half = 0; half < 2; ++half)
    for (int piece = 0; piece < kPieces; ++piece) {
      std::vector<bool> bank(kBanks, false);
      for (int lane = 0; lane < 32; ++lane) {
        const uint32_t at = out_chunk_offset(lane / 4 + 8 * half, piece) + uint32_t(lane % 4) * 4;
        const uint32_t b = at / kWordBytes % kBanks;
        EXPECT_FALSE(bank[b]) << "write: half " << half << " piece " << piece << " lane " << lane;
        bank[b] = true;
      }
    }
  for (int k = 0; k < 2; ++k)
    for (int phase = 0; phase < 4; ++phase) {
      std::vector<bool> bank(kBanks, false);
      for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
        const uint32_t at = out_chunk_offset(8 * k + lane / 4, lane % 4);
        for (uint32_t w = 0; w < 4; ++w) {
          const uint32_t b = (at / kWordBytes + w) % kBanks;
          EXPECT_FALSE(bank[b]) << "read: k " << k << " lane " << lane;
          bank[b] = true;
        }
      }
    }
}

}  // namespace
