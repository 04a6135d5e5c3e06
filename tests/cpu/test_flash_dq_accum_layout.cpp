// cuda-flash's fragment-major dQ accumulator (src/cuda/flash/dq_accum_layout.hpp):
// the offsets the dK/dV kernel adds C fragments at (a block's offset plus a
// lane's 16 bytes) are where the postprocess looks for those elements, and
// the layout is a bijection of [0, rows * d). Plain integer code, checked
// without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/flash/dq_accum_layout.hpp"

namespace {

using gqattn::flash::dq_accum_block_offset;
using gqattn::flash::dq_accum_in_block;
using gqattn::flash::dq_accum_offset;
using gqattn::flash::kDqBlockCols;
using gqattn::flash::kDqBlockRows;

constexpr int kLanes = 32;

TEST(FlashDqAccumLayout, EveryIndexHasExactlyOneElement) {
  for (const int d : {64, 128, 256}) {
    const int64_t rows = 3 * 64;  // three 64-row query tiles of one (b, h), then the next
    std::vector<int> hits(size_t(rows * d), 0);
    for (int64_t row = 0; row < rows; ++row)
      for (int col = 0; col < d; ++col) {
        const int64_t i = dq_accum_offset(row, col, d);
        ASSERT_GE(i, 0) << "d " << d << " row " << row << " col " << col;
        ASSERT_LT(i, rows * d) << "d " << d << " row " << row << " col " << col;
        ++hits[size_t(i)];
      }
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "d " << d << " index " << i;
  }
}

// What the kernel writes: lane l's C fragment of the m16n8 block at (row0,
// col0) holds rows row0 + g, row0 + g + 8 and columns col0 + 2t, col0 + 2t +
// 1 (g = l / 4, t = l % 4; values 0, 1 on the first row, 2, 3 on the
// second), at the block's offset plus dq_accum_in_block(l, v).
TEST(FlashDqAccumLayout, KernelFragmentsLandWhereThePostprocessReads) {
  for (const int d : {64, 128, 256})
    for (int64_t row0 = 0; row0 < 128; row0 += kDqBlockRows)
      for (int col0 = 0; col0 < d; col0 += kDqBlockCols)
        for (int lane = 0; lane < kLanes; ++lane)
          for (int v = 0; v < 4; ++v) {
            const int64_t row = row0 + lane / 4 + (v / 2) * 8;
            const int col = col0 + (lane % 4) * 2 + v % 2;
            EXPECT_EQ(dq_accum_block_offset(row0, col0, d) + dq_accum_in_block(lane, v),
                      dq_accum_offset(row, col, d))
                << "d " << d << " block (" << row0 << ", " << col0 << ") lane " << lane << " v "
                << v;
          }
}

// The kernel adds a lane's four values with one 16-byte reduction, and the
// postprocess reads a column pair as one 8-byte load: both must be aligned
// and contiguous.
TEST(FlashDqAccumLayout, LaneValuesAreContiguousAndAligned) {
  for (const int d : {64, 128, 256})
    for (int64_t row = 0; row < 32; ++row)
      for (int col = 0; col < d; col += 2) {
        const int64_t i = dq_accum_offset(row, col, d);
        EXPECT_EQ(i % 2, 0) << "d " << d << " row " << row << " col " << col;
        EXPECT_EQ(dq_accum_offset(row, col + 1, d), i + 1);
      }
  for (int lane = 0; lane < kLanes; ++lane) EXPECT_EQ(dq_accum_in_block(lane, 0) % 4, 0);
}

}  // namespace
