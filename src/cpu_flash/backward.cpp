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
// key blocks in ascending order, a few at a time, and adds dS K into the
// group's dQ rows right after dK and dV, saving the dQ phase's
// recomputation of S, P and dS (three of its tile products). Each dQ row gets the same products
// added in the same order (key blocks ascending) either way, so the two
// give the same bits.
// with D = rowsum(dO * O), dS = P * (dO V^T - D) * scale (times 1 - tanh^2
// under a softcap). Every sum runs in an order fixed by the tile sizes, so
// the bits are the same for any thread count. Rows without kept keys have
// P = 0 and so zero gradients. D is computed once per query row, in the
// statistics phase. bf16 problems on a CPU with AVX512-BF16 run the tile
// products on bf16 operands (Bf16Tiles: S and dP from the inputs as they
// are, P and dS rounded to bf16 for dV, dK and dQ, f32 accumulation), the
// rest converts to f32 (F32Avx512Tiles on an AVX-512 CPU, else the
// portable F32Tiles). Checked by tests/cpu/test_cpu_flash.cpp
// and tests/cpu/test_cpu_flash_avx512.cpp.
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
#include "cpu_flash/avx512_kernels.hpp"
#include "cpu_flash/cpu_flash.hpp"
#include "cpu_flash/tile_io.hpp"
#include "cpu_flash/tile_kernels.hpp"

