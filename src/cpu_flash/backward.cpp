// cpu-flash's backward, in parallel phases, each task writing what no
// other task writes (no atomics, no shared accumulators):
//   stats: one task per (batch, head, query block): each row's max m and
//          sum l over its kept keys (the forward's online softmax without O);
//   dK/dV: one task per (batch, kv head, key block) loops over the group's
//          heads and the query blocks in the band, recomputing P = exp(s -
//          m) / l per tile, and accumulates dV += P^T dO, dK += dS^T Q;
//   dQ:    one task per (batch, head, query block) loops over its key blocks
//          and accumulates dQ += dS K;
// or, where the (batch, kv head) pairs alone occupy every worker
// (fuse_dq), the last two as one: a task per (batch, kv head) walks its
// key blocks in ascending order and adds dS K into the group's dQ rows
// right after dK and dV, saving the dQ phase's recomputation of S, P and
// dS (three of its tile products). Each dQ row gets the same products
// added in the same order (key blocks ascending) either way, so the two
// give the same bits.
// with D = rowsum(dO * O), dS = P * (dO V^T - D) * scale (times 1 - tanh^2
// under a softcap). Every sum runs in an order fixed by the tile sizes, so
// the bits are the same for any thread count. Rows without kept keys have
// P = 0 and so zero gradients. Checked by tests/cpu/test_cpu_flash.cpp.
//
// Why m and l, not exp(s - lse): the f32 lse carries a rounding of 2^-24
// |lse| into every P, which doubled the f32 error of dq and dv against the
// oracle (measured 8e-7 where the mirror errs 3.7e-7, over check::tolerance);
// the stats phase costs one Q K^T pass, about one GEMM of the backward's
// eight.
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

// One thread's tiles. Query side [bq][dp]; key side [Bk][dp] and transposed
// [dp][Bk]; score side [bq][Bk] and transposed [Bk][bq].
struct Scratch {
  std::vector<float> Q, dO, O, acc, K, Kt, V, Vt, dK, dV, S, T, dP, trans, D, m, inv_l;
  std::vector<float> group_dq;  // fuse_dq: [rep][q_blocks * bq][dp], one group's dQ
};

// Whether dQ is added by the dK/dV tasks (one per (batch, kv head)): when
// those are at least as many as the workers, so the fused pass leaves
// no worker idle.
bool fuse_dq(const Shape& s, const Plan& p, int threads) {
  const int64_t pairs = s.B * s.Hkv;
  return pairs >= cpu::worker_count(std::max(pairs * p.k_blocks, s.B * s.H * p.q_blocks), threads);
}

// Row statistics of the first phase: max m and 1 / sum l per (b, h, i).
struct RowStats {
  std::vector<float> m, inv_l;
  int64_t at(const Shape& s, int64_t b, int64_t h, int64_t i) const {
    return (b * s.H + h) * s.Tq + i;
  }
};

// The query side of a tile: Q, dO, D = rowsum(dO * O) and the row stats of
// rows q0 .. q0 + nq - 1 of head h.
void load_query_side(const detail::BackwardArgs& a, const Shape& s, const Plan& p,
                     const RowStats& st, int64_t b, int64_t h, int64_t q0, int64_t nq, Scratch& w) {
  const int64_t bq = p.block_q, dp = p.dp, d = s.d;
  load_tile(a.q, b, h, q0, bq, nq, d, w.Q.data(), dp);
  load_tile(a.dout, b, h, q0, bq, nq, d, w.dO.data(), dp);
  load_tile(a.o, b, h, q0, bq, nq, d, w.O.data(), dp);
  row_dots(bq, d, w.dO.data(), w.O.data(), dp, w.D.data());
  for (int64_t r = 0; r < bq; ++r) {
    w.m[r] = r < nq ? st.m[st.at(s, b, h, q0 + r)] : 0.0f;
    w.inv_l[r] = r < nq ? st.inv_l[st.at(s, b, h, q0 + r)] : 0.0f;
  }
}

// The key side: K, V of keys j0 .. j0 + nk - 1 and their transposes.
void load_key_side(const detail::BackwardArgs& a, const Shape& s, const Plan& p, int64_t b,
                   int64_t hkv, int64_t j0, int64_t nk, Scratch& w) {
  load_tile(a.k, b, hkv, j0, kBlockK, nk, s.d, w.K.data(), p.dp);
  load_tile(a.v, b, hkv, j0, kBlockK, nk, s.d, w.V.data(), p.dp);
  transpose(kBlockK, p.dp, w.K.data(), p.dp, w.Kt.data(), kBlockK);
  transpose(kBlockK, p.dp, w.V.data(), p.dp, w.Vt.data(), kBlockK);
}

