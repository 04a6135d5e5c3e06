// The seed's backward kernels in CUDA, after attention_fwd has recomputed P:
//   attention_bwd_d   one thread per query row: D_i = do_i . o_i
//   attention_bwd_dv  one thread per kv row (b, hkv, j): dv_j = sum P_ij do_i
//   attention_bwd_dq  one thread per query row: dS_ij over P's row in place,
//                     then dq_i = sum_j dS_ij k_j
//   attention_bwd_dk  one thread per kv row: dk_j = sum dS_ij q_i
// The seed's attention_bwd_dkv is split around dq: with P turned into dS by
// dq, dk reads dS instead of recomputing dp = do_i . v_j (and the softcap's
// q_i . k_j) once per output chunk. Every dS_ij is computed once, by the
// seed's expression, and each dk_j, dv_j sums over the group's heads r, then
// rows i, in the seed's order: deterministic, no atomics.
// Checked against the CPU mirror (src/cpu/mirror_backward.cpp) by
// tests/gpu/test_cuda_unfused.cpp; memcheck via its UnfusedSmall.* tests.
#include "cuda/common/cuda_check.hpp"
#include "cuda/unfused/kernels_common.cuh"

namespace gqattn::cuda::unfused {
namespace {

template <class T>
struct BackwardArgs {
  Shape s;
  const T *q, *k, *v, *o, *dout;
  RowStrides qs, ks, vs, os, douts;
  T *dq, *dk, *dv;
  RowStrides dqs, dks, dvs;
  float* P;  // [B, H, Tq, Tk]
  float* D;  // [B, H, Tq]
};

template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock) attention_bwd_d(const BackwardArgs<T> a) {
  const Shape& s = a.s;
  const int64_t rows = s.B * s.H * s.Tq;
  for (int64_t row = first_row(); row < rows; row += row_step()) {
    const QueryRow r = query_row(s, row);
    a.D[row] = fma_dot(at(a.dout, a.douts, r.b, r.i, r.h), at(a.o, a.os, r.b, r.i, r.h), s.d);
  }
}

// Reads P, so it runs before attention_bwd_dq overwrites P with dS.
template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock) attention_bwd_dv(const BackwardArgs<T> a) {
  const Shape& s = a.s;
  const int64_t rows = s.B * s.Hkv * s.Tk;
  for (int64_t row = first_row(); row < rows; row += row_step()) {
    const KvRow kv = kv_row(s, row);
    const Range queries = queries_keeping(s, kv.j);
    T* dvj = at(a.dv, a.dvs, kv.b, kv.j, kv.hkv);
    for (int64_t d0 = 0; d0 < s.d; d0 += kChunk) {
      const int width = chunk_width(s, d0);
      float acc[kChunk];
      zero(acc);
      for (int64_t rr = 0; rr < s.rep; ++rr) {
        const int64_t h = kv.hkv * s.rep + rr;
        const float* pcol = a.P + (kv.b * s.H + h) * s.Tq * s.Tk + kv.j;
        for (int64_t i = queries.first; i <= queries.last; ++i) {
          const float prob = pcol[i * s.Tk];
          if (prob == 0.0f) continue;
          fma_chunk(acc, prob, at(a.dout, a.douts, kv.b, i, h) + d0, width);
        }
      }
      store_chunk(dvj + d0, acc, width);
    }
  }
}

// dS_ij is written over P_ij; where P_ij is 0 (outside the kept range, or
// exp underflow) the entry stays 0, which the passes below skip as the seed
// skips prob == 0. A kept P_ij != 0 whose dS_ij is exactly 0 is skipped too:
// its fma would add a zero, which leaves a sum unchanged (a sum that is
// itself exactly zero could only differ in its sign).
template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock) attention_bwd_dq(const BackwardArgs<T> a) {
  const Shape& s = a.s;
  const int64_t rows = s.B * s.H * s.Tq;
  for (int64_t row = first_row(); row < rows; row += row_step()) {
    const QueryRow r = query_row(s, row);
    const int64_t hkv = r.h / s.rep;
    const T* qi = at(a.q, a.qs, r.b, r.i, r.h);
    const T* doi = at(a.dout, a.douts, r.b, r.i, r.h);
    float* prow = a.P + row * s.Tk;
    const float row_dot = a.D[row];
    const Range kept = kept_keys(s, r.i);

    for (int64_t j = kept.first; j <= kept.last; ++j) {
      const float prob = prow[j];
      if (prob == 0.0f) continue;
      const float dp = fma_dot(doi, at(a.v, a.vs, r.b, j, hkv), s.d);
      prow[j] = seed_ds(s, prob, dp, row_dot, qi, at(a.k, a.ks, r.b, j, hkv));
    }

    T* dqi = at(a.dq, a.dqs, r.b, r.i, r.h);
    for (int64_t d0 = 0; d0 < s.d; d0 += kChunk) {
      const int width = chunk_width(s, d0);
      float acc[kChunk];
      zero(acc);
      for (int64_t j = kept.first; j <= kept.last; ++j) {
        const float ds = prow[j];
        if (ds == 0.0f) continue;
        fma_chunk(acc, ds, at(a.k, a.ks, r.b, j, hkv) + d0, width);
      }
      store_chunk(dqi + d0, acc, width);
    }
  }
}