namespace gqattn::cpu_flash {
namespace {

using detail::BackwardArgs;

// The tile products of the f32 path: every operand converted to f32 (any
// dtype), the portable loops of tile_kernels.hpp (any CPU). Query side [bq][dp]; key side [Bk][dp]
// and transposed [dp][Bk]; `trans` a score tile transposed [Bk][bq].
struct F32Tiles {
  std::vector<float> Q, dO, O, K, Kt, V, Vt, trans;
  F32Tiles(const Plan& p)
      : Q(cpu::scratch_floats(p.block_q * p.dp)),
        dO(cpu::scratch_floats(p.block_q * p.dp)),
        O(cpu::scratch_floats(p.block_q * p.dp)),
        K(cpu::scratch_floats(kBlockK * p.dp)),
        Kt(cpu::scratch_floats(kBlockK * p.dp)),
        V(cpu::scratch_floats(kBlockK * p.dp)),
        Vt(cpu::scratch_floats(kBlockK * p.dp)),
        trans(cpu::scratch_floats(p.block_q * kBlockK)) {}
  void load_q(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h,
              int64_t q0, int64_t nq) {
    load_tile(a.q, b, h, q0, p.block_q, nq, s.d, Q.data(), p.dp);
  }
  void load_do(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h,
               int64_t q0, int64_t nq) {
    load_tile(a.dout, b, h, q0, p.block_q, nq, s.d, dO.data(), p.dp);
  }
  // D = rowsum(dO * O), rounded as the dP GEMM rounds (after load_do).
  void row_d(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h, int64_t q0,
             int64_t nq, float* D) {
    load_tile(a.o, b, h, q0, p.block_q, nq, s.d, O.data(), p.dp);
    row_dots(p.block_q, s.d, dO.data(), O.data(), p.dp, D);
  }
  void load_k(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
              int64_t j0, int64_t nk) {
    load_tile(a.k, b, hkv, j0, kBlockK, nk, s.d, K.data(), p.dp);
    transpose(kBlockK, p.dp, K.data(), p.dp, Kt.data(), kBlockK);
  }
  void load_v(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
              int64_t j0, int64_t nk) {
    load_tile(a.v, b, hkv, j0, kBlockK, nk, s.d, V.data(), p.dp);
    transpose(kBlockK, p.dp, V.data(), p.dp, Vt.data(), kBlockK);
  }
  // S = Q K^T.
  void scores(const Shape& s, const Plan& p, float* S) {
    gemm_nn(p.block_q, kBlockK, s.d, Q.data(), p.dp, Kt.data(), kBlockK, S, kBlockK, false);
  }
  // dP = dO V^T.
  void score_grads(const Shape& s, const Plan& p, float* dP) {
    gemm_nn(p.block_q, kBlockK, s.d, dO.data(), p.dp, Vt.data(), kBlockK, dP, kBlockK, false);
  }
  // dV += P^T dO, dK += dS^T Q.
  void add_grads(const Plan& p, const float* P, const float* dS, float* dK, float* dV) {
    const int64_t bq = p.block_q, dp = p.dp;
    transpose(bq, kBlockK, P, kBlockK, trans.data(), bq);
    gemm_nn(kBlockK, dp, bq, trans.data(), bq, dO.data(), dp, dV, dp, true);
    transpose(bq, kBlockK, dS, kBlockK, trans.data(), bq);
    gemm_nn(kBlockK, dp, bq, trans.data(), bq, Q.data(), dp, dK, dp, true);
  }
  // dQ += dS K.
  void add_dq(const Plan& p, const float* dS, float* dq) {
    gemm_nn(p.block_q, p.dp, kBlockK, dS, kBlockK, K.data(), p.dp, dq, p.dp, true);
  }
  // The statistics phase's online-softmax step on the scores S of rows
  // q0 .. q0 + nq - 1 and keys j0 .. j0 + nk - 1: m and l updated.
  void stats_step(const Shape& s, int64_t q0, int64_t nq, int64_t j0, int64_t nk, float* S,
                  float* m, float* l) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < nq; ++r) {
      float* row = S + r * kBlockK;
      const Range cols = kept_columns(s, q0 + r, j0, nk);
      if (cols.empty()) continue;
      transform_row(s, row, kBlockK, cols.first, cols.last, nullptr);
      float mx = neg_inf;
      for (int64_t c = cols.first; c <= cols.last; ++c) mx = std::max(mx, row[c]);
      const float m_new = std::max(m[r], mx);
      const float alpha = std::exp(m[r] - m_new);
      exp_sub(kBlockK, row, m_new, row);
      float sum = 0.0f;
      for (int64_t c = 0; c < kBlockK; ++c) sum += row[c];
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
    }
  }
  // P (in S) and dS (in dP) from the scores S and dP = dO V^T of a tile,
  // the rows' m, 1 / l and D (T: scratch for the softcap's tanh).
  void probabilities_and_ds(const Shape& s, const Plan& p, int64_t q0, int64_t j0, int64_t nk,
                            float* S, float* dP, float* T, const float* m, const float* inv_l,
                            const float* D) {
    for (int64_t r = 0; r < p.block_q; ++r) {
      float* row = S + r * kBlockK;
      float* dp = dP + r * kBlockK;
      float* t = T + r * kBlockK;
      const Range cols = kept_columns(s, q0 + r, j0, nk);
      if (cols.empty()) {
        std::fill(row, row + kBlockK, 0.0f);
        std::fill(dp, dp + kBlockK, 0.0f);
        continue;
      }
      transform_row(s, row, kBlockK, cols.first, cols.last, t);
      exp_sub(kBlockK, row, m[r], row);
      const float inv = inv_l[r];
      for (int64_t c = 0; c < kBlockK; ++c) row[c] *= inv;
      const float Dr = D[r];
      for (int64_t c = 0; c < kBlockK; ++c) dp[c] = row[c] * (dp[c] - Dr) * s.scale;
      if (s.softcap > 0.0f)
        for (int64_t c = 0; c < kBlockK; ++c) dp[c] *= 1.0f - t[c] * t[c];
    }
  }
  void store(const TensorRef& t, int64_t b, int64_t h, int64_t row0, int64_t valid, int64_t d,
             float* tile, int64_t ld) {
    store_tile(t, b, h, row0, valid, d, tile, ld);
  }
};