// P (in S) and dS (in dP) of the loaded query and key sides.
void probabilities_and_ds(const Shape& s, const Plan& p, int64_t q0, int64_t j0, int64_t nk,
                          Scratch& w) {
  const int64_t bq = p.block_q, d = s.d;
  gemm_nn(bq, kBlockK, d, w.Q.data(), p.dp, w.Kt.data(), kBlockK, w.S.data(), kBlockK, false);
  gemm_nn(bq, kBlockK, d, w.dO.data(), p.dp, w.Vt.data(), kBlockK, w.dP.data(), kBlockK, false);
  for (int64_t r = 0; r < bq; ++r) {
    float* row = w.S.data() + r * kBlockK;
    float* dp = w.dP.data() + r * kBlockK;
    float* t = w.T.data() + r * kBlockK;
    const Range cols = kept_columns(s, q0 + r, j0, nk);
    if (cols.empty()) {
      std::fill(row, row + kBlockK, 0.0f);
      std::fill(dp, dp + kBlockK, 0.0f);
      continue;
    }
    transform_row(s, row, kBlockK, cols.first, cols.last, t);
    exp_sub(kBlockK, row, w.m[r], row);
    const float inv = w.inv_l[r];
    for (int64_t c = 0; c < kBlockK; ++c) row[c] *= inv;
    const float D = w.D[r];
    for (int64_t c = 0; c < kBlockK; ++c) dp[c] = row[c] * (dp[c] - D) * s.scale;
    if (s.softcap > 0.0f)
      for (int64_t c = 0; c < kBlockK; ++c) dp[c] *= 1.0f - t[c] * t[c];
  }
}

// Phase 1: m and 1 / l of query block qb of head h, key blocks ascending
// (the forward's online softmax without O).
void row_stats(const detail::BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h,
               int64_t qb, Scratch& w, RowStats& st) {
  const int64_t bq = p.block_q, q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  load_tile(a.q, b, h, q0, bq, nq, s.d, w.Q.data(), p.dp);
  std::fill(w.m.begin(), w.m.end(), neg_inf);
  std::fill(w.D.begin(), w.D.end(), 0.0f);  // l
  const Range blocks = key_blocks(s, q0, q0 + nq - 1);
  for (int64_t kb = blocks.first; kb <= blocks.last; ++kb) {
    const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
    load_tile(a.k, b, h / s.rep, j0, kBlockK, nk, s.d, w.K.data(), p.dp);
    transpose(kBlockK, p.dp, w.K.data(), p.dp, w.Kt.data(), kBlockK);
    gemm_nn(bq, kBlockK, s.d, w.Q.data(), p.dp, w.Kt.data(), kBlockK, w.S.data(), kBlockK, false);
    for (int64_t r = 0; r < nq; ++r) {
      float* row = w.S.data() + r * kBlockK;
      const Range cols = kept_columns(s, q0 + r, j0, nk);
      if (cols.empty()) continue;
      transform_row(s, row, kBlockK, cols.first, cols.last, nullptr);
      float mx = neg_inf;
      for (int64_t c = cols.first; c <= cols.last; ++c) mx = std::max(mx, row[c]);
      const float m_new = std::max(w.m[r], mx);
      const float alpha = std::exp(w.m[r] - m_new);
      exp_sub(kBlockK, row, m_new, row);
      float sum = 0.0f;
      for (int64_t c = 0; c < kBlockK; ++c) sum += row[c];
      w.D[r] = w.D[r] * alpha + sum;
      w.m[r] = m_new;
    }
  }
  for (int64_t r = 0; r < nq; ++r) {
    st.m[st.at(s, b, h, q0 + r)] = w.m[r];
    st.inv_l[st.at(s, b, h, q0 + r)] = w.D[r] > 0.0f ? 1.0f / w.D[r] : 0.0f;
  }
}

}  // namespace