// Reads dS, so it runs after attention_bwd_dq.
template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock) attention_bwd_dk(const BackwardArgs<T> a) {
  const Shape& s = a.s;
  const int64_t rows = s.B * s.Hkv * s.Tk;
  for (int64_t row = first_row(); row < rows; row += row_step()) {
    const KvRow kv = kv_row(s, row);
    const Range queries = queries_keeping(s, kv.j);
    T* dkj = at(a.dk, a.dks, kv.b, kv.j, kv.hkv);
    for (int64_t d0 = 0; d0 < s.d; d0 += kChunk) {
      const int width = chunk_width(s, d0);
      float acc[kChunk];
      zero(acc);
      for (int64_t rr = 0; rr < s.rep; ++rr) {
        const int64_t h = kv.hkv * s.rep + rr;
        const float* dscol = a.P + (kv.b * s.H + h) * s.Tq * s.Tk + kv.j;
        for (int64_t i = queries.first; i <= queries.last; ++i) {
          const float ds = dscol[i * s.Tk];
          if (ds == 0.0f) continue;
          fma_chunk(acc, ds, at(a.q, a.qs, kv.b, i, h) + d0, width);
        }
      }
      store_chunk(dkj + d0, acc, width);
    }
  }
}

}  // namespace

void launch_backward(const BackwardPass& pass, const Launch& launch) {
  with_element_type(pass.dtype, [&](auto tag) {
    using T = decltype(tag);
    BackwardArgs<T> a;
    a.s = pass.shape;
    a.q = static_cast<const T*>(pass.q.data);
    a.k = static_cast<const T*>(pass.k.data);
    a.v = static_cast<const T*>(pass.v.data);
    a.o = static_cast<const T*>(pass.o.data);
    a.dout = static_cast<const T*>(pass.dout.data);
    a.qs = pass.q.stride;
    a.ks = pass.k.stride;
    a.vs = pass.v.stride;
    a.os = pass.o.stride;
    a.douts = pass.dout.stride;
    a.dq = static_cast<T*>(pass.dq.data);
    a.dk = static_cast<T*>(pass.dk.data);
    a.dv = static_cast<T*>(pass.dv.data);
    a.dqs = pass.dq.stride;
    a.dks = pass.dk.stride;
    a.dvs = pass.dv.stride;
    a.P = pass.P;
    a.D = pass.D;
    const Shape& s = pass.shape;
    // A varlen sequence may have no queries (its dk, dv are zeros: Tq = 0
    // leaves every key's query range empty) or no keys (its dq is zeros):
    // the kernels of the empty side are skipped, a grid of no blocks fails.
    const unsigned int query_blocks = grid_blocks(s.B * s.H * s.Tq, launch);
    const unsigned int kv_blocks = grid_blocks(s.B * s.Hkv * s.Tk, launch);
    if (query_blocks > 0) {
      attention_bwd_d<T><<<query_blocks, kThreadsPerBlock, 0, launch.stream>>>(a);
      check_launch("attention_bwd_d");
    }
    if (kv_blocks > 0) {
      attention_bwd_dv<T><<<kv_blocks, kThreadsPerBlock, 0, launch.stream>>>(a);
      check_launch("attention_bwd_dv");
    }
    if (query_blocks > 0) {
      attention_bwd_dq<T><<<query_blocks, kThreadsPerBlock, 0, launch.stream>>>(a);
      check_launch("attention_bwd_dq");
    }
    if (kv_blocks > 0) {
      attention_bwd_dk<T><<<kv_blocks, kThreadsPerBlock, 0, launch.stream>>>(a);
      check_launch("attention_bwd_dk");
    }
  });
}

}  // namespace gqattn::cuda::unfused
