// The public Problem helpers (types.hpp): kept_pairs() against a row-by-row
// count of the mask of docs/semantics.md, over Tq < Tk, Tq = Tk, Tq > Tk
// (rows with no key), windows of 1, short, long and wider than Tk, causal
// and not, and query offsets (q_start) negative, zero, inside and past Tk.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "gqattn/types.hpp"

namespace {

// Row i keeps key j iff j <= q_start + i (causal) and j > q_start + i - window
// (window > 0): the definition, one pair at a time.
int64_t count_pairs(const gqattn::Problem& p) {
  const int64_t off = p.q_start ? *p.q_start : p.Tk - p.Tq;
  int64_t total = 0;
  for (int64_t i = 0; i < p.Tq; ++i)
    for (int64_t j = 0; j < p.Tk; ++j) {
      const bool causal_ok = !p.causal || j <= i + off;
      const bool window_ok = p.window <= 0 || j > i + off - p.window;
      total += causal_ok && window_ok ? 1 : 0;
    }
  return total;
}

TEST(Problem, KeptPairsMatchesThePairByPairCount) {
  const int64_t lengths[] = {1, 2, 3, 7, 16, 37, 64, 100};
  const int64_t windows[] = {0, 1, 2, 5, 16, 63, 64, 99, 1000};
  for (int64_t tq : lengths)
    for (int64_t tk : lengths)
      for (bool causal : {false, true})
        for (int64_t window : windows) {
          gqattn::Problem p;
          p.Tq = tq;
          p.Tk = tk;
          p.causal = causal;
          p.window = window;
          EXPECT_EQ(p.kept_pairs(), count_pairs(p))
              << "Tq=" << tq << " Tk=" << tk << " causal=" << causal << " window=" << window;
        }
}

TEST(Problem, KeptPairsWithAQueryOffset) {
  const int64_t lengths[] = {1, 3, 16, 37};
  const int64_t windows[] = {0, 1, 2, 5, 40, 100};
  const int64_t starts[] = {-50, -17, -1, 0, 1, 5, 36, 37, 60};
  for (int64_t tq : lengths)
    for (int64_t tk : lengths)
      for (int64_t q_start : starts)
        for (bool causal : {false, true})
          for (int64_t window : windows) {
            gqattn::Problem p;
            p.Tq = tq;
            p.Tk = tk;
            p.q_start = q_start;
            p.causal = causal;
            p.window = window;
            EXPECT_EQ(p.kept_pairs(), count_pairs(p))
                << "Tq=" << tq << " Tk=" << tk << " q_start=" << q_start << " causal=" << causal
                << " window=" << window;
          }
}

TEST(Problem, EffectiveWindowDropsAWindowThatKeepsEveryKeyOnTheLeft) {
  gqattn::Problem p;
  p.Tq = 4;
  p.Tk = 10;
  p.window = 10;  // last query at position 9: keys >= 0
  EXPECT_EQ(p.effective_window(), 0);
  p.window = 9;
  EXPECT_EQ(p.effective_window(), 9);
  p.q_start = 20;  // last query at position 23: a window of 10 keeps keys >= 14, none
  p.window = 10;
  EXPECT_EQ(p.effective_window(), 10);
  p.window = 24;
  EXPECT_EQ(p.effective_window(), 0);
  p.q_start = -8;  // every position below 0
  p.window = 1;
  EXPECT_EQ(p.effective_window(), 0);
}

TEST(Problem, KeptPairsOfTheStandardShapes) {
  gqattn::Problem p;
  p.Tq = p.Tk = 16384;
  p.causal = true;
  EXPECT_EQ(p.kept_pairs(), int64_t(16384) * 16385 / 2);
  p.Tq = p.Tk = 4096;
  p.window = 1024;
  // Rows 0..1023 keep i + 1 keys, the other 3072 keep 1024 (bench/side_by_side.py: 3670528).
  EXPECT_EQ(p.kept_pairs(), int64_t(1024) * 1025 / 2 + int64_t(3072) * 1024);
  p.causal = false;
  p.window = 0;
  EXPECT_EQ(p.kept_pairs(), int64_t(4096) * 4096);
}

}  // namespace
