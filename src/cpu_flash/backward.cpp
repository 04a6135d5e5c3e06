// cpu-flash's backward, with D = rowsum(dO * O) and dS = P * (dO V^T - D) *
// scale (times 1 - tanh^2 under a softcap), each task writing what no other
// task writes (no atomics, no shared accumulators). Two schedules, chosen by
// use_fused_pass:
//   fused (fused_group): a task per (batch, kv head) holds every key block
//     of its group; for each query block and up to four of the group's heads
//     at a time, it scores each head's query tile against its whole band
//     once, takes the rows' max m and sum l from those cached scores, then
//     per key block (ascending) forms P = exp(s - m) / l and dS and adds dV
//     += P^T dO, dK += dS^T Q, dQ += dS K: five tile products per tile;
//   unfused, in three parallel phases (O(block) scratch a worker, and work
//     for every worker when the groups are fewer than the workers):
//     stats: a task per (batch, head, query block): m, l and D;
//     dK/dV: a task per (batch, kv head, key block): its band's query blocks
//            and each one's heads, recomputing S and P per tile;
//     dQ:    a task per (batch, head, query block): its key blocks.
// Every sum runs in the same order in both (key blocks ascending for a dQ
// row; query blocks, then heads, ascending for a dK / dV row; tile sizes
// fixed), so the bits are the same for any thread count. Rows without kept
// keys have P = 0 and so zero gradients. bf16 problems on a CPU with
// AVX512-BF16 run the tile products on bf16 operands (Bf16Tiles: S and dP
// from the inputs as they are, P and dS rounded to bf16 for dV, dK and dQ,
// f32 accumulation), the rest converts to f32 (F32Avx512Tiles on an
// AVX-512 CPU, else the portable F32Tiles). Checked by
// tests/cpu/test_cpu_flash.cpp and tests/cpu/test_cpu_flash_avx512.cpp.
//
// Why m and l, not exp(s - lse): the f32 lse carries a rounding of 2^-24
// |lse| into every P, which doubled the f32 error of dq and dv against the
// oracle (measured 8e-7 where the mirror errs 3.7e-7, over
// check::tolerance). The fused pass gets m and l from scores it computes
// anyway; the unfused stats phase pays one Q K^T pass for them.
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
// dtype), the portable loops of tile_kernels.hpp (any CPU). Query side
// [bq][dp]; a key block's operands (Keys) K [Bk][dp] and K^T, V^T [dp][Bk];
// V [Bk][dp] the staging of V^T; `trans` a score tile transposed [Bk][bq].
struct F32Tiles {
  struct Keys {
    std::vector<float> K, Kt, Vt;  // K: staging where it is not read in place
    TileView k;                    // where K is read
    // Every buffer allocated here, before any output is written.
    explicit Keys(const Plan& p)
        : K(cpu::scratch_floats(kBlockK * p.dp)),
          Kt(cpu::scratch_floats(kBlockK * p.dp)),
          Vt(cpu::scratch_floats(kBlockK * p.dp)) {}
  };
  std::vector<float> Q, dO, O, V, trans;
  F32Tiles(const Plan& p)
      : Q(cpu::scratch_floats(p.block_q * p.dp)),
        dO(cpu::scratch_floats(p.block_q * p.dp)),
        O(cpu::scratch_floats(p.block_q * p.dp)),
        V(cpu::scratch_floats(kBlockK * p.dp)),
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
              int64_t j0, int64_t nk, Keys& keys) {
    load_tile(a.k, b, hkv, j0, kBlockK, nk, s.d, keys.K.data(), p.dp);
    keys.k = TileView{keys.K.data(), p.dp};
    transpose(kBlockK, p.dp, keys.K.data(), p.dp, keys.Kt.data(), kBlockK);
  }
  void load_v(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
              int64_t j0, int64_t nk, Keys& keys) {
    load_tile(a.v, b, hkv, j0, kBlockK, nk, s.d, V.data(), p.dp);
    transpose(kBlockK, p.dp, V.data(), p.dp, keys.Vt.data(), kBlockK);
  }
  // S = Q K^T.
  void scores(const Shape& s, const Plan& p, const Keys& keys, float* S) {
    gemm_nn(p.block_q, kBlockK, s.d, Q.data(), p.dp, keys.Kt.data(), kBlockK, S, kBlockK, false);
  }
  // dP = dO V^T.
  void score_grads(const Shape& s, const Plan& p, const Keys& keys, float* dP) {
    gemm_nn(p.block_q, kBlockK, s.d, dO.data(), p.dp, keys.Vt.data(), kBlockK, dP, kBlockK, false);
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
  void add_dq(const Plan& p, const Keys& keys, const float* dS, float* dq) {
    gemm_nn(p.block_q, p.dp, kBlockK, dS, kBlockK, keys.k.data, keys.k.ld, dq, p.dp, true);
  }
  // The statistics' online-softmax step (tile_stats) on the scores S of
  // rows q0 .. q0 + nq - 1 and keys j0 .. j0 + nk - 1: m and l updated, S
  // overwritten.
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
  TileView q, dout;  // where the loaded Q and dO are read
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
              int64_t j0, int64_t nk, Keys& keys) {
    keys.k = f32_tile(a.k, b, hkv, j0, kBlockK, nk, s.d, p.dp, keys.K.data());
    transpose_f32(kBlockK, p.dp, keys.k.data, keys.k.ld, keys.Kt.data(), kBlockK);
  }
  void load_v(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
              int64_t j0, int64_t nk, Keys& keys) {
    const TileView v = f32_tile(a.v, b, hkv, j0, kBlockK, nk, s.d, p.dp, V.data());
    transpose_f32(kBlockK, p.dp, v.data, v.ld, keys.Vt.data(), kBlockK);
  }
  void scores(const Shape& s, const Plan& p, const Keys& keys, float* S) {
    gemm_f32(p.block_q, kBlockK, s.d, q.data, q.ld, 1, keys.Kt.data(), kBlockK, S, kBlockK, false);
  }
  void score_grads(const Shape& s, const Plan& p, const Keys& keys, float* dP) {
    gemm_f32(p.block_q, kBlockK, s.d, dout.data, dout.ld, 1, keys.Vt.data(), kBlockK, dP, kBlockK,
             false);
  }
  void add_grads(const Plan& p, const float* P, const float* dS, float* dK, float* dV) {
    const int64_t bq = p.block_q, dp = p.dp;
    gemm_f32(kBlockK, dp, bq, P, 1, kBlockK, dout.data, dout.ld, dV, dp, true);
    gemm_f32(kBlockK, dp, bq, dS, 1, kBlockK, q.data, q.ld, dK, dp, true);
  }
  void add_dq(const Plan& p, const Keys& keys, const float* dS, float* dq) {
    gemm_f32(p.block_q, p.dp, kBlockK, dS, kBlockK, 1, keys.k.data, keys.k.ld, dq, p.dp, true);
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
  // A key block's operands: K^T and V^T pair-major [dp / 2][Bk], K in pairs
  // of rows [Bk / 2][dp] (the B operand of dS K).
  struct Keys {
    std::vector<uint32_t> Kt, Vt, Kp;
    explicit Keys(const Plan& p)
        : Kt(std::size_t(p.dp / 2 * kBlockK)),
          Vt(std::size_t(p.dp / 2 * kBlockK)),
          Kp(std::size_t(kBlockK / 2 * p.dp)) {}
  };
  std::vector<uint16_t> Q, dO, O, K, V, Pt, dSt, dS;  // K, V: staging of Keys
  std::vector<uint32_t> Qp, dOp;
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
              int64_t j0, int64_t nk, Keys& keys) {
    load_tile_bf16(a.k, b, hkv, j0, kBlockK, nk, s.d, K.data(), p.dp);
    transpose_pairs(kBlockK, p.dp, K.data(), p.dp, keys.Kt.data(), kBlockK);
    pair_rows(kBlockK, p.dp, K.data(), p.dp, keys.Kp.data(), p.dp);
  }
  void load_v(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
              int64_t j0, int64_t nk, Keys& keys) {
    load_tile_bf16(a.v, b, hkv, j0, kBlockK, nk, s.d, V.data(), p.dp);
    transpose_pairs(kBlockK, p.dp, V.data(), p.dp, keys.Vt.data(), kBlockK);
  }
  void scores(const Shape& s, const Plan& p, const Keys& keys, float* S) {
    gemm_bf16(p.block_q, kBlockK, round_up(s.d, 2), Q.data(), p.dp, keys.Kt.data(), kBlockK, S,
              kBlockK, false);
  }
  void score_grads(const Shape& s, const Plan& p, const Keys& keys, float* dP) {
    gemm_bf16(p.block_q, kBlockK, round_up(s.d, 2), dO.data(), p.dp, keys.Vt.data(), kBlockK, dP,
              kBlockK, false);
  }
  void add_grads(const Plan& p, const float* P, const float* dSf, float* dK, float* dV) {
    const int64_t bq = p.block_q, dp = p.dp;
    operands_to_bf16_transposed(bq, kBlockK, P, kBlockK, Pt.data(), bq);
    gemm_bf16(kBlockK, dp, bq, Pt.data(), bq, dOp.data(), dp, dV, dp, true);
    operands_to_bf16_transposed(bq, kBlockK, dSf, kBlockK, dSt.data(), bq);
    gemm_bf16(kBlockK, dp, bq, dSt.data(), bq, Qp.data(), dp, dK, dp, true);
  }
  void add_dq(const Plan& p, const Keys& keys, const float* dSf, float* dq) {
    operands_to_bf16(p.block_q, kBlockK, dSf, kBlockK, dS.data(), kBlockK);
    gemm_bf16(p.block_q, p.dp, kBlockK, dS.data(), kBlockK, keys.Kp.data(), p.dp, dq, p.dp, true);
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

// A key block's operands and its dK and dV sums [Bk][dp].
template <class Tiles>
struct KeyBlock {
  typename Tiles::Keys keys;
  std::vector<float> dK, dV;
  explicit KeyBlock(const Plan& p)
      : keys(p), dK(cpu::scratch_floats(kBlockK * p.dp)), dV(cpu::scratch_floats(kBlockK * p.dp)) {}
};

// One thread's query side: the path's operands, the f32 score side
// [bq][Bk], a dQ tile [bq][dp] and the loaded rows' statistics (l: the
// running sums while they are gathered).
template <class Tiles>
struct Scratch {
  Tiles tiles;
  std::vector<float> S, T, dP, acc, D, m, l, inv_l;
  explicit Scratch(const Plan& p)
      : tiles(p),
        S(cpu::scratch_floats(p.block_q * kBlockK)),
        T(cpu::scratch_floats(p.block_q * kBlockK)),
        dP(cpu::scratch_floats(p.block_q * kBlockK)),
        acc(cpu::scratch_floats(p.block_q * p.dp)),
        D(cpu::scratch_floats(p.block_q)),
        m(cpu::scratch_floats(p.block_q)),
        l(cpu::scratch_floats(p.block_q)),
        inv_l(cpu::scratch_floats(p.block_q)) {}
};

// The fused pass's memory on one worker (GroupScratch, below): K^T, V^T, dK,
// dV and K's staging of every key block, and each held head's scores over
// every key block.
constexpr int64_t kFusedHeads = 4;
int64_t fused_bytes(const Shape& s, const Plan& p) {
  const int64_t keys = p.k_blocks * kBlockK;
  return int64_t(sizeof(float)) * keys * (5 * p.dp + std::min(s.rep, kFusedHeads) * p.block_q);
}

// Whether the backward runs as the fused pass (a task per (batch, kv
// head)): when those tasks are at least as many as the workers, so none is
// idle, and their O(Tk) scratch stays under 256 MiB a worker (about 75k
// keys at d = 128); else as the unfused passes, O(block) scratch a worker.
bool use_fused_pass(const Shape& s, const Plan& p, int threads) {
  constexpr int64_t kFusedBytesPerWorker = int64_t(256) << 20;
  const int64_t pairs = s.B * s.Hkv;
  return fused_bytes(s, p) <= kFusedBytesPerWorker &&
         pairs >= cpu::worker_count(std::max(pairs * p.k_blocks, s.B * s.H * p.q_blocks), threads);
}

// Row statistics of the first phase of the unfused backward: max m, 1 / sum
// l and D = rowsum(dO * O) per (b, h, i).
struct RowStats {
  std::vector<float> m, inv_l, D;
  int64_t at(const Shape& s, int64_t b, int64_t h, int64_t i) const {
    return (b * s.H + h) * s.Tq + i;
  }
};

// The statistics of the loaded query tile (Q and dO of rows q0 .. q0 + nq -
// 1 of head h) into w: m and 1 / l over key blocks `blocks` in ascending
// order (the forward's online softmax without O; scores_of(kb) gives block
// kb's score tile, which the step overwrites), and D. Padding rows get m =
// 1 / l = D = 0.
template <class Tiles, class ScoresOf>
void tile_stats(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t h,
                int64_t q0, int64_t nq, Range blocks, Scratch<Tiles>& w,
                const ScoresOf& scores_of) {
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(w.l.begin(), w.l.end(), 0.0f);
  for (int64_t kb = blocks.first; kb <= blocks.last; ++kb) {
    const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
    w.tiles.stats_step(s, q0, nq, j0, nk, scores_of(kb), w.m.data(), w.l.data());
  }
  w.tiles.row_d(a, s, p, b, h, q0, nq, w.D.data());
  for (int64_t r = 0; r < p.block_q; ++r) {
    const bool in = r < nq;
    w.inv_l[r] = in && w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;
    if (!in) w.m[r] = w.D[r] = 0.0f;
  }
}

// The query side of the unfused passes: Q, dO and the row stats (m, 1 / l,
// D) of rows q0 .. q0 + nq - 1 of head h.
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

// The key side: K and V of keys j0 .. j0 + nk - 1 into `key`, its dK and dV
// sums zeroed.
template <class Tiles>
void open_key_block(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
                    int64_t kb, Tiles& tiles, KeyBlock<Tiles>& key) {
  const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
  tiles.load_k(a, s, p, b, hkv, j0, nk, key.keys);
  tiles.load_v(a, s, p, b, hkv, j0, nk, key.keys);
  std::fill(key.dK.begin(), key.dK.end(), 0.0f);
  std::fill(key.dV.begin(), key.dV.end(), 0.0f);
}

template <class Tiles>
void close_key_block(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
                     int64_t kb, Tiles& tiles, KeyBlock<Tiles>& key) {
  const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
  tiles.store(a.dk, b, hkv, j0, nk, s.d, key.dK.data(), p.dp);
  tiles.store(a.dv, b, hkv, j0, nk, s.d, key.dV.data(), p.dp);
}

// P and dS of the loaded query side against key block kb: from the scores S
// (overwritten by P) and dO V^T (into w.dP, then dS).
template <class Tiles>
void probabilities_and_ds(const Shape& s, const Plan& p, int64_t q0, int64_t kb, float* S,
                          const typename Tiles::Keys& keys, Scratch<Tiles>& w) {
  const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
  w.tiles.score_grads(s, p, keys, w.dP.data());
  w.tiles.probabilities_and_ds(s, p, q0, j0, nk, S, w.dP.data(), w.T.data(), w.m.data(),
                               w.inv_l.data(), w.D.data());
}

// One tile against key block kb: P and dS, then dV += P^T dO and dK += dS^T
// Q into the block's sums, and dQ += dS K into dq when not null.
template <class Tiles>
void add_tile(const Shape& s, const Plan& p, int64_t q0, int64_t kb, float* S, KeyBlock<Tiles>& key,
              Scratch<Tiles>& w, float* dq) {
  probabilities_and_ds(s, p, q0, kb, S, key.keys, w);
  w.tiles.add_grads(p, S, w.dP.data(), key.dK.data(), key.dV.data());
  if (dq != nullptr) w.tiles.add_dq(p, key.keys, w.dP.data(), dq);
}

// The fused backward's working set on one worker: a group's key blocks and,
// for up to kFusedHeads heads at once, a query tile and its scores over every
// key block.
template <class Tiles>
struct GroupScratch {
  std::vector<KeyBlock<Tiles>> keys;
  std::vector<Scratch<Tiles>> heads;
  std::vector<std::vector<float>> scores;  // per head: k_blocks tiles [bq][Bk]
  GroupScratch(const Shape& s, const Plan& p) {
    const int64_t n = std::min(s.rep, kFusedHeads);
    keys.reserve(std::size_t(p.k_blocks));
    for (int64_t kb = 0; kb < p.k_blocks; ++kb) keys.emplace_back(p);
    heads.reserve(std::size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      heads.emplace_back(p);
      scores.push_back(cpu::scratch_floats(p.k_blocks * p.block_q * kBlockK));
    }
  }
};

// The fused backward, a task per (batch, kv head): every key block of the
// group loaded once; then, query block by query block and up to
// kFusedHeads heads of the group at a time, each head's query tile scored
// against its whole band once. The cached scores give the rows' statistics
// and then, key block by key block in ascending order, P, dS and the three
// gradient products: five tile products per tile, where the unfused passes
// compute Q K^T three times and dO V^T twice. The heads share each visit to
// a key block, so its operands and sums are read from memory once for them
// (docs/decisions/cpu-flash-backward-fused-dq.md).
template <class Tiles>
void fused_group(const BackwardArgs& a, const Shape& s, const Plan& p, int64_t b, int64_t hkv,
                 GroupScratch<Tiles>& group) {
  std::vector<KeyBlock<Tiles>>& keys = group.keys;
  for (int64_t kb = 0; kb < p.k_blocks; ++kb)
    open_key_block(a, s, p, b, hkv, kb, group.heads[0].tiles, keys[std::size_t(kb)]);
  const int64_t tile = p.block_q * kBlockK, at_once = int64_t(group.heads.size());
  for (int64_t qb = 0; qb < p.q_blocks; ++qb) {
    const int64_t q0 = qb * p.block_q, nq = std::min(p.block_q, s.Tq - q0);
    const Range blocks = key_blocks(s, q0, q0 + nq - 1);
    for (int64_t g0 = 0; g0 < s.rep; g0 += at_once) {
      const int64_t n = std::min(at_once, s.rep - g0);
      const auto cached = [&](int64_t i, int64_t kb) {
        return group.scores[std::size_t(i)].data() + (kb - blocks.first) * tile;
      };
      for (int64_t i = 0; i < n; ++i) {
        Scratch<Tiles>& w = group.heads[std::size_t(i)];
        const int64_t h = hkv * s.rep + g0 + i;
        w.tiles.load_q(a, s, p, b, h, q0, nq);
        w.tiles.load_do(a, s, p, b, h, q0, nq);
        tile_stats(a, s, p, b, h, q0, nq, blocks, w, [&](int64_t kb) {
          w.tiles.scores(s, p, keys[std::size_t(kb)].keys, cached(i, kb));
          std::copy(cached(i, kb), cached(i, kb) + tile, w.T.data());
          return w.T.data();
        });
        std::fill(w.acc.begin(), w.acc.end(), 0.0f);
      }
      for (int64_t kb = blocks.first; kb <= blocks.last; ++kb)
        for (int64_t i = 0; i < n; ++i) {
          Scratch<Tiles>& w = group.heads[std::size_t(i)];
          add_tile(s, p, q0, kb, cached(i, kb), keys[std::size_t(kb)], w, w.acc.data());
        }
      for (int64_t i = 0; i < n; ++i) {
        Scratch<Tiles>& w = group.heads[std::size_t(i)];
        w.tiles.store(a.dq, b, hkv * s.rep + g0 + i, q0, nq, s.d, w.acc.data(), p.dp);
      }
    }
  }
  for (int64_t kb = 0; kb < p.k_blocks; ++kb)
    close_key_block(a, s, p, b, hkv, kb, group.heads[0].tiles, keys[std::size_t(kb)]);
}

template <class Tiles>
void run(const BackwardArgs& args) {
  const Shape s = detail::resolve(args.problem);
  const Plan plan = make_plan(s);
  const int64_t bq = plan.block_q;
  const int64_t kv_tasks = s.B * s.Hkv * plan.k_blocks;
  const int64_t q_tasks = s.B * s.H * plan.q_blocks;
  const int threads = args.options.num_threads;

  if (use_fused_pass(s, plan, threads)) {
    const int64_t workers = cpu::worker_count(s.B * s.Hkv, threads);
    std::vector<GroupScratch<Tiles>> groups;
    groups.reserve(static_cast<std::size_t>(workers));
    for (int64_t i = 0; i < workers; ++i) groups.emplace_back(s, plan);
    cpu::parallel_for(s.B * s.Hkv, threads, [&](int64_t task, int64_t worker) {
      fused_group(args, s, plan, task / s.Hkv, task % s.Hkv,
                  groups[static_cast<std::size_t>(worker)]);
    });
    return;
  }

  const int64_t workers = cpu::worker_count(std::max(kv_tasks, q_tasks), threads);
  std::vector<Scratch<Tiles>> scratch;
  std::vector<KeyBlock<Tiles>> keys;  // one key block a worker
  scratch.reserve(static_cast<std::size_t>(workers));
  keys.reserve(static_cast<std::size_t>(workers));
  for (int64_t i = 0; i < workers; ++i) {
    scratch.emplace_back(plan);
    keys.emplace_back(plan);
  }

  // Unfused: statistics, then dK / dV by key block, then dQ by query block.
  const int64_t rows = s.B * s.H * s.Tq;
  RowStats stats{cpu::scratch_floats(rows), cpu::scratch_floats(rows), cpu::scratch_floats(rows)};
  cpu::parallel_for(q_tasks, threads, [&](int64_t task, int64_t worker) {
    Scratch<Tiles>& w = scratch[static_cast<std::size_t>(worker)];
    KeyBlock<Tiles>& key = keys[static_cast<std::size_t>(worker)];
    const int64_t qb = plan.q_blocks - 1 - task % plan.q_blocks;
    const int64_t h = (task / plan.q_blocks) % s.H;
    const int64_t b = task / (plan.q_blocks * s.H);
    const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
    w.tiles.load_q(args, s, plan, b, h, q0, nq);
    w.tiles.load_do(args, s, plan, b, h, q0, nq);
    tile_stats(args, s, plan, b, h, q0, nq, key_blocks(s, q0, q0 + nq - 1), w, [&](int64_t kb) {
      const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
      w.tiles.load_k(args, s, plan, b, h / s.rep, j0, nk, key.keys);
      w.tiles.scores(s, plan, key.keys, w.S.data());
      return w.S.data();
    });
    for (int64_t r = 0; r < nq; ++r) {
      stats.m[stats.at(s, b, h, q0 + r)] = w.m[r];
      stats.inv_l[stats.at(s, b, h, q0 + r)] = w.inv_l[r];
      stats.D[stats.at(s, b, h, q0 + r)] = w.D[r];
    }
  });

  // dK / dV: one key block, the query blocks in its band and each one's
  // heads of the group in ascending order (the fused pass's order).
  cpu::parallel_for(kv_tasks, threads, [&](int64_t task, int64_t worker) {
    Scratch<Tiles>& w = scratch[static_cast<std::size_t>(worker)];
    KeyBlock<Tiles>& key = keys[static_cast<std::size_t>(worker)];
    const int64_t kb = task % plan.k_blocks;
    const int64_t hkv = (task / plan.k_blocks) % s.Hkv;
    const int64_t b = task / (plan.k_blocks * s.Hkv);
    open_key_block(args, s, plan, b, hkv, kb, w.tiles, key);
    const int64_t j0 = kb * kBlockK;
    const Range blocks = query_blocks(s, plan, j0, std::min(j0 + kBlockK, s.Tk) - 1);
    for (int64_t qb = blocks.first; qb <= blocks.last; ++qb)
      for (int64_t g = 0; g < s.rep; ++g) {
        const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
        load_query_side(args, s, plan, stats, b, hkv * s.rep + g, q0, nq, w);
        w.tiles.scores(s, plan, key.keys, w.S.data());
        add_tile(s, plan, q0, kb, w.S.data(), key, w, nullptr);
      }
    close_key_block(args, s, plan, b, hkv, kb, w.tiles, key);
  });

  // dQ: one head's query block, its key blocks in ascending order.
  cpu::parallel_for(q_tasks, threads, [&](int64_t task, int64_t worker) {
    Scratch<Tiles>& w = scratch[static_cast<std::size_t>(worker)];
    typename Tiles::Keys& k = keys[static_cast<std::size_t>(worker)].keys;
    const int64_t qb = plan.q_blocks - 1 - task % plan.q_blocks;
    const int64_t h = (task / plan.q_blocks) % s.H;
    const int64_t b = task / (plan.q_blocks * s.H);
    const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);
    load_query_side(args, s, plan, stats, b, h, q0, nq, w);
    std::fill(w.acc.begin(), w.acc.end(), 0.0f);
    const Range blocks = key_blocks(s, q0, q0 + nq - 1);
    for (int64_t kb = blocks.first; kb <= blocks.last; ++kb) {
      const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
      w.tiles.load_k(args, s, plan, b, h / s.rep, j0, nk, k);
      w.tiles.load_v(args, s, plan, b, h / s.rep, j0, nk, k);
      w.tiles.scores(s, plan, k, w.S.data());
      probabilities_and_ds(s, plan, q0, kb, w.S.data(), k, w);
      w.tiles.add_dq(plan, k, w.dP.data(), w.acc.data());
    }
    w.tiles.store(args.dq, b, h, q0, nq, s.d, w.acc.data(), plan.dp);
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