// The f32 path on an AVX-512 CPU (avx512_enabled()): the products, D and
// the softmax steps by the intrinsics of avx512_kernels.hpp
// (docs/decisions/cpu-flash-gemm.md). Q, dO, K and V are read where they
// lie when they need no conversion (f32_tile), P^T and dS^T in place.
struct F32Avx512Tiles : F32Tiles {
  KeptColumns kept;
  TileView q, dout, k;  // where the loaded Q, dO and K are read
  explicit F32Avx512Tiles(const Plan& p) : F32Tiles(p), kept(p.block_q) {}
  void load_q(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h,
              int64_t q0, int64_t nq) {
    q = f32_tile(a.q, b, h, q0, p.block_q, nq, s.d, p.dp, Q.data());
  }
  void load_do(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h,
               int64_t q0, int64_t nq) {
    dout = f32_tile(a.dout, b, h, q0, p.block_q, nq, s.d, p.dp, dO.data());
  }
  void row_d(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h, int64_t q0,
             int64_t nq, float* D) {
    const TileView o = f32_tile(a.o, b, h, q0, p.block_q, nq, s.d, p.dp, O.data());
    row_dots_f32(p.block_q, s.d, dout.data, dout.ld, o.data, o.ld, D);
  }
  void load_k(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
              int64_t j0, int64_t nk) {
    k = f32_tile(a.k, b, hkv, j0, kBlockK, nk, s.d, p.dp, K.data());
    transpose_f32(kBlockK, p.dp, k.data, k.ld, Kt.data(), kBlockK);
  }
  void load_v(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
              int64_t j0, int64_t nk) {
    const TileView v = f32_tile(a.v, b, hkv, j0, kBlockK, nk, s.d, p.dp, V.data());
    transpose_f32(kBlockK, p.dp, v.data, v.ld, Vt.data(), kBlockK);
  }
  void scores(const Shape& s, const Plan& p, float* S) {
    gemm_f32(p.block_q, kBlockK, s.d, q.data, q.ld, 1, Kt.data(), kBlockK, S, kBlockK, false);
  }
  void score_grads(const Shape& s, const Plan& p, float* dP) {
    gemm_f32(p.block_q, kBlockK, s.d, dout.data, dout.ld, 1, Vt.data(), kBlockK, dP, kBlockK,
             false);
  }
  void add_grads(const Plan& p, const float* P, const float* dS, float* dK, float* dV) {
    const int64_t bq = p.block_q, dp = p.dp;
    gemm_f32(kBlockK, dp, bq, P, 1, kBlockK, dout.data, dout.ld, dV, dp, true);
    gemm_f32(kBlockK, dp, bq, dS, 1, kBlockK, q.data, q.ld, dK, dp, true);
  }
  void add_dq(const Plan& p, const float* dS, float* dq) {
    gemm_f32(p.block_q, p.dp, kBlockK, dS, kBlockK, 1, k.data, k.ld, dq, p.dp, true);
  }
  void stats_step(const Shape& s, int64_t q0, int64_t nq, int64_t j0, int64_t nk, float* S,
                  float* m, float* l) {
    softmax_step_f32(nq, S, kept.of(s, q0, nq, nq, j0, nk), m, l, nullptr, 0, 0);
  }
  void probabilities_and_ds(const Shape& s, const Plan& p, int64_t q0, int64_t j0, int64_t nk,
                            float* S, float* dP, float*, const float* m, const float* inv_l,
                            const float* D) {
    probabilities_and_ds_avx512(p.block_q, S, dP, kept.of(s, q0, p.block_q, p.block_q, j0, nk), m,
                                inv_l, D);
  }
};

