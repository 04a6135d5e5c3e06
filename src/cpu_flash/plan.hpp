// cpu-flash's tiling: the problem resolved once, the block sizes, and which
// keys a query row or a query block keeps (so blocks outside the causal or
// window band are never visited). Plain integer rules shared by forward.cpp
// and backward.cpp; checked through the oracle tests of
// tests/cpu/test_cpu_flash.cpp (windows of 1 and >= T, Tq != Tk, q_start).
#pragma once

#include <algorithm>
#include <cstdint>

#include "api/resolved_problem.hpp"

namespace gqattn::cpu_flash {

using Shape = detail::ResolvedProblem;

// Keys per block: the column count of every score tile (a multiple of 16,
// the tile kernels' vector chunk).
constexpr int64_t kBlockK = 64;
// Query rows per block and head. A group's rep heads are stacked in one tile
// of rep * block_q rows, so K and V blocks are loaded once per group.
constexpr int64_t kBlockQ = 64;

struct Plan {
  int64_t block_q = kBlockQ;  // rows per head in a tile (multiple of 4)
  int64_t dp = 16;            // d rounded up to a multiple of 16 (zero padded)
  int64_t q_blocks = 0, k_blocks = 0;
};

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

inline Plan make_plan(const Shape& s) {
  Plan p;
  p.block_q = std::min(kBlockQ, round_up(s.Tq, 4));
  p.dp = round_up(s.d, 16);
  p.q_blocks = (s.Tq + p.block_q - 1) / p.block_q;
  p.k_blocks = (s.Tk + kBlockK - 1) / kBlockK;
  return p;
}

// Keys [first, last] that query i keeps; empty when first > last. Signed so
// a query before every key (causal, q_start < 0) is empty.
struct Range {
  int64_t first = 0, last = -1;
  bool empty() const { return first > last; }
};

inline Range kept_keys(const Shape& s, int64_t i) {
  const int64_t pos = i + s.off;
  Range r;
  r.last = s.causal ? std::min(pos, s.Tk - 1) : s.Tk - 1;
  r.first = s.window > 0 ? std::max<int64_t>(pos - s.window + 1, 0) : 0;
  return r;
}

// Queries [first, last] that keep key j (the same rule read the other way).
inline Range kept_queries(const Shape& s, int64_t j) {
  Range r;
  r.first = s.causal ? std::max<int64_t>(j - s.off, 0) : 0;
  r.last = s.window > 0 ? std::min(j - s.off + s.window - 1, s.Tq - 1) : s.Tq - 1;
  return r;
}

// Key blocks [first, last] a query block [i0, i1] visits: the union of its
// rows' ranges (both ends grow with i).
inline Range key_blocks(const Shape& s, int64_t i0, int64_t i1) {
  const Range a = kept_keys(s, i0), b = kept_keys(s, i1);
  const int64_t first = std::max<int64_t>(a.first, 0), last = std::min(b.last, s.Tk - 1);
  if (first > last) return Range{};
  return Range{first / kBlockK, last / kBlockK};
}

// Query blocks a key block [j0, j1] is visited by.
inline Range query_blocks(const Shape& s, const Plan& p, int64_t j0, int64_t j1) {
  const Range a = kept_queries(s, j0), b = kept_queries(s, j1);
  const int64_t first = std::max<int64_t>(a.first, 0), last = std::min(b.last, s.Tq - 1);
  if (first > last) return Range{};
  return Range{first / p.block_q, last / p.block_q};
}

}  // namespace gqattn::cpu_flash
