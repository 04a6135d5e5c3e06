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

}  // namespace

// lse is validated by the API but not read: the mirror recomputes m and sum
// with the forward's row routine, which is what makes its P bit-identical to
// the forward's (an lse-based exp(s - lse) would round differently).
void mirror_backward(const detail::BackwardArgs& args, int64_t wave_bytes) {
  const MirrorShape shape = mirror_shape(args.problem);
  const int64_t Tq = shape.Tq, Tk = shape.Tk, d = shape.d, rep = shape.rep;
  const int64_t groups = shape.B * shape.Hkv;
  const int64_t group_floats = rep * Tq * Tk;
  const int64_t per_wave =
      std::max<int64_t>(1, wave_bytes / (group_floats * static_cast<int64_t>(sizeof(float))));

  for (int64_t g0 = 0; g0 < groups; g0 += per_wave) {
    const int64_t g1 = std::min(groups, g0 + per_wave);
    // P[(g - g0), r, i, j] and D[(g - g0), r, i] for the wave's groups.
    std::vector<float> P((g1 - g0) * group_floats);
    std::vector<float> D((g1 - g0) * rep * Tq);

    // Phase 1, one task per query head (b, h): P and D (attention_bwd_d),
    // then dq (attention_bwd_dq) for each of its rows.
    parallel_for((g1 - g0) * rep, [&](int64_t task) {
      const int64_t g = g0 + task / rep;
      const int64_t r = task % rep;
      const int64_t b = g / shape.Hkv;
      const int64_t hkv = g % shape.Hkv;
      const int64_t h = hkv * rep + r;
      std::vector<float> K(Tk * d), V(Tk * d), q(d), o(d), dout(d), dq(d);
      load_head(args.k, b, hkv, Tk, d, K.data());
      load_head(args.v, b, hkv, Tk, d, V.data());

      for (int64_t i = 0; i < Tq; ++i) {
        float* prow = P.data() + (task * Tq + i) * Tk;
        load_floats(args.q, element_offset(args.q, b, i, h), d, q.data());
        load_floats(args.o, element_offset(args.o, b, i, h), d, o.data());
        load_floats(args.dout, element_offset(args.dout, b, i, h), d, dout.data());
        softmax_row(shape, i, q.data(), K.data(), prow);
        const float row_dot = fma_dot(dout.data(), o.data(), d);
        D[task * Tq + i] = row_dot;

        // dq accumulates in a local f32 row from 0 and is written once.
        std::fill(dq.begin(), dq.end(), 0.0f);
        for (int64_t j = 0; j < Tk; ++j) {
          const float prob = prow[j];
          if (prob == 0.0f) continue;
          const float* vj = V.data() + j * d;
          const float* kj = K.data() + j * d;
          const float dp = fma_dot(dout.data(), vj, d);
          const float ds = seed_ds(shape, prob, dp, row_dot, q.data(), kj);
          for (int64_t x = 0; x < d; ++x) dq[x] = std::fmaf(ds, kj[x], dq[x]);
        }
        store_floats(args.dq, element_offset(args.dq, b, i, h), d, dq.data());
      }
    });

    // Phase 2, one task per kv group (b, hkv): dk and dv (attention_bwd_dkv),
    // summed over the group's query heads privately, without atomics.
    parallel_for(g1 - g0, [&](int64_t task) {
      const int64_t g = g0 + task;
      const int64_t b = g / shape.Hkv;
      const int64_t hkv = g % shape.Hkv;
      std::vector<float> K(Tk * d), V(Tk * d), Q(rep * Tq * d), dO(rep * Tq * d);
      std::vector<float> dk(Tk * d, 0.0f), dv(Tk * d, 0.0f);
      load_head(args.k, b, hkv, Tk, d, K.data());
      load_head(args.v, b, hkv, Tk, d, V.data());
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t h = hkv * rep + r;
        for (int64_t i = 0; i < Tq; ++i) {
          load_floats(args.q, element_offset(args.q, b, i, h), d, Q.data() + (r * Tq + i) * d);
          load_floats(args.dout, element_offset(args.dout, b, i, h), d,
                      dO.data() + (r * Tq + i) * d);
        }
      }

      // The seed runs j outermost (one thread per kv row) and then r, i. Here
      // j is innermost so P is read along its rows; each dk[j], dv[j] still
      // sees its terms in the seed's (r, i) order, so every bit is the same.
      for (int64_t r = 0; r < rep; ++r) {
        for (int64_t i = 0; i < Tq; ++i) {
          const float* prow = P.data() + ((task * rep + r) * Tq + i) * Tk;
          const float* qi = Q.data() + (r * Tq + i) * d;
          const float* doi = dO.data() + (r * Tq + i) * d;
          const float row_dot = D[(task * rep + r) * Tq + i];
          for (int64_t j = 0; j < Tk; ++j) {
            const float prob = prow[j];
            if (prob == 0.0f) continue;
            const float* vj = V.data() + j * d;
            const float* kj = K.data() + j * d;
            const float dp = fma_dot(doi, vj, d);
            const float ds = seed_ds(shape, prob, dp, row_dot, qi, kj);
            float* dkj = dk.data() + j * d;
            float* dvj = dv.data() + j * d;
            for (int64_t x = 0; x < d; ++x) {
              dvj[x] = std::fmaf(prob, doi[x], dvj[x]);
              dkj[x] = std::fmaf(ds, qi[x], dkj[x]);
            }
          }
        }
      }
      for (int64_t j = 0; j < Tk; ++j) {
        store_floats(args.dk, element_offset(args.dk, b, j, hkv), d, dk.data() + j * d);
        store_floats(args.dv, element_offset(args.dv, b, j, hkv), d, dv.data() + j * d);
      }
    });
  }
}

}  // namespace gqattn::cpu