// The tile products on bf16 operands (bf16 I/O, bf16_dot_enabled()): Q, K,
// V, dO as they are (S and dP from exact products), P and dS rounded to
// bf16 for dV, dK and dQ, as the fused CUDA kernels feed them to the tensor
// cores. A operands row-major, B operands pair-major (avx512_kernels.hpp).
struct Bf16Tiles {
  std::vector<uint16_t> Q, dO, O, K, V, Pt, dSt, dS;
  std::vector<uint32_t> Qp, dOp, Kt, Vt, Kp;
  KeptColumns kept;
  Bf16Tiles(const Plan& p)
      : Q(std::size_t(p.block_q * p.dp)),
        dO(std::size_t(p.block_q * p.dp)),
        O(std::size_t(p.block_q * p.dp)),
        K(std::size_t(kBlockK * p.dp)),
        V(std::size_t(kBlockK * p.dp)),
        Pt(std::size_t(kBlockK * p.block_q)),
        dSt(std::size_t(kBlockK * p.block_q)),
        dS(std::size_t(p.block_q * kBlockK)),
        Qp(std::size_t(p.block_q / 2 * p.dp)),
        dOp(std::size_t(p.block_q / 2 * p.dp)),
        Kt(std::size_t(p.dp / 2 * kBlockK)),
        Vt(std::size_t(p.dp / 2 * kBlockK)),
        Kp(std::size_t(kBlockK / 2 * p.dp)),
        kept(p.block_q) {}
  void load_q(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h,
              int64_t q0, int64_t nq) {
    load_tile_bf16(a.q, b, h, q0, p.block_q, nq, s.d, Q.data(), p.dp);
    pair_rows(p.block_q, p.dp, Q.data(), p.dp, Qp.data(), p.dp);
  }
  void load_do(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h,
               int64_t q0, int64_t nq) {
    load_tile_bf16(a.dout, b, h, q0, p.block_q, nq, s.d, dO.data(), p.dp);
    pair_rows(p.block_q, p.dp, dO.data(), p.dp, dOp.data(), p.dp);
  }
  void row_d(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h, int64_t q0,
             int64_t nq, float* D) {
    load_tile_bf16(a.o, b, h, q0, p.block_q, nq, s.d, O.data(), p.dp);
    row_dots_bf16(p.block_q, round_up(s.d, 2), dO.data(), O.data(), p.dp, D);
  }
  void load_k(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
              int64_t j0, int64_t nk) {
    load_tile_bf16(a.k, b, hkv, j0, kBlockK, nk, s.d, K.data(), p.dp);
    transpose_pairs(kBlockK, p.dp, K.data(), p.dp, Kt.data(), kBlockK);
    pair_rows(kBlockK, p.dp, K.data(), p.dp, Kp.data(), p.dp);
  }
  void load_v(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
              int64_t j0, int64_t nk) {
    load_tile_bf16(a.v, b, hkv, j0, kBlockK, nk, s.d, V.data(), p.dp);
    transpose_pairs(kBlockK, p.dp, V.data(), p.dp, Vt.data(), kBlockK);
  }
  void scores(const Shape& s, const Plan& p, float* S) {
    gemm_bf16(p.block_q, kBlockK, round_up(s.d, 2), Q.data(), p.dp, Kt.data(), kBlockK, S, kBlockK,
              false);
  }
  void score_grads(const Shape& s, const Plan& p, float* dP) {
    gemm_bf16(p.block_q, kBlockK, round_up(s.d, 2), dO.data(), p.dp, Vt.data(), kBlockK, dP,
              kBlockK, false);
  }
  void add_grads(const Plan& p, const float* P, const float* dSf, float* dK, float* dV) {
    const int64_t bq = p.block_q, dp = p.dp;
    operands_to_bf16_transposed(bq, kBlockK, P, kBlockK, Pt.data(), bq);
    gemm_bf16(kBlockK, dp, bq, Pt.data(), bq, dOp.data(), dp, dV, dp, true);
    operands_to_bf16_transposed(bq, kBlockK, dSf, kBlockK, dSt.data(), bq);
    gemm_bf16(kBlockK, dp, bq, dSt.data(), bq, Qp.data(), dp, dK, dp, true);
  }
  void add_dq(const Plan& p, const float* dSf, float* dq) {
    operands_to_bf16(p.block_q, kBlockK, dSf, kBlockK, dS.data(), kBlockK);
    gemm_bf16(p.block_q, p.dp, kBlockK, dS.data(), kBlockK, Kp.data(), p.dp, dq, p.dp, true);
  }
  void stats_step(const Shape& s, int64_t q0, int64_t nq, int64_t j0, int64_t nk, float* S,
                  float* m, float* l) {
    softmax_step_bf16(nq, S, kept.of(s, q0, nq, nq, j0, nk), m, l, nullptr, 0, 0, nullptr);
  }
  void probabilities_and_ds(const Shape& s, const Plan& p, int64_t q0, int64_t j0, int64_t nk,
                            float* S, float* dP, float*, const float* m, const float* inv_l,
                            const float* D) {
    probabilities_and_ds_avx512(p.block_q, S, dP, kept.of(s, q0, p.block_q, p.block_q, j0, nk), m,
                                inv_l, D);
  }
  void store(const TensorRef& t, int64_t b, int64_t h, int64_t row0, int64_t valid, int64_t d,
             float* tile, int64_t ld) {
    for (int64_t r = 0; r < valid; ++r)
      round_to_bf16(1, d, tile + r * ld, ld,
                    static_cast<uint16_t*>(t.data) + cpu::element_offset(t, b, row0 + r, h), d);
  }
};

