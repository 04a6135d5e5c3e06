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
namespace {

// One thread's buffers: its task's kv head and one row.
struct Scratch {
  std::vector<float> K, V, q, o, prow;
};

}  // namespace

void mirror_forward(const detail::ForwardArgs& args) {
  const MirrorShape shape = detail::resolve(args.problem);
  const int64_t Tq = shape.Tq, Tk = shape.Tk, d = shape.d;
  const int64_t tasks = shape.B * shape.H;
  const int threads = args.options.num_threads;

  // Every buffer before any output is written (std::bad_alloc leaves them
  // untouched).
  std::vector<Scratch> scratch(static_cast<std::size_t>(worker_count(tasks, threads)));
  for (Scratch& s : scratch) {
    s.K = scratch_floats(Tk * d);
    s.V = scratch_floats(Tk * d);
    s.q = scratch_floats(d);
    s.o = scratch_floats(d);
    s.prow = scratch_floats(max_kept(shape));
  }

  // One task per (b, h): its rows of o and lse belong to it alone.
  parallel_for(tasks, threads, [&](int64_t task, int64_t worker) {
    const int64_t b = task / shape.H;
    const int64_t h = task % shape.H;
    const int64_t hkv = h / shape.rep;
    Scratch& s = scratch[static_cast<std::size_t>(worker)];
    // Converted once per task; the conversion to float is exact, so packing
    // changes no result (strided and packed inputs give the same bits).
    load_head(args.k, b, hkv, Tk, d, s.K.data());
    load_head(args.v, b, hkv, Tk, d, s.V.data());

    for (int64_t i = 0; i < Tq; ++i) {
      load_floats(args.q, element_offset(args.q, b, i, h), d, s.q.data());
      const RowSoftmax row = softmax_row(shape, i, s.q.data(), s.K.data(), s.prow.data());

      // o accumulates in f32 in a local row, as the seed's f32 O would, and
      // is rounded to the output dtype once at the end.
      std::fill(s.o.begin(), s.o.end(), 0.0f);
      for (int64_t j = row.kept.first; j <= row.kept.last; ++j) {
        const float prob = s.prow[j - row.kept.first];
        if (prob == 0.0f) continue;
        const float* vj = s.V.data() + j * d;
        for (int64_t x = 0; x < d; ++x) s.o[x] = std::fmaf(prob, vj[x], s.o[x]);
      }
      store_floats(args.o, element_offset(args.o, b, i, h), d, s.o.data());

      if (args.lse.data != nullptr) {
        const float lse =
            row.kept.empty() ? -std::numeric_limits<float>::infinity() : row.m + std::log(row.sum);
        store_floats(args.lse, element_offset(args.lse, b, h, i), 1, &lse);
      }
    }
  });
}

}  // namespace gqattn::cpu
