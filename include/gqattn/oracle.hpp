// The f64 oracle: attention written straight from the math of
// docs/semantics.md, for tests and `gqattn check`. It shares no mask or
// softmax code with any backend, so a bug there cannot hide in both.
//
// Arrays are packed row-major: q, o, do, dq [B, Tq, H, d]; k, v, dk, dv
// [B, Tk, Hkv, d]; lse [B, H, Tq]. It is slow (plain loops) but parallel
// over (b, h).
#pragma once

#include <cstdint>
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

// A varlen batch (problem.varlen; Tq, Tk its longest sequences), with packed
// arrays: q, o, do, dq [total_q, H, d]; k, v, dk, dv [total_k, Hkv, d]; lse
// [H, total_q]. Each sequence is the dense problem of its own lengths,
// computed alone; key rows no query of their sequence uses (past
// seqused_k, or of a sequence without queries) get zero gradients.
struct VarlenLayout {
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;  // [B + 1]
  std::vector<int32_t> seqused_k;                   // [B] or empty
};
ForwardResult forward_varlen(const Problem& problem, const VarlenLayout& layout,
                             const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v);
Gradients backward_varlen(const Problem& problem, const VarlenLayout& layout,
                          const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, const std::vector<double>& dout);

}  // namespace gqattn::oracle
