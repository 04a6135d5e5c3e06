// The f64 oracle: attention written straight from the math of
// docs/semantics.md, for tests and `gqattn check`. It shares no mask or
// softmax code with any backend, so a bug there cannot hide in both.
//
// Arrays are packed row-major: q, o, do, dq [B, Tq, H, d]; k, v, dk, dv
// [B, Tk, Hkv, d]; lse [B, H, Tq]. It is slow (plain loops) but parallel
// over (b, h).
#pragma once

#include <vector>

#include "gqattn/types.hpp"

namespace gqattn::oracle {

struct ForwardResult {
  std::vector<double> o;
  std::vector<double> lse;  // -inf for a query row with no kept key
};
ForwardResult forward(const Problem& problem, const std::vector<double>& q,
                      const std::vector<double>& k, const std::vector<double>& v);

struct Gradients {
  std::vector<double> dq, dk, dv;
};
// Recomputes the forward in f64 (D uses the oracle's own o).
Gradients backward(const Problem& problem, const std::vector<double>& q,
                   const std::vector<double>& k, const std::vector<double>& v,
                   const std::vector<double>& dout);

// True iff key j is kept for query i (the mask of docs/semantics.md).
bool kept(const Problem& problem, int64_t i, int64_t j);

}  // namespace gqattn::oracle
