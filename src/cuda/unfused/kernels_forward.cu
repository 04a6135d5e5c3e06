// attention_fwd: the seed's forward kernel in CUDA, one thread per query row
// (b, h, i). It writes the row of P [B, H, Tq, Tk] in f32 (scores, max, exp
// and sum, normalise, zeros outside the kept range), then o = sum_j P_ij v_j
// and lse = m + log(sum). Backward recomputes P with this same kernel, so its
// P is bit-identical to the forward's.
// Checked against the CPU mirror (src/cpu/mirror_*.cpp, same operation order)
// by tests/gpu/test_cuda_unfused.cpp; memcheck via its UnfusedSmall.* tests.
#include <math_constants.h>

#include <cfloat>
#include <string>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/unfused/kernels_common.cuh"

namespace gqattn::cuda::unfused {
namespace {

template <class T>
struct ForwardArgs {
  Shape s;
  const T *q, *k, *v;
  RowStrides qs, ks, vs;
  T* o;  // null: P only
  RowStrides os;
  float* lse;  // null: not written
  RowStrides lses;
  float* P;
};

template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock) attention_fwd(const ForwardArgs<T> a) {
  const Shape& s = a.s;
  const int64_t rows = s.B * s.H * s.Tq;
  for (int64_t row = first_row(); row < rows; row += row_step()) {
    const QueryRow r = query_row(s, row);
    const int64_t hkv = r.h / s.rep;
    const T* qi = at(a.q, a.qs, r.b, r.i, r.h);
    float* prow = a.P + row * s.Tk;
    const Range kept = kept_keys(s, r.i);

    float m = -FLT_MAX;
    float sum = 0.0f;
    if (kept.first > kept.last) {
      // No kept key: P's row is 0 and the softmax is skipped (its sum would
      // be 0 and 1/sum infinite); o stays 0 and lse is -inf below.
      for (int64_t j = 0; j < s.Tk; ++j) prow[j] = 0.0f;
    } else {
      for (int64_t j = kept.first; j <= kept.last; ++j) {
        float score = __fmul_rn(fma_dot(qi, at(a.k, a.ks, r.b, j, hkv), s.d), s.scale);
        if (s.softcap > 0.0f) score = __fmul_rn(s.softcap, tanh_rn(__fdiv_rn(score, s.softcap)));
        prow[j] = score;
        m = fmaxf(m, score);
      }
      for (int64_t j = kept.first; j <= kept.last; ++j) {
        const float e = exp_rn(__fsub_rn(prow[j], m));
        prow[j] = e;
        sum = __fadd_rn(sum, e);
      }
      const float inv = __fdiv_rn(1.0f, sum);
      for (int64_t j = 0; j < kept.first; ++j) prow[j] = 0.0f;
      for (int64_t j = kept.first; j <= kept.last; ++j) prow[j] = __fmul_rn(prow[j], inv);
      for (int64_t j = kept.last + 1; j < s.Tk; ++j) prow[j] = 0.0f;
    }

    if (a.o != nullptr) {
      T* oi = at(a.o, a.os, r.b, r.i, r.h);
      for (int64_t d0 = 0; d0 < s.d; d0 += kChunk) {
        const int width = chunk_width(s, d0);
        float acc[kChunk];
        zero(acc);
        for (int64_t j = kept.first; j <= kept.last; ++j) {
          const float prob = prow[j];
          if (prob == 0.0f) continue;
          fma_chunk(acc, prob, at(a.v, a.vs, r.b, j, hkv) + d0, width);
        }
        store_chunk(oi + d0, acc, width);
      }
    }
    if (a.lse != nullptr) {
      *at(a.lse, a.lses, r.b, r.i, r.h) =
          kept.first > kept.last ? -CUDART_INF_F : __fadd_rn(m, log_rn(sum));
    }
  }
}

}  // namespace

std::string why_no_kernel_image() {
  return cuda::why_no_kernel_image(reinterpret_cast<const void*>(attention_fwd<float>));
}

void launch_forward(const ForwardPass& pass, const Launch& launch) {
  with_element_type(pass.dtype, [&](auto tag) {
    using T = decltype(tag);
    ForwardArgs<T> a;
    a.s = pass.shape;
    a.q = static_cast<const T*>(pass.q.data);
    a.k = static_cast<const T*>(pass.k.data);
    a.v = static_cast<const T*>(pass.v.data);
    a.qs = pass.q.stride;
    a.ks = pass.k.stride;
    a.vs = pass.v.stride;
    a.o = static_cast<T*>(pass.o.data);
    a.os = pass.o.stride;
    a.lse = static_cast<float*>(pass.lse.data);
    a.lses = pass.lse.stride;
    a.P = pass.P;
    const int64_t rows = pass.shape.B * pass.shape.H * pass.shape.Tq;
    if (rows == 0) return;  // a varlen sequence without queries: a grid of no blocks fails
    attention_fwd<T><<<grid_blocks(rows, launch), kThreadsPerBlock, 0, launch.stream>>>(a);
    check_launch("attention_fwd");
  });
}

}  // namespace gqattn::cuda::unfused
