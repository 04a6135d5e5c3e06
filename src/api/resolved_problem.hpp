// A validated problem resolved once for the backends that run the seed's
// algorithm row by row: the CPU mirror (src/cpu) and cuda-unfused
// (src/cuda/unfused), which must agree operation for operation and so read
// the same numbers. Plain data: cuda-unfused's kernels take it by value.
#pragma once

#include <cstdint>

#include "gqattn/types.hpp"

namespace gqattn::detail {

struct ResolvedProblem {
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, Hkv = 0, d = 0;
  int64_t rep = 1;     // query heads per kv head, H / Hkv
  int64_t off = 0;     // query_start(): query i sits at absolute position i + off
  int64_t window = 0;  // Problem::effective_window(): 0 or in [1, off + Tq - 1]
  bool causal = false;
  float scale = 1.0f;  // the validated problem's (dispatch resolves it)
  float softcap = 0.0f;
};

inline ResolvedProblem resolve(const Problem& problem) {
  ResolvedProblem s;
  s.B = problem.B;
  s.Tq = problem.Tq;
  s.Tk = problem.Tk;
  s.H = problem.H;
  s.Hkv = problem.Hkv;
  s.d = problem.d;
  s.rep = problem.H / problem.Hkv;
  s.off = problem.query_start();
  s.window = problem.effective_window();
  s.causal = problem.causal;
  s.scale = problem.effective_scale();
  s.softcap = problem.softcap;
  return s;
}

}  // namespace gqattn::detail
