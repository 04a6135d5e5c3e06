// cpu-flash's forward: one task per (batch, kv head, query block) holds the
// query rows of the group's rep heads in one tile, so each K and V block is
// converted once for the whole group; key blocks outside the causal/window
// band are never visited. Online softmax per row (running max m, sum l,
// O rescaled by exp(m_old - m_new)), o = O / l and lse = m + log(l) at the
// end; rows without kept keys get o = 0, lse = -inf. A task writes only its
// own rows, in an order fixed by the tile sizes, so the bits do not depend on
// the thread count. Checked by tests/cpu/test_cpu_flash.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/parallel.hpp"
#include "cpu_flash/cpu_flash.hpp"
#include "cpu_flash/tile_io.hpp"
#include "cpu_flash/tile_kernels.hpp"

namespace gqattn::cpu_flash {
namespace {

struct Scratch {
  std::vector<float> Q, O, S, K, Kt, V, m, l;
};

}  // namespace

void forward(const detail::ForwardArgs& args) {
  const Shape s = detail::resolve(args.problem);
  const Plan plan = make_plan(s);
  const int64_t d = s.d, dp = plan.dp, bq = plan.block_q, R = s.rep * bq;
  const int64_t tasks = s.B * s.Hkv * plan.q_blocks;
  const int threads = args.options.num_threads;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  // Every buffer before any output is written (std::bad_alloc leaves them
  // untouched).
  std::vector<Scratch> scratch(static_cast<std::size_t>(cpu::worker_count(tasks, threads)));
  for (Scratch& w : scratch) {
    w.Q = cpu::scratch_floats(R * dp);
    w.O = cpu::scratch_floats(R * dp);
    w.S = cpu::scratch_floats(R * kBlockK);
    w.K = cpu::scratch_floats(kBlockK * dp);
    w.Kt = cpu::scratch_floats(dp * kBlockK);
    w.V = cpu::scratch_floats(kBlockK * dp);
    w.m = cpu::scratch_floats(R);
    w.l = cpu::scratch_floats(R);
  }

  cpu::parallel_for(tasks, threads, [&](int64_t task, int64_t worker) {
    Scratch& w = scratch[static_cast<std::size_t>(worker)];
    // Latest query blocks first: under a causal mask they are the longest.
    const int64_t qb = plan.q_blocks - 1 - task % plan.q_blocks;
    const int64_t hkv = (task / plan.q_blocks) % s.Hkv;
    const int64_t b = task / (plan.q_blocks * s.Hkv);
    const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);

    for (int64_t g = 0; g < s.rep; ++g)
      load_tile(args.q, b, hkv * s.rep + g, q0, bq, nq, d, w.Q.data() + g * bq * dp, dp);
    std::fill(w.O.begin(), w.O.end(), 0.0f);
    std::fill(w.m.begin(), w.m.end(), neg_inf);
    std::fill(w.l.begin(), w.l.end(), 0.0f);

    const Range blocks = key_blocks(s, q0, q0 + nq - 1);
    for (int64_t kb = blocks.first; kb <= blocks.last; ++kb) {
      const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
      load_tile(args.k, b, hkv, j0, kBlockK, nk, d, w.K.data(), dp);
      load_tile(args.v, b, hkv, j0, kBlockK, nk, d, w.V.data(), dp);
      transpose(kBlockK, dp, w.K.data(), dp, w.Kt.data(), kBlockK);
      gemm_nn(R, kBlockK, d, w.Q.data(), dp, w.Kt.data(), kBlockK, w.S.data(), kBlockK, false);

      for (int64_t r = 0; r < R; ++r) {
        float* row = w.S.data() + r * kBlockK;
        const Range cols = kept_columns(s, q0 + r % bq, j0, nk);
        if (cols.empty()) {
          std::fill(row, row + kBlockK, 0.0f);
          continue;
        }
        transform_row(s, row, kBlockK, cols.first, cols.last, nullptr);
        float mx = neg_inf;
        for (int64_t c = cols.first; c <= cols.last; ++c) mx = std::max(mx, row[c]);
        const float m_new = std::max(w.m[r], mx);
        const float alpha = std::exp(w.m[r] - m_new);  // 0 while m was -inf
        exp_sub(kBlockK, row, m_new, row);
        float sum = 0.0f;
        for (int64_t c = 0; c < kBlockK; ++c) sum += row[c];
        w.l[r] = w.l[r] * alpha + sum;
        w.m[r] = m_new;
        if (alpha != 1.0f) {
          float* o = w.O.data() + r * dp;
          for (int64_t x = 0; x < dp; ++x) o[x] *= alpha;
        }
      }
      gemm_nn(R, dp, kBlockK, w.S.data(), kBlockK, w.V.data(), dp, w.O.data(), dp, true);
    }

    for (int64_t r = 0; r < R; ++r) {
      float* o = w.O.data() + r * dp;
      const float inv = w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;
      for (int64_t x = 0; x < dp; ++x) o[x] *= inv;
    }
    for (int64_t g = 0; g < s.rep; ++g) {
      const int64_t h = hkv * s.rep + g;
      store_tile(args.o, b, h, q0, nq, d, w.O.data() + g * bq * dp, dp);
      if (args.lse.data == nullptr) continue;
      for (int64_t ii = 0; ii < nq; ++ii) {
        const int64_t r = g * bq + ii;
        const float lse = w.l[r] > 0.0f ? w.m[r] + std::log(w.l[r]) : neg_inf;
        cpu::store_floats(args.lse, cpu::element_offset(args.lse, b, h, q0 + ii), 1, &lse);
      }
    }
  });
}

}  // namespace gqattn::cpu_flash
