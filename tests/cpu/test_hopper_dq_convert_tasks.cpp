// The fused dQ's conversion grid (src/cuda/hopper/backward_dq_convert_tasks.hpp),
// without a GPU: the persistent CTAs' tasks name every accumulator block
// exactly once, and the pending-bit array sized for CTA 0 holds every CTA's
// tasks.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/hopper/backward/dq_convert_tasks.hpp"

namespace {

using gqattn::hopper::bwd::dq_convert_block;
using gqattn::hopper::bwd::dq_convert_pending_bytes;
using gqattn::hopper::bwd::dq_convert_tasks;
using gqattn::hopper::bwd::kDqConvertChunk;

struct Shape {
  int64_t tiles, bh_count;
};

TEST(HopperDqConvertTasks, PersistentCtasConvertEveryBlockOnce) {
  const Shape shapes[] = {{1, 1}, {64, 128}, {256, 32}, {16, 512}, {3, 7}, {1, 1000}};
  for (const Shape& s : shapes) {
    const int64_t blocks = s.tiles * s.bh_count;
    for (int64_t ctas : {int64_t(1), int64_t(7), int64_t(528), blocks}) {
      if (ctas > blocks) continue;
      std::vector<int> seen(std::size_t(blocks), 0);
      for (int64_t cta = 0; cta < ctas; ++cta) {
        const int64_t tasks = dq_convert_tasks(blocks, ctas, cta);
        ASSERT_LE(tasks, dq_convert_tasks(blocks, ctas, 0)) << "CTA 0 has the most tasks";
        ASSERT_LE((tasks + kDqConvertChunk - 1) / kDqConvertChunk * 4,
                  int64_t(dq_convert_pending_bytes(blocks, ctas)));
        for (int64_t k = 0; k < tasks; ++k) {
          const int64_t block = dq_convert_block(cta + k * ctas, s.tiles, s.bh_count);
          ASSERT_GE(block, 0);
          ASSERT_LT(block, blocks);
          ++seen[std::size_t(block)];
        }
      }
      for (int64_t block = 0; block < blocks; ++block)
        ASSERT_EQ(seen[std::size_t(block)], 1) << "tiles " << s.tiles << " bh " << s.bh_count
                                               << " ctas " << ctas << " block " << block;
    }
  }
}

TEST(HopperDqConvertTasks, TasksRunFromTheLastQueryTileDown) {
  // 4 query tiles of 2 (b, h): tasks 0, 1 are query tile 3 of both.
  EXPECT_EQ(dq_convert_block(0, 4, 2), 3);
  EXPECT_EQ(dq_convert_block(1, 4, 2), 4 + 3);
  EXPECT_EQ(dq_convert_block(2, 4, 2), 2);
  EXPECT_EQ(dq_convert_block(7, 4, 2), 4 + 0);
}

}  // namespace
