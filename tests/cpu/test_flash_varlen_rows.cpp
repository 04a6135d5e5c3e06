// cuda-flash's varlen addressing, host side: the rows the kernels derive
// from a Sequence (src/cuda/fused/sequence.hpp) and the workspace rows
// (fused::workspace_row) of the backward. Every query tile of every dK/dV
// and dQ tile size lies inside its sequence's workspace block, blocks of
// different (sequence, head) never share a row nor an ordered-dQ counter
// (one per kBlockM rows), and every index stays below the plan's
// allocation; the dK/dV kernel stores dk, dv for the packed key rows
// (Sequence::k_rows), which seqused_k never exceeds. The kernels themselves:
// tests/gpu/test_flash_varlen.cpp and tests/gpu/test_varlen.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "cuda/fused/params.hpp"
#include "cuda/fused/sequence.hpp"

namespace {

using gqattn::fused::BackwardParams;
using gqattn::fused::kWorkspaceRowAlign;
using gqattn::fused::MaskArgs;
using gqattn::fused::Sequence;
using gqattn::fused::sequence_of;
using gqattn::fused::SequenceArgs;
using gqattn::fused::varlen_workspace_rows;
using gqattn::fused::workspace_row;

MaskArgs batch_mask(int tq, int tk) {
  MaskArgs m;
  m.tq = tq;
  m.tk = tk;
  m.causal = true;
  return m;
}

TEST(FlashVarlenRows, DenseKeyRowsAreTk) {
  const Sequence s = sequence_of(SequenceArgs{}, batch_mask(10, 20), 2);
  EXPECT_EQ(s.k_rows, 20);
}

TEST(FlashVarlenRows, KeyRowsArePackedRowsAtLeastSequsedK) {
  const std::vector<int> cu_q = {0, 5, 5, 12}, cu_k = {0, 8, 11, 30}, used = {6, 0, 19};
  SequenceArgs a;
  a.cu_seqlens_q = cu_q.data();
  a.cu_seqlens_k = cu_k.data();
  a.seqused_k = used.data();
  a.total_q = 12;
  a.total_k = 30;
  const MaskArgs m = batch_mask(7, 19);
  const int k_rows[] = {8, 3, 19};
  const int tk[] = {6, 0, 19};
  for (int b = 0; b < 3; ++b) {
    const Sequence s = sequence_of(a, m, b);
    EXPECT_EQ(s.k_rows, k_rows[b]) << b;
    EXPECT_EQ(s.mask.tk, tk[b]) << b;
    EXPECT_LE(s.mask.tk, s.k_rows) << b;
    EXPECT_LE(s.k_row0 + s.k_rows, a.total_k) << b;
  }
  // Offsets nobody checked: a sequence longer than max_seqlen_k stores no
  // more rows than the grid (sized by max_seqlen_k) covers.
  const std::vector<int> long_k = {0, 50, 50, 50};
  a.cu_seqlens_k = long_k.data();
  a.total_k = 50;
  a.seqused_k = nullptr;
  EXPECT_EQ(sequence_of(a, m, 0).k_rows, 19);
}

// Query tiles of every size the backward uses: each (sequence, head) block
// holds its tiles, and no row or counter is shared.
TEST(FlashVarlenRows, WorkspaceBlocksHoldWholeQueryTilesAndNeverOverlap) {
  const std::vector<int> cu_q = {0, 0, 1, 129, 129, 700, 701, 957};
  const std::vector<int> cu_k(cu_q.size(), 0);
  SequenceArgs a;
  a.cu_seqlens_q = cu_q.data();
  a.cu_seqlens_k = cu_k.data();
  a.total_q = cu_q.back();
  a.total_k = 0;
  BackwardParams p;
  p.B = int(cu_q.size()) - 1;
  p.H = 3;
  p.seq = a;
  p.varlen_head_rows = varlen_workspace_rows(a.total_q, p.B);
  const int64_t rows = p.H * p.varlen_head_rows;
  MaskArgs m = batch_mask(700 - 129, 1);
  for (int bm : {32, 64, 128}) {
    ASSERT_EQ(kWorkspaceRowAlign % bm, 0) << bm;
    std::set<int64_t> used_rows, used_counters;
    for (int b = 0; b < p.B; ++b) {
      const Sequence s = sequence_of(a, m, b);
      for (int h = 0; h < p.H; ++h) {
        const int64_t row0 = workspace_row(p, b, h, s.ws_row0);
        ASSERT_EQ(row0 % kWorkspaceRowAlign, 0);
        for (int m0 = 0; m0 < s.mask.tq; m0 += bm) {
          for (int64_t r = row0 + m0; r < row0 + m0 + bm; ++r) {
            ASSERT_LT(r, rows);
            EXPECT_TRUE(used_rows.insert(r).second) << "row " << r << " shared";
          }
          EXPECT_TRUE(used_counters.insert((row0 + m0) / bm).second);
          EXPECT_LT((row0 + m0) / bm, rows / bm);
        }
      }
    }
  }
}

}  // namespace