// One thread's tiles: the path's operands and the f32 score side [bq][Bk],
// dK / dV [Bk][dp], a dQ tile [bq][dp] and the loaded rows' statistics.
template <class Tiles>
struct Scratch {
  Tiles tiles;
  std::vector<float> S, T, dP, dK, dV, acc, D, m, inv_l;
  explicit Scratch(const Plan& p)
      : tiles(p),
        S(cpu::scratch_floats(p.block_q * kBlockK)),
        T(cpu::scratch_floats(p.block_q * kBlockK)),
        dP(cpu::scratch_floats(p.block_q * kBlockK)),
        dK(cpu::scratch_floats(kBlockK * p.dp)),
        dV(cpu::scratch_floats(kBlockK * p.dp)),
        acc(cpu::scratch_floats(p.block_q * p.dp)),
        D(cpu::scratch_floats(p.block_q)),
        m(cpu::scratch_floats(p.block_q)),
        inv_l(cpu::scratch_floats(p.block_q)) {}
};

// Whether dQ is added by the dK/dV tasks (one per (batch, kv head)): when
// those are at least as many as the workers, so the fused pass leaves
// no worker idle.
bool fuse_dq(const Shape& s, const Plan& p, int threads) {
  const int64_t pairs = s.B * s.Hkv;
  return pairs >= cpu::worker_count(std::max(pairs * p.k_blocks, s.B * s.H * p.q_blocks), threads);
}

// Row statistics of the first phase: max m, 1 / sum l and D = rowsum(dO *
// O) per (b, h, i).
struct RowStats {
  std::vector<float> m, inv_l, D;
  int64_t at(const Shape& s, int64_t b, int64_t h, int64_t i) const {
    return (b * s.H + h) * s.Tq + i;
  }
};

// The query side of a tile: Q, dO and the row stats (m, 1 / l, D) of rows
// q0 .. q0 + nq - 1 of head h.
template <class Tiles>
void load_query_side(const BackwardArgs& a, const Shape& s, const Plan& p, const RowStats& st,
                     int64_t b, int64_t h, int64_t q0, int64_t nq, Scratch<Tiles>& w) {
  w.tiles.load_q(a, s, p, b, h, q0, nq);
  w.tiles.load_do(a, s, p, b, h, q0, nq);
  for (int64_t r = 0; r < p.block_q; ++r) {
    const bool in = r < nq;
    w.m[r] = in ? st.m[st.at(s, b, h, q0 + r)] : 0.0f;
    w.inv_l[r] = in ? st.inv_l[st.at(s, b, h, q0 + r)] : 0.0f;
    w.D[r] = in ? st.D[st.at(s, b, h, q0 + r)] : 0.0f;
  }
}

// The key side: K and V of keys j0 .. j0 + nk - 1.
template <class Tiles>
void load_key_side(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
                   int64_t j0, int64_t nk, Scratch<Tiles>& w) {
  w.tiles.load_k(a, s, p, b, hkv, j0, nk);
  w.tiles.load_v(a, s, p, b, hkv, j0, nk);
}

// P (in S) and dS (in dP) of the loaded query and key sides.
template <class Tiles>
void probabilities_and_ds(const Shape& s, const Plan& p, int64_t q0, int64_t j0, int64_t nk,
                          Scratch<Tiles>& w) {
  w.tiles.scores(s, p, w.S.data());
  w.tiles.score_grads(s, p, w.dP.data());
  w.tiles.probabilities_and_ds(s, p, q0, j0, nk, w.S.data(), w.dP.data(), w.T.data(), w.m.data(),
                               w.inv_l.data(), w.D.data());
}

