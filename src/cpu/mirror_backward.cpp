// The mirror's backward: the seed's attention_bwd_d, attention_bwd_dq and
// attention_bwd_dkv, with P recomputed by the forward's own softmax_row (the
// API passes o and lse, not P) so it is bit-identical to the P forward used.
// Checked bit-exact against the seed's transliteration
// (tests/cpu/test_mirror_seed.cpp), against the oracle
// (test_mirror_oracle.cpp) and by the property and determinism tests.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/mirror.hpp"
#include "cpu/parallel.hpp"

namespace gqattn::cpu {
namespace {

// The seed's dS for one (i, j): prob * (dp - D_i) * scale, times the softcap
// derivative. Like the seed it recomputes the raw dot q.k and takes
// tanh(s * scale / softcap): the forward's tanh argument, operation for
// operation.
float seed_ds(const MirrorShape& shape, float prob, float dp, float row_dot, const float* q,
              const float* k) {
  float ds = prob * (dp - row_dot) * shape.scale;
  if (shape.softcap > 0.0f) {
    const float s = fma_dot(q, k, shape.d);
    const float t = std::tanh(s * shape.scale / shape.softcap);
    ds *= 1.0f - t * t;
  }
  return ds;
}

// One thread's buffers: the kv head of its task, its dK and dV (phase 2),
// one row of each [Tq, H, d] tensor and one row of P.
struct Scratch {
  std::vector<float> K, V, dk, dv, q, o, dout, dq, prow;
};

}  // namespace

// lse is validated by the API but not read: the mirror recomputes m and sum
// with the forward's row routine, which is what makes its P bit-identical to
// the forward's (an lse-based exp(s - lse) would round differently).
//
// The seed materialises P (and D) once and reads it in attention_bwd_dq and
// attention_bwd_dkv. Here each phase recomputes its row of P with
// softmax_row and D with the seed's dot: the same operations on the same
// values, so the same bits, in memory that follows the kept pairs.
void mirror_backward(const detail::BackwardArgs& args) {
  const MirrorShape shape = detail::resolve(args.problem);
  const int64_t Tq = shape.Tq, Tk = shape.Tk, d = shape.d, rep = shape.rep;
  const int64_t groups = shape.B * shape.Hkv;
  const int64_t heads = shape.B * shape.H;
  const int threads = args.options.num_threads;

  // Every buffer before any output is written (std::bad_alloc leaves them
  // untouched).
  std::vector<Scratch> scratch(
      static_cast<std::size_t>(worker_count(std::max(groups, heads), threads)));
  for (Scratch& s : scratch) {
    s.K = scratch_floats(Tk * d);
    s.V = scratch_floats(Tk * d);
    s.dk = scratch_floats(Tk * d);
    s.dv = scratch_floats(Tk * d);
    s.q = scratch_floats(d);
    s.o = scratch_floats(d);
    s.dout = scratch_floats(d);
    s.dq = scratch_floats(d);
    s.prow = scratch_floats(max_kept(shape));
  }

  // Phase 1, one task per query head (b, h): P and D (attention_bwd_d),
  // then dq (attention_bwd_dq) for each of its rows.
  parallel_for(heads, threads, [&](int64_t task, int64_t worker) {
    const int64_t b = task / shape.H;
    const int64_t h = task % shape.H;
    const int64_t hkv = h / rep;
    Scratch& s = scratch[static_cast<std::size_t>(worker)];
    load_head(args.k, b, hkv, Tk, d, s.K.data());
    load_head(args.v, b, hkv, Tk, d, s.V.data());

    for (int64_t i = 0; i < Tq; ++i) {
      load_floats(args.q, element_offset(args.q, b, i, h), d, s.q.data());
      load_floats(args.o, element_offset(args.o, b, i, h), d, s.o.data());
      load_floats(args.dout, element_offset(args.dout, b, i, h), d, s.dout.data());
      const RowSoftmax row = softmax_row(shape, i, s.q.data(), s.K.data(), s.prow.data());
      const float row_dot = fma_dot(s.dout.data(), s.o.data(), d);

      // dq accumulates in a local f32 row from 0 and is written once.
      std::fill(s.dq.begin(), s.dq.end(), 0.0f);
      for (int64_t j = row.kept.first; j <= row.kept.last; ++j) {
        const float prob = s.prow[j - row.kept.first];
        if (prob == 0.0f) continue;
        const float* vj = s.V.data() + j * d;
        const float* kj = s.K.data() + j * d;
        const float dp = fma_dot(s.dout.data(), vj, d);
        const float ds = seed_ds(shape, prob, dp, row_dot, s.q.data(), kj);
        for (int64_t x = 0; x < d; ++x) s.dq[x] = std::fmaf(ds, kj[x], s.dq[x]);
      }
      store_floats(args.dq, element_offset(args.dq, b, i, h), d, s.dq.data());
    }
  });

  // Phase 2, one task per kv group (b, hkv): dk and dv (attention_bwd_dkv),
  // summed over the group's query heads privately, without atomics.
  parallel_for(groups, threads, [&](int64_t task, int64_t worker) {
    const int64_t b = task / shape.Hkv;
    const int64_t hkv = task % shape.Hkv;
    Scratch& s = scratch[static_cast<std::size_t>(worker)];
    load_head(args.k, b, hkv, Tk, d, s.K.data());
    load_head(args.v, b, hkv, Tk, d, s.V.data());
    std::fill(s.dk.begin(), s.dk.end(), 0.0f);
    std::fill(s.dv.begin(), s.dv.end(), 0.0f);

    // The seed runs j outermost (one thread per kv row) and then r, i. Here
    // j is innermost so P is read along its rows; each dk[j], dv[j] still
    // sees its terms in the seed's (r, i) order, so every bit is the same.
    for (int64_t r = 0; r < rep; ++r) {
      const int64_t h = hkv * rep + r;
      for (int64_t i = 0; i < Tq; ++i) {
        load_floats(args.q, element_offset(args.q, b, i, h), d, s.q.data());
        load_floats(args.o, element_offset(args.o, b, i, h), d, s.o.data());
        load_floats(args.dout, element_offset(args.dout, b, i, h), d, s.dout.data());
        const RowSoftmax row = softmax_row(shape, i, s.q.data(), s.K.data(), s.prow.data());
        const float row_dot = fma_dot(s.dout.data(), s.o.data(), d);
        const float* qi = s.q.data();
        const float* doi = s.dout.data();
        for (int64_t j = row.kept.first; j <= row.kept.last; ++j) {
          const float prob = s.prow[j - row.kept.first];
          if (prob == 0.0f) continue;
          const float* vj = s.V.data() + j * d;
          const float* kj = s.K.data() + j * d;
          const float dp = fma_dot(doi, vj, d);
          const float ds = seed_ds(shape, prob, dp, row_dot, qi, kj);
          float* dkj = s.dk.data() + j * d;
          float* dvj = s.dv.data() + j * d;
          for (int64_t x = 0; x < d; ++x) {
            dvj[x] = std::fmaf(prob, doi[x], dvj[x]);
            dkj[x] = std::fmaf(ds, qi[x], dkj[x]);
          }
        }
      }
    }
    for (int64_t j = 0; j < Tk; ++j) {
      store_floats(args.dk, element_offset(args.dk, b, j, hkv), d, s.dk.data() + j * d);
      store_floats(args.dv, element_offset(args.dv, b, j, hkv), d, s.dv.data() + j * d);
    }
  });
}

}  // namespace gqattn::cpu
