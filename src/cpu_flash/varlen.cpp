// cpu-flash's varlen batches: sequence by sequence, each the dense problem
// of its own lengths (B = 1) run by forward / backward over views of its
// rows, as the mirror does (src/cpu/mirror_varlen.cpp), so a sequence's
// results are those it gets alone. What no dense pass writes is written
// here: rows of a sequence with no keys (o = 0, lse = -inf, dq = 0), and
// dk = dv = 0 for key rows of a sequence with no queries and for those past
// seqused_k. Checked against the f64 oracle by tests/cpu/test_cpu_flash.cpp.
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/mirror.hpp"
#include "cpu_flash/cpu_flash.hpp"
#include "gqattn/dtype.hpp"

namespace gqattn::cpu_flash {
namespace {

// Rows [row0, row0 + rows) of a batch-of-one [1, T, heads, d] view, or
// columns of a [1, H, T] lse view.
TensorRef rows_of(const TensorRef& t, int64_t row0, int64_t rows) {
  TensorRef out = t;
  const int64_t step = t.rank == 4 ? t.stride[1] : t.stride[2];
  out.data = static_cast<char*>(t.data) + row0 * step * int64_t(dtype_size(t.dtype));
  out.shape[t.rank == 4 ? 1 : 2] = rows;
  return out;
}

void fill_rows(const TensorRef& t, int64_t row0, int64_t rows, float value) {
  if (t.data == nullptr || rows <= 0) return;
  if (t.rank == 3) {  // lse [1, H, T]
    for (int64_t h = 0; h < t.shape[1]; ++h)
      for (int64_t i = 0; i < rows; ++i)
        store_from_float(t.data, t.dtype, h * t.stride[1] + (row0 + i) * t.stride[2], value);
    return;
  }
  const std::vector<float> row(static_cast<std::size_t>(t.shape[3]), value);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t h = 0; h < t.shape[2]; ++h)
      cpu::store_floats(t, cpu::element_offset(t, 0, row0 + i, h), t.shape[3], row.data());
}

Problem sequence_problem(const Problem& batch, int64_t tq, int64_t tk) {
  Problem p = batch;
  p.varlen = false;
  p.B = 1;
  p.Tq = tq;
  p.Tk = tk;
  return p;
}

}  // namespace

void varlen_forward(const detail::ForwardArgs& args) {
  const detail::HostOffsets& h = *args.host_offsets;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < args.problem.B; ++b) {
    const int64_t q0 = h.cu_seqlens_q[b], k0 = h.cu_seqlens_k[b];
    const int64_t tq = h.tq(b), tk = h.tk(b);
    if (tq == 0) continue;
    if (tk == 0) {
      fill_rows(args.o, q0, tq, 0.0f);
      fill_rows(args.lse, q0, tq, neg_inf);
      continue;
    }
    detail::ForwardArgs one = args;
    one.problem = sequence_problem(args.problem, tq, tk);
    one.host_offsets = nullptr;
    one.q = rows_of(args.q, q0, tq);
    one.o = rows_of(args.o, q0, tq);
    one.k = rows_of(args.k, k0, tk);
    one.v = rows_of(args.v, k0, tk);
    if (args.lse.data != nullptr) one.lse = rows_of(args.lse, q0, tq);
    forward(one);
  }
}

void varlen_backward(const detail::BackwardArgs& args) {
  const detail::HostOffsets& h = *args.host_offsets;
  for (int64_t b = 0; b < args.problem.B; ++b) {
    const int64_t q0 = h.cu_seqlens_q[b], k0 = h.cu_seqlens_k[b];
    const int64_t tq = h.tq(b), tk = h.tk(b);
    const int64_t key_rows = h.cu_seqlens_k[b + 1] - k0;  // packed, seqused_k or not
    if (tq > 0 && tk > 0) {
      detail::BackwardArgs one = args;
      one.problem = sequence_problem(args.problem, tq, tk);
      one.host_offsets = nullptr;
      one.q = rows_of(args.q, q0, tq);
      one.o = rows_of(args.o, q0, tq);
      one.dout = rows_of(args.dout, q0, tq);
      one.dq = rows_of(args.dq, q0, tq);
      one.lse = rows_of(args.lse, q0, tq);
      one.k = rows_of(args.k, k0, tk);
      one.v = rows_of(args.v, k0, tk);
      one.dk = rows_of(args.dk, k0, tk);
      one.dv = rows_of(args.dv, k0, tk);
      backward(one);
    } else {
      fill_rows(args.dq, q0, tq, 0.0f);
    }
    const int64_t zero_from = tq > 0 ? tk : 0;  // key rows no query used
    fill_rows(args.dk, k0 + zero_from, key_rows - zero_from, 0.0f);
    fill_rows(args.dv, k0 + zero_from, key_rows - zero_from, 0.0f);
  }
}

}  // namespace gqattn::cpu_flash
