// The f32 mirror of the seed's four Metal kernels (attention_fwd,
// attention_bwd_d, attention_bwd_dq, attention_bwd_dkv), extended to the full
// semantics of docs/semantics.md: Tq != Tk, rows with no kept key, lse, any
// stride, f32/bf16/f16 I/O. Every float operation happens in the seed's order
// with std::fmaf where the seed writes fma, so the unfused CUDA path can be
// compared with it almost bit for bit. Checked in tests/cpu/: bit-exact
// against a literal transliteration of the seed (test_mirror_seed.cpp),
// against the f64 oracle (test_mirror_oracle.cpp), and by properties.
#pragma once

#include <cstdint>
#include <vector>

#include "api/backend.hpp"
#include "api/resolved_problem.hpp"

namespace gqattn::cpu {

// The problem's sizes, resolved once (shared with cuda-unfused).
using MirrorShape = detail::ResolvedProblem;

// The keys query i keeps, as the seed's [jmin, jmax]; empty when first > last.
struct KeptRange {
  int64_t first = 0;
  int64_t last = -1;
  bool empty() const { return first > last; }
};
KeptRange kept_range(const MirrorShape& shape, int64_t i);

// The seed's dot product: s = fma(a[x], b[x], s) from s = 0, x ascending.
float fma_dot(const float* a, const float* b, int64_t n);

// One row of P, exactly as attention_fwd builds it: scores (softcapped) of
// the kept keys, their max m, e = exp(s - m) and its sum, P = e * (1 / sum).
// q is [d]; K is the row's kv head packed [Tk, d]. prow gets the kept keys
// only: prow[j - kept.first] for j in [kept.first, kept.last] (the zeros of
// the seed's masked keys are not stored, so memory and time follow the
// kept pairs), at most max_kept(shape) values. Forward and backward both call
// this, so backward's P is bit-identical to the P forward used. A row with no
// kept key writes nothing and has sum = 0.
struct RowSoftmax {
  KeptRange kept;
  float m = 0.0f;
  float sum = 0.0f;
};
RowSoftmax softmax_row(const MirrorShape& shape, int64_t i, const float* q, const float* K,
                       float* prow);
// The most keys one row keeps (Tk without a window).
int64_t max_kept(const MirrorShape& shape);

// Scratch floats, allocated before a pass writes anything: a request that
// cannot be met throws std::bad_alloc with every output untouched.
std::vector<float> scratch_floats(int64_t n);

// Element offset of t[i0][i1][i2] (rank 3) or t[i0][i1][i2][0] (rank 4).
inline int64_t element_offset(const TensorRef& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2];
}
// n consecutive elements from `offset`, as float (exact for every dtype).
void load_floats(const TensorRef& t, int64_t offset, int64_t n, float* out);
// n floats to consecutive elements from `offset`, rounded to t's dtype.
void store_floats(const TensorRef& t, int64_t offset, int64_t n, const float* in);
// Head `head` of batch b of a [B, T, heads, d] tensor, packed to [T, d] floats.
void load_head(const TensorRef& t, int64_t b, int64_t head, int64_t T, int64_t d, float* out);

// Both passes run on Options::num_threads threads (parallel.hpp) and hold,
// per thread, the K and V of one kv head (and backward its dK and dV) plus
// one row of P: O(threads * Tk * d + window) floats, allocated up front, never
// O(Tq * Tk). Backward recomputes P row by row (softmax_row) where the seed
// stores it; the recomputation gives the same bits, so every result is the
// seed's, operation for operation.
void mirror_forward(const detail::ForwardArgs& args);
void mirror_backward(const detail::BackwardArgs& args);
// Varlen batches (args.host_offsets set): sequence by sequence
// (mirror_varlen.cpp).
void mirror_varlen_forward(const detail::ForwardArgs& args);
void mirror_varlen_backward(const detail::BackwardArgs& args);
}  // namespace gqattn::cpu
