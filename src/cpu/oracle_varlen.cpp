// The f64 oracle's varlen batches (include/gqattn/oracle.hpp): each sequence
// sliced out of the packed arrays and given to the dense oracle alone, its
// results put back; sequences without queries or keys written from the
// semantics directly (o = 0, lse = -inf, zero gradients). Checked with the
// dense oracle itself by tests/cpu/test_varlen.cpp (a batch of one sequence
// is the dense problem).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gqattn/error.hpp"
#include "gqattn/oracle.hpp"

namespace gqattn::oracle {
namespace {

struct Sequence {
  int64_t q0, tq, k0, tk, key_rows;
};

Sequence sequence(const VarlenLayout& L, int64_t b) {
  Sequence s;
  s.q0 = L.cu_seqlens_q[b];
  s.tq = L.cu_seqlens_q[b + 1] - s.q0;
  s.k0 = L.cu_seqlens_k[b];
  s.key_rows = L.cu_seqlens_k[b + 1] - s.k0;
  s.tk = L.seqused_k.empty() ? s.key_rows : L.seqused_k[b];
  return s;
}

void check_layout(const Problem& p, const VarlenLayout& L, std::size_t q_size, std::size_t k_size) {
  const auto B = static_cast<std::size_t>(p.B);
  if (L.cu_seqlens_q.size() != B + 1 || L.cu_seqlens_k.size() != B + 1 ||
      (!L.seqused_k.empty() && L.seqused_k.size() != B))
    throw Error("layout", "cu_seqlens need B + 1 entries and seqused_k B (or none)");
  const int64_t total_q = L.cu_seqlens_q[B], total_k = L.cu_seqlens_k[B];
  if (int64_t(q_size) != total_q * p.H * p.d || int64_t(k_size) != total_k * p.Hkv * p.d)
    throw Error("q, k", "sizes must be [total_q, H, d] and [total_k, Hkv, d]");
}

Problem dense(const Problem& batch, int64_t tq, int64_t tk) {
  Problem p = batch;
  p.varlen = false;
  p.B = 1;
  p.Tq = tq;
  p.Tk = tk;
  return p;
}

// Rows [row0, row0 + rows) of a packed array of `width` values per row.
std::vector<double> slice(const std::vector<double>& x, int64_t row0, int64_t rows, int64_t width) {
  return std::vector<double>(x.begin() + row0 * width, x.begin() + (row0 + rows) * width);
}
void put(std::vector<double>& x, const std::vector<double>& part, int64_t row0, int64_t width) {
  std::copy(part.begin(), part.end(), x.begin() + row0 * width);
}

}  // namespace

ForwardResult forward_varlen(const Problem& p, const VarlenLayout& L, const std::vector<double>& q,
                             const std::vector<double>& k, const std::vector<double>& v) {
  check_layout(p, L, q.size(), k.size());
  const int64_t total_q = L.cu_seqlens_q[p.B];
  const int64_t qw = p.H * p.d, kw = p.Hkv * p.d;
  ForwardResult out;
  out.o.assign(q.size(), 0.0);
  out.lse.assign(p.H * total_q, -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < p.B; ++b) {
    const Sequence s = sequence(L, b);
    if (s.tq == 0 || s.tk == 0) continue;  // o = 0, lse = -inf as filled
    const ForwardResult r = forward(dense(p, s.tq, s.tk), slice(q, s.q0, s.tq, qw),
                                    slice(k, s.k0, s.tk, kw), slice(v, s.k0, s.tk, kw));
    put(out.o, r.o, s.q0, qw);
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < s.tq; ++i) out.lse[h * total_q + s.q0 + i] = r.lse[h * s.tq + i];
  }
  return out;
}

Gradients backward_varlen(const Problem& p, const VarlenLayout& L, const std::vector<double>& q,
                          const std::vector<double>& k, const std::vector<double>& v,
                          const std::vector<double>& dout) {
  check_layout(p, L, q.size(), k.size());
  const int64_t qw = p.H * p.d, kw = p.Hkv * p.d;
  Gradients out;
  out.dq.assign(q.size(), 0.0);
  out.dk.assign(k.size(), 0.0);
  out.dv.assign(k.size(), 0.0);
  for (int64_t b = 0; b < p.B; ++b) {
    const Sequence s = sequence(L, b);
    if (s.tq == 0 || s.tk == 0) continue;  // zero gradients as filled
    const Gradients g =
        backward(dense(p, s.tq, s.tk), slice(q, s.q0, s.tq, qw), slice(k, s.k0, s.tk, kw),
                 slice(v, s.k0, s.tk, kw), slice(dout, s.q0, s.tq, qw));
    put(out.dq, g.dq, s.q0, qw);
    put(out.dk, g.dk, s.k0, kw);
    put(out.dv, g.dv, s.k0, kw);
  }
  return out;
}

}  // namespace gqattn::oracle