void backward(const detail::BackwardArgs& args) {
  const Shape s = detail::resolve(args.problem);
  const Plan plan = make_plan(s);
  const int64_t d = s.d, dp = plan.dp, bq = plan.block_q;
  const int64_t kv_tasks = s.B * s.Hkv * plan.k_blocks;
  const int64_t q_tasks = s.B * s.H * plan.q_blocks;
  const int threads = args.options.num_threads;

  std::vector<Scratch> scratch(
      static_cast<std::size_t>(cpu::worker_count(std::max(kv_tasks, q_tasks), threads)));
  for (Scratch& w : scratch) {
    for (std::vector<float>* v : {&w.Q, &w.dO, &w.O, &w.acc}) *v = cpu::scratch_floats(bq * dp);
    for (std::vector<float>* v : {&w.K, &w.Kt, &w.V, &w.Vt, &w.dK, &w.dV})
      *v = cpu::scratch_floats(kBlockK * dp);
    for (std::vector<float>* v : {&w.S, &w.T, &w.dP, &w.trans})
      *v = cpu::scratch_floats(bq * kBlockK);
    w.D = cpu::scratch_floats(bq);
    w.m = cpu::scratch_floats(bq);
    w.inv_l = cpu::scratch_floats(bq);
  }
  RowStats stats{cpu::scratch_floats(s.B * s.H * s.Tq), cpu::scratch_floats(s.B * s.H * s.Tq)};

  cpu::parallel_for(q_tasks, threads, [&](int64_t task, int64_t worker) {
    const int64_t qb = plan.q_blocks - 1 - task % plan.q_blocks;
    const int64_t h = (task / plan.q_blocks) % s.H;
    const int64_t b = task / (plan.q_blocks * s.H);
    row_stats(args, s, plan, b, h, qb, scratch[static_cast<std::size_t>(worker)], stats);
  });

  // One key block's dK, dV (and with fused_dq its dQ products): the
  // group's heads and the query blocks in the band in ascending order.
  const auto key_block = [&](Scratch& w, int64_t b, int64_t hkv, int64_t kb, bool fused_dq) {
    const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
    load_key_side(args, s, plan, b, hkv, j0, nk, w);
    std::fill(w.dK.begin(), w.dK.end(), 0.0f);
    std::fill(w.dV.begin(), w.dV.end(), 0.0f);
    const Range blocks = query_blocks(s, plan, j0, j0 + nk - 1);
    for (int64_t g = 0; g < s.rep; ++g) {
      for (int64_t qb = blocks.first; qb <= blocks.last; ++qb) {
        const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
        load_query_side(args, s, plan, stats, b, hkv * s.rep + g, q0, nq, w);
        probabilities_and_ds(s, plan, q0, j0, nk, w);
        transpose(bq, kBlockK, w.S.data(), kBlockK, w.trans.data(), bq);
        gemm_nn(kBlockK, dp, bq, w.trans.data(), bq, w.dO.data(), dp, w.dV.data(), dp, true);
        transpose(bq, kBlockK, w.dP.data(), kBlockK, w.trans.data(), bq);
        gemm_nn(kBlockK, dp, bq, w.trans.data(), bq, w.Q.data(), dp, w.dK.data(), dp, true);
        if (fused_dq) {
          float* dq = w.group_dq.data() + (g * plan.q_blocks * bq + q0) * dp;
          gemm_nn(bq, dp, kBlockK, w.dP.data(), kBlockK, w.K.data(), dp, dq, dp, true);
        }
      }
    }
    store_tile(args.dk, b, hkv, j0, nk, d, w.dK.data(), dp);
    store_tile(args.dv, b, hkv, j0, nk, d, w.dV.data(), dp);
  };

  if (fuse_dq(s, plan, threads)) {
    for (Scratch& w : scratch) w.group_dq = cpu::scratch_floats(s.rep * plan.q_blocks * bq * dp);
    cpu::parallel_for(s.B * s.Hkv, threads, [&](int64_t task, int64_t worker) {
      Scratch& w = scratch[static_cast<std::size_t>(worker)];
      const int64_t hkv = task % s.Hkv, b = task / s.Hkv;
      std::fill(w.group_dq.begin(), w.group_dq.end(), 0.0f);
      for (int64_t kb = 0; kb < plan.k_blocks; ++kb) key_block(w, b, hkv, kb, true);
      for (int64_t g = 0; g < s.rep; ++g)
        for (int64_t qb = 0; qb < plan.q_blocks; ++qb) {
          const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
          store_tile(args.dq, b, hkv * s.rep + g, q0, nq, d,
                     w.group_dq.data() + (g * plan.q_blocks * bq + q0) * dp, dp);
        }
    });
    return;
  }

  cpu::parallel_for(kv_tasks, threads, [&](int64_t task, int64_t worker) {
    const int64_t kb = task % plan.k_blocks;
    const int64_t hkv = (task / plan.k_blocks) % s.Hkv;
    const int64_t b = task / (plan.k_blocks * s.Hkv);
    key_block(scratch[static_cast<std::size_t>(worker)], b, hkv, kb, false);
  });

  // dQ: one head's query block, its key blocks in ascending order.
  cpu::parallel_for(q_tasks, threads, [&](int64_t task, int64_t worker) {
    Scratch& w = scratch[static_cast<std::size_t>(worker)];
    const int64_t qb = plan.q_blocks - 1 - task % plan.q_blocks;
    const int64_t h = (task / plan.q_blocks) % s.H;
    const int64_t b = task / (plan.q_blocks * s.H);
    const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
    load_query_side(args, s, plan, stats, b, h, q0, nq, w);
    std::fill(w.acc.begin(), w.acc.end(), 0.0f);
    const Range blocks = key_blocks(s, q0, q0 + nq - 1);
    for (int64_t kb = blocks.first; kb <= blocks.last; ++kb) {
      const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
      load_key_side(args, s, plan, b, h / s.rep, j0, nk, w);
      probabilities_and_ds(s, plan, q0, j0, nk, w);
      gemm_nn(bq, dp, kBlockK, w.dP.data(), kBlockK, w.K.data(), dp, w.acc.data(), dp, true);
    }
    store_tile(args.dq, b, h, q0, nq, d, w.acc.data(), dp);
  });
}

}  // namespace gqattn::cpu_flash
