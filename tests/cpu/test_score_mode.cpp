// The fused forwards' choice of ScoreMode (src/cuda/flash/score_mode.hpp,
// shared by cuda-flash and cuda-hopper; host code, so it is checked here,
// without a GPU): softcap problems in bf16 whose exponent bound cap log2 e
// is at most kMaxUnshiftedExponent take the softmax without row maximum;
// f16, larger caps and no softcap keep the running maximum. The kernels of
// every mode are checked against the f64 oracle by
// tests/gpu/test_flash_correctness.cpp and test_hopper_forward.cpp.
#include <gtest/gtest.h>

#include "cuda/fused/problem_args.hpp"
#include "cuda/fused/score_mode.hpp"
#include "gqattn/types.hpp"

namespace {

using gqattn::fused::ElemType;
using gqattn::fused::kMaxUnshiftedExponent;
using gqattn::fused::ScoreMode;

ScoreMode mode_for(float softcap, ElemType elem) {
  gqattn::Problem p;
  p.B = 1;
  p.Tq = p.Tk = 256;
  p.H = 8;
  p.Hkv = 2;
  p.d = 128;
  p.softcap = softcap;
  return gqattn::fused::score_mode(gqattn::fused::score_args(p), elem);
}

// The largest cap the no-offset mode takes: kMaxUnshiftedExponent / log2 e.
const float kLargestCap = kMaxUnshiftedExponent / gqattn::fused::kLog2e;

TEST(ScoreMode, NoSoftcapIsPlain) {
  EXPECT_EQ(mode_for(0.0f, ElemType::bf16), ScoreMode::plain);
  EXPECT_EQ(mode_for(0.0f, ElemType::f16), ScoreMode::plain);
}

TEST(ScoreMode, Bf16SoftcapWithinTheBoundDropsTheRowMax) {
  EXPECT_NEAR(kLargestCap, 52.68f, 0.01f);
  for (float cap : {1e-30f, 1.0f, 20.0f, 30.0f, 50.0f, 52.6f})
    EXPECT_EQ(mode_for(cap, ElemType::bf16), ScoreMode::softcap_without_row_max) << cap;
}

TEST(ScoreMode, LargerCapsAndF16KeepTheRowMax) {
  for (float cap : {52.8f, 60.0f, 1e30f})
    EXPECT_EQ(mode_for(cap, ElemType::bf16), ScoreMode::softcap) << cap;
  for (float cap : {1.0f, 30.0f, 50.0f})
    EXPECT_EQ(mode_for(cap, ElemType::f16), ScoreMode::softcap) << cap;
}

}  // namespace