// Phase 1: m, 1 / l and D of query block qb of head h, key blocks
// ascending (the forward's online softmax without O).
template <class Tiles>
void row_stats(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h,
               int64_t qb, Scratch<Tiles>& w, RowStats& st) {
  const int64_t bq = p.block_q, q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  w.tiles.load_q(a, s, p, b, h, q0, nq);
  std::fill(w.m.begin(), w.m.end(), neg_inf);
  std::fill(w.D.begin(), w.D.end(), 0.0f);  // l
  const Range blocks = key_blocks(s, q0, q0 + nq - 1);
  for (int64_t kb = blocks.first; kb <= blocks.last; ++kb) {
    const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
    w.tiles.load_k(a, s, p, b, h / s.rep, j0, nk);
    w.tiles.scores(s, p, w.S.data());
    w.tiles.stats_step(s, q0, nq, j0, nk, w.S.data(), w.m.data(), w.D.data());
  }
  for (int64_t r = 0; r < nq; ++r) {
    st.m[st.at(s, b, h, q0 + r)] = w.m[r];
    st.inv_l[st.at(s, b, h, q0 + r)] = w.D[r] > 0.0f ? 1.0f / w.D[r] : 0.0f;
  }
  w.tiles.load_do(a, s, p, b, h, q0, nq);
  w.tiles.row_d(a, s, p, b, h, q0, nq, w.D.data());
  for (int64_t r = 0; r < nq; ++r) st.D[st.at(s, b, h, q0 + r)] = w.D[r];
}

