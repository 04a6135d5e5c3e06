// The fused backends' per-sequence view (src/cuda/fused/sequence.hpp),
// host side: a dense batch's sequences are the batch; a varlen batch's take
// their rows, lengths, query offset and window from the offsets; offsets
// nobody checked are clamped so that every row a kernel derives stays in the
// tensors; per-head workspace blocks never overlap and end within their
// allocation. The kernels: tests/gpu/test_varlen.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/fused/sequence.hpp"

namespace {

using gqattn::fused::MaskArgs;
using gqattn::fused::Sequence;
using gqattn::fused::sequence_of;
using gqattn::fused::SequenceArgs;

MaskArgs batch_mask(int tq, int tk, int off, int window, bool causal) {
  MaskArgs m;
  m.tq = tq;
  m.tk = tk;
  m.off = off;
  m.window = window;
  m.causal = causal;
  return m;
}

TEST(FusedSequence, DenseSequencesAreTheBatch) {
  const MaskArgs m = batch_mask(10, 20, 10, 4, true);
  const Sequence s = sequence_of(SequenceArgs{}, m, 3);
  EXPECT_EQ(s.q_row0, 0);
  EXPECT_EQ(s.k_row0, 0);
  EXPECT_EQ(s.mask.tq, 10);
  EXPECT_EQ(s.mask.off, 10);
  EXPECT_EQ(s.mask.window, 4);
}

TEST(FusedSequence, VarlenSequencesTakeTheirOwnLengthsOffsetAndWindow) {
  const std::vector<int> cu_q = {0, 5, 5, 12}, cu_k = {0, 8, 11, 11}, used = {6, 3, 0};
  SequenceArgs a;
  a.cu_seqlens_q = cu_q.data();
  a.cu_seqlens_k = cu_k.data();
  a.total_q = 12;
  a.total_k = 11;
  const MaskArgs m = batch_mask(7, 8, 0, 7, true);
  Sequence s = sequence_of(a, m, 0);
  EXPECT_EQ(s.q_row0, 0);
  EXPECT_EQ(s.mask.tq, 5);
  EXPECT_EQ(s.mask.tk, 8);
  EXPECT_EQ(s.mask.off, 3);     // bottom-right: 8 - 5
  EXPECT_EQ(s.mask.window, 7);  // below off + tq = 8
  s = sequence_of(a, m, 1);
  EXPECT_EQ(s.q_row0, 5);
  EXPECT_EQ(s.k_row0, 8);
  EXPECT_EQ(s.mask.tq, 0);
  EXPECT_EQ(s.mask.tk, 3);
  s = sequence_of(a, m, 2);
  EXPECT_EQ(s.mask.tq, 7);
  EXPECT_EQ(s.mask.tk, 0);
  EXPECT_EQ(s.mask.off, -7);
  EXPECT_EQ(s.mask.window, 0);  // every position below 0: keeps every key on the left

  a.seqused_k = used.data();
  a.q_start_given = true;
  const MaskArgs given = batch_mask(7, 8, 2, 7, true);
  s = sequence_of(a, given, 0);
  EXPECT_EQ(s.mask.tk, 6);
  EXPECT_EQ(s.mask.off, 2);     // q_start given: the batch's
  EXPECT_EQ(s.mask.window, 0);  // 7 >= 2 + 5
}

// Offsets nobody checked: every derived row range stays inside the totals.
TEST(FusedSequence, UncheckedOffsetsAreClamped) {
  const std::vector<int> cu_q = {-40, 1000, 3, 2, 9}, cu_k = {7, -1, 1 << 30, 5, 4},
                         used = {-3, 900, 2, 1};
  SequenceArgs a;
  a.cu_seqlens_q = cu_q.data();
  a.cu_seqlens_k = cu_k.data();
  a.seqused_k = used.data();
  a.total_q = 9;
  a.total_k = 6;
  const MaskArgs m = batch_mask(4, 4, 0, 0, false);
  for (int b = 0; b < 4; ++b) {
    const Sequence s = sequence_of(a, m, b);
    EXPECT_GE(s.q_row0, 0);
    EXPECT_GE(s.mask.tq, 0);
    EXPECT_LE(s.mask.tq, 4);  // never past max_seqlen_q
    EXPECT_LE(s.q_row0 + s.mask.tq, a.total_q);
    EXPECT_GE(s.k_row0, 0);
    EXPECT_GE(s.mask.tk, 0);
    EXPECT_LE(s.mask.tk, 4);
    EXPECT_LE(s.k_row0 + s.mask.tk, a.total_k);
    EXPECT_LE(s.ws_row0 + 128 * ((s.mask.tq + 127) / 128),
              gqattn::fused::varlen_workspace_rows(a.total_q, 4));
  }
}

TEST(FusedSequence, WorkspaceBlocksNeverOverlap) {
  const int A = gqattn::fused::kWorkspaceRowAlign;
  for (int len0 : {0, 1, A - 1, A, A + 1, 3 * A + 5})
    for (int len1 : {0, 1, A - 1, A, A + 1}) {
      const int cu[] = {0, len0, len0 + len1, len0 + len1 + 1};
      for (int b = 0; b + 1 < 3; ++b) {
        const int tq = cu[b + 1] - cu[b];
        const int64_t end = gqattn::fused::varlen_workspace_row0(cu[b], b) + (tq + A - 1) / A * A;
        EXPECT_LE(end, gqattn::fused::varlen_workspace_row0(cu[b + 1], b + 1));
        EXPECT_EQ(gqattn::fused::varlen_workspace_row0(cu[b], b) % A, 0);
      }
      EXPECT_LE(gqattn::fused::varlen_workspace_row0(cu[3], 3),
                gqattn::fused::varlen_workspace_rows(cu[3], 3));
    }
}

}  // namespace
