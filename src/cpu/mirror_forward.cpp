// The mirror's forward: the seed's attention_fwd per query row (b, h, i),
// plus lse = m + log(sum) and rows with no kept key (o = 0, lse = -inf).
// Checked bit-exact against the seed's transliteration
// (tests/cpu/test_mirror_seed.cpp), against the oracle
// (test_mirror_oracle.cpp) and by the property tests.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/mirror.hpp"
#include "cpu/parallel.hpp"

namespace gqattn::cpu {

void mirror_forward(const detail::ForwardArgs& args) {
  const MirrorShape shape = mirror_shape(args.problem);
  const int64_t Tq = shape.Tq, Tk = shape.Tk, d = shape.d;

  // One task per (b, h): its rows of o and lse belong to it alone.
  parallel_for(shape.B * shape.H, [&](int64_t task) {
    const int64_t b = task / shape.H;
    const int64_t h = task % shape.H;
    const int64_t hkv = h / shape.rep;
    // Converted once per task; the conversion to float is exact, so packing
    // changes no result (strided and packed inputs give the same bits).
    std::vector<float> K(Tk * d), V(Tk * d), q(d), o(d), prow(Tk);
    load_head(args.k, b, hkv, Tk, d, K.data());
    load_head(args.v, b, hkv, Tk, d, V.data());

    for (int64_t i = 0; i < Tq; ++i) {
      load_floats(args.q, element_offset(args.q, b, i, h), d, q.data());
      const RowSoftmax row = softmax_row(shape, i, q.data(), K.data(), prow.data());

      // o accumulates in f32 in a local row, as the seed's f32 O would, and
      // is rounded to the output dtype once at the end.
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t j = row.kept.first; j <= row.kept.last; ++j) {
        const float prob = prow[j];
        if (prob == 0.0f) continue;
        const float* vj = V.data() + j * d;
        for (int64_t x = 0; x < d; ++x) o[x] = std::fmaf(prob, vj[x], o[x]);
      }
      store_floats(args.o, element_offset(args.o, b, i, h), d, o.data());

      if (args.lse.data != nullptr) {
        const float lse =
            row.kept.empty() ? -std::numeric_limits<float>::infinity() : row.m + std::log(row.sum);
        store_floats(args.lse, element_offset(args.lse, b, h, i), 1, &lse);
      }
    }
  });
}

}  // namespace gqattn::cpu