template <class Tiles>
void run(const BackwardArgs& args) {
  const Shape s = detail::resolve(args.problem);
  const Plan plan = make_plan(s);
  const int64_t d = s.d, dp = plan.dp, bq = plan.block_q;
  const int64_t kv_tasks = s.B * s.Hkv * plan.k_blocks;
  const int64_t q_tasks = s.B * s.H * plan.q_blocks;
  const int threads = args.options.num_threads;

  // The fused pass holds kFusedKeyBlocks key blocks at once, one Scratch
  // each: Q, dO and the group's dQ rows are then read from memory once per
  // chunk of key blocks, not once per block (measured:
  // docs/decisions/cpu-flash-backward-fused-dq.md). Each dQ row still adds
  // its key blocks in ascending order, and each dK / dV its (head, query
  // block) tiles in the same order: the same bits as one block at a time.
  constexpr int64_t kFusedKeyBlocks = 4;
  const bool fused = fuse_dq(s, plan, threads);
  const int64_t slots = fused ? kFusedKeyBlocks : 1;  // Scratch per worker
  const int64_t workers = cpu::worker_count(std::max(kv_tasks, q_tasks), threads);
  std::vector<Scratch<Tiles>> scratch;
  scratch.reserve(static_cast<std::size_t>(workers * slots));
  for (int64_t i = 0; i < workers * slots; ++i) scratch.emplace_back(plan);
  const auto slot = [&](int64_t worker, int64_t i) -> Scratch<Tiles>& {
    return scratch[static_cast<std::size_t>(worker * slots + i)];
  };
  // fused: one group's dQ per worker, [rep][q_blocks * bq][dp].
  std::vector<std::vector<float>> group_dq(fused ? static_cast<std::size_t>(workers) : 0);
  for (std::vector<float>& g : group_dq) g = cpu::scratch_floats(s.rep * plan.q_blocks * bq * dp);
  const int64_t rows = s.B * s.H * s.Tq;
  RowStats stats{cpu::scratch_floats(rows), cpu::scratch_floats(rows), cpu::scratch_floats(rows)};

  cpu::parallel_for(q_tasks, threads, [&](int64_t task, int64_t worker) {
    const int64_t qb = plan.q_blocks - 1 - task % plan.q_blocks;
    const int64_t h = (task / plan.q_blocks) % s.H;
    const int64_t b = task / (plan.q_blocks * s.H);
    row_stats(args, s, plan, b, h, qb, slot(worker, 0), stats);
  });

  // A key block's dK and dV in w: its keys loaded, the sums zeroed; then
  // the tiles of (head g of the group, query block qb) added, P^T dO and
  // dS^T Q (and dS K into dq_rows when not null); then stored.
  const auto open_key_block = [&](Scratch<Tiles>& w, int64_t b, int64_t hkv, int64_t kb) {
    const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
    load_key_side(args, s, plan, b, hkv, j0, nk, w);
    std::fill(w.dK.begin(), w.dK.end(), 0.0f);
    std::fill(w.dV.begin(), w.dV.end(), 0.0f);
  };
  const auto add_tile = [&](Scratch<Tiles>& w, int64_t b, int64_t hkv, int64_t kb, int64_t g,
                            int64_t qb, float* dq_rows) {
    const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
    const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
    load_query_side(args, s, plan, stats, b, hkv * s.rep + g, q0, nq, w);
    probabilities_and_ds(s, plan, q0, j0, nk, w);
    w.tiles.add_grads(plan, w.S.data(), w.dP.data(), w.dK.data(), w.dV.data());
    if (dq_rows != nullptr) w.tiles.add_dq(plan, w.dP.data(), dq_rows);
  };
  const auto close_key_block = [&](Scratch<Tiles>& w, int64_t b, int64_t hkv, int64_t kb) {
    const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
    w.tiles.store(args.dk, b, hkv, j0, nk, d, w.dK.data(), dp);
    w.tiles.store(args.dv, b, hkv, j0, nk, d, w.dV.data(), dp);
  };
  const auto band = [&](int64_t kb) {
    const int64_t j0 = kb * kBlockK;
    return query_blocks(s, plan, j0, std::min(j0 + kBlockK, s.Tk) - 1);
  };

  if (fused) {
    // A task per (batch, kv head): its key blocks in chunks, each chunk
    // walking the group's query tiles once.
    cpu::parallel_for(s.B * s.Hkv, threads, [&](int64_t task, int64_t worker) {
      std::vector<float>& dq = group_dq[static_cast<std::size_t>(worker)];
      const int64_t hkv = task % s.Hkv, b = task / s.Hkv;
      std::fill(dq.begin(), dq.end(), 0.0f);
      for (int64_t k0 = 0; k0 < plan.k_blocks; k0 += kFusedKeyBlocks) {
        const int64_t n = std::min(kFusedKeyBlocks, plan.k_blocks - k0);
        Range blocks;  // the union of the chunk's bands
        for (int64_t i = 0; i < n; ++i) {
          open_key_block(slot(worker, i), b, hkv, k0 + i);
          const Range r = band(k0 + i);
          if (r.empty()) continue;
          blocks = blocks.empty()
                       ? r
                       : Range{std::min(blocks.first, r.first), std::max(blocks.last, r.last)};
        }
        for (int64_t g = 0; g < s.rep; ++g)
          for (int64_t qb = blocks.first; qb <= blocks.last; ++qb) {
            float* dq_rows = dq.data() + (g * plan.q_blocks + qb) * bq * dp;
            for (int64_t i = 0; i < n; ++i) {
              const Range r = band(k0 + i);
              if (qb >= r.first && qb <= r.last)
                add_tile(slot(worker, i), b, hkv, k0 + i, g, qb, dq_rows);
            }
          }
        for (int64_t i = 0; i < n; ++i) close_key_block(slot(worker, i), b, hkv, k0 + i);
      }
      for (int64_t g = 0; g < s.rep; ++g)
        for (int64_t qb = 0; qb < plan.q_blocks; ++qb) {
          const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
          slot(worker, 0).tiles.store(args.dq, b, hkv * s.rep + g, q0, nq, d,
                                      dq.data() + (g * plan.q_blocks + qb) * bq * dp, dp);
        }
    });
    return;
  }

  cpu::parallel_for(kv_tasks, threads, [&](int64_t task, int64_t worker) {
    const int64_t kb = task % plan.k_blocks;
    const int64_t hkv = (task / plan.k_blocks) % s.Hkv;
    const int64_t b = task / (plan.k_blocks * s.Hkv);
    Scratch<Tiles>& w = slot(worker, 0);
    open_key_block(w, b, hkv, kb);
    const Range blocks = band(kb);
    for (int64_t g = 0; g < s.rep; ++g)
      for (int64_t qb = blocks.first; qb <= blocks.last; ++qb)
        add_tile(w, b, hkv, kb, g, qb, nullptr);
    close_key_block(w, b, hkv, kb);
  });

  // dQ: one head's query block, its key blocks in ascending order.
  cpu::parallel_for(q_tasks, threads, [&](int64_t task, int64_t worker) {
    Scratch<Tiles>& w = slot(worker, 0);
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
      w.tiles.add_dq(plan, w.dP.data(), w.acc.data());
    }
    w.tiles.store(args.dq, b, h, q0, nq, d, w.acc.data(), dp);
  });
}

}  // namespace

void backward(const detail::BackwardArgs& args) {
  if (args.q.dtype == DType::bf16 && bf16_dot_enabled())
    run<Bf16Tiles>(args);
  else if (avx512_enabled())
    run<F32Avx512Tiles>(args);
  else
    run<F32Tiles>(args);
}

}  // namespace gqattn::cpu_flash
