// Varlen batches and query offsets on the cpu backend, through the public
// API, against the f64 oracle: packed sequences of random lengths including
// 0 and 1, Tq_b > Tk_b, windows, softcap, GQA, seqused_k and explicit
// q_start (negative, 0, past Tk); every output element written (NaN
// poison); batch invariance (a sequence alone and inside a batch give the
// same bits); the oracle's varlen batch against its dense problem; dense
// problems with q_start against the oracle.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_test_util.hpp"

namespace gqattn::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Batch {
  Problem problem;
  oracle::VarlenLayout layout;
  std::vector<float> q, k, v, dout;
  int64_t total_q() const { return layout.cu_seqlens_q.back(); }
  int64_t total_k() const { return layout.cu_seqlens_k.back(); }
};

struct VarlenOutputs {
  std::vector<float> o, lse, dq, dk, dv;
};

// A batch of the given (Tq_b, Tk_b) lengths; `used` (optional) the keys each
// sequence uses.
Batch make_batch(Problem base, const std::vector<std::pair<int, int>>& lengths, uint64_t seed,
                 const std::vector<int32_t>& used = {}) {
  Batch b;
  b.problem = base;
  b.problem.varlen = true;
  b.problem.B = int64_t(lengths.size());
  b.problem.Tq = b.problem.Tk = 1;
  b.layout.cu_seqlens_q = {0};
  b.layout.cu_seqlens_k = {0};
  for (const auto& [tq, tk] : lengths) {
    b.layout.cu_seqlens_q.push_back(b.layout.cu_seqlens_q.back() + tq);
    b.layout.cu_seqlens_k.push_back(b.layout.cu_seqlens_k.back() + tk);
    b.problem.Tq = std::max<int64_t>(b.problem.Tq, tq);
    b.problem.Tk = std::max<int64_t>(b.problem.Tk, tk);
  }
  b.layout.seqused_k = used;
  const int64_t d = base.d;
  b.q = random_input(b.total_q() * base.H * d, d, seed);
  b.k = random_input(b.total_k() * base.Hkv * d, d, seed + 1, false);
  b.v = random_input(b.total_k() * base.Hkv * d, d, seed + 2);
  b.dout = random_input(b.total_q() * base.H * d, d, seed + 3);
  return b;
}

TensorRef packed(std::vector<float>& x, int64_t rows, int64_t heads, int64_t d) {
  return contiguous(x.empty() ? nullptr : x.data(), DType::f32, Device::cpu, rows, heads, d);
}

OffsetsRef offsets(const std::vector<int32_t>& x) {
  OffsetsRef r;
  r.data = x.empty() ? nullptr : x.data();
  r.size = int64_t(x.size());
  return r;
}

VarlenOffsets offsets_of(const Batch& b) {
  return {offsets(b.layout.cu_seqlens_q), offsets(b.layout.cu_seqlens_k),
          offsets(b.layout.seqused_k)};
}

// Forward then backward on the cpu backend, outputs NaN-poisoned first.
VarlenOutputs run_cpu_varlen(Batch& b) {
  const Problem& p = b.problem;
  const int64_t tq = b.total_q(), tk = b.total_k();
  VarlenOutputs out;
  out.o.assign(tq * p.H * p.d, kNaN);
  out.lse.assign(p.H * tq, kNaN);
  out.dq.assign(tq * p.H * p.d, kNaN);
  out.dk.assign(tk * p.Hkv * p.d, kNaN);
  out.dv.assign(tk * p.Hkv * p.d, kNaN);
  Options options;
  options.backend = Backend::Cpu;
  TensorRef lse;  // [H, total_q]
  lse.data = out.lse.empty() ? nullptr : out.lse.data();
  lse.rank = 2;
  lse.shape[0] = p.H;
  lse.shape[1] = tq;
  lse.stride[0] = tq;
  lse.stride[1] = 1;
  forward(p, offsets_of(b), packed(b.q, tq, p.H, p.d), packed(b.k, tk, p.Hkv, p.d),
          packed(b.v, tk, p.Hkv, p.d), packed(out.o, tq, p.H, p.d), lse, options);
  backward(p, offsets_of(b), packed(b.q, tq, p.H, p.d), packed(b.k, tk, p.Hkv, p.d),
           packed(b.v, tk, p.Hkv, p.d), packed(out.o, tq, p.H, p.d), lse,
           packed(b.dout, tq, p.H, p.d), packed(out.dq, tq, p.H, p.d),
           packed(out.dk, tk, p.Hkv, p.d), packed(out.dv, tk, p.Hkv, p.d), options);
  return out;
}

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

void expect_matches_oracle(Batch& b) {
  const VarlenOutputs got = run_cpu_varlen(b);
  const auto f = oracle::forward_varlen(b.problem, b.layout, widen(b.q), widen(b.k), widen(b.v));
  const auto g = oracle::backward_varlen(b.problem, b.layout, widen(b.q), widen(b.k), widen(b.v),
                                         widen(b.dout));
  const double tol = 1e-5;  // f32, as the dense mirror against the oracle
  EXPECT_LT(max_rel_error(got.o, f.o), tol) << "o";
  EXPECT_LT(max_rel_error(got.lse, f.lse), tol) << "lse";
  EXPECT_LT(max_rel_error(got.dq, g.dq), tol) << "dq";
  EXPECT_LT(max_rel_error(got.dk, g.dk), tol) << "dk";
  EXPECT_LT(max_rel_error(got.dv, g.dv), tol) << "dv";
}

Problem base(int64_t H, int64_t Hkv, int64_t d, bool causal, int64_t window = 0,
             float softcap = 0.0f) {
  return make_problem(1, 1, 1, H, Hkv, d, causal, window, softcap);
}

const std::vector<std::pair<int, int>> kMixed = {{5, 5}, {0, 3}, {1, 1},  {9, 4},
                                                 {3, 0}, {0, 0}, {17, 23}};

TEST(CpuVarlen, CausalGqaMatchesOracle) {
  Batch b = make_batch(base(4, 2, 16, true), kMixed, 11);
  expect_matches_oracle(b);
}

TEST(CpuVarlen, NonCausalWindowSoftcapMatchesOracle) {
  Batch b = make_batch(base(2, 1, 8, false, 3, 5.0f), kMixed, 12);
  expect_matches_oracle(b);
}

TEST(CpuVarlen, CausalWindowMqaMatchesOracle) {
  Batch b = make_batch(base(3, 1, 8, true, 2), kMixed, 13);
  expect_matches_oracle(b);
}

TEST(CpuVarlen, SequsedKMatchesOracleAndZeroesUnusedKeys) {
  Batch b = make_batch(base(2, 2, 8, true), kMixed, 14, {3, 0, 1, 2, 0, 0, 11});
  expect_matches_oracle(b);
  const VarlenOutputs got = run_cpu_varlen(b);
  // Keys 3, 4 of the first sequence are unused: zero gradients.
  for (int64_t x = 3 * 2 * 8; x < 5 * 2 * 8; ++x) {
    EXPECT_EQ(got.dk[x], 0.0f);
    EXPECT_EQ(got.dv[x], 0.0f);
  }
}

TEST(CpuVarlen, QueryOffsetMatchesOracle) {
  for (int64_t q_start : {-6, -1, 0, 2, 30}) {
    SCOPED_TRACE("q_start " + std::to_string(q_start));
    for (bool causal : {false, true}) {
      Problem p = base(2, 1, 8, causal, causal ? 0 : 4);
      p.q_start = q_start;
      Batch b = make_batch(p, kMixed, 15 + uint64_t(q_start + 10));
      expect_matches_oracle(b);
    }
  }
}

TEST(CpuVarlen, EmptyRowsWriteZerosAndMinusInfinity) {
  Batch b = make_batch(base(2, 1, 8, true), {{3, 0}, {0, 2}, {4, 2}}, 16);
  const VarlenOutputs got = run_cpu_varlen(b);
  const int64_t tq = b.total_q();
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(got.lse[h * tq + i], -INFINITY);
    // Causal 4 queries over 2 keys: queries 0 and 1 of the last sequence keep none.
    EXPECT_EQ(got.lse[h * tq + 3], -INFINITY);
    EXPECT_EQ(got.lse[h * tq + 4], -INFINITY);
    EXPECT_TRUE(std::isfinite(got.lse[h * tq + 5]));
  }
  for (int64_t x = 0; x < 3 * 2 * 8; ++x) {
    EXPECT_EQ(got.o[x], 0.0f);
    EXPECT_EQ(got.dq[x], 0.0f);
  }
  for (int64_t x = 0; x < 2 * 8; ++x) {  // keys of the sequence with no queries
    EXPECT_EQ(got.dk[x], 0.0f);
    EXPECT_EQ(got.dv[x], 0.0f);
  }
}

// The sequence's slice of packed rows `row0 .. row0 + rows` of `width` values.
std::vector<float> rows(const std::vector<float>& x, int64_t row0, int64_t n, int64_t width) {
  return {x.begin() + row0 * width, x.begin() + (row0 + n) * width};
}

TEST(CpuVarlen, ASequenceGivesTheSameBitsAloneAndInABatch) {
  const Problem p = base(4, 2, 16, true, 0, 30.0f);
  Batch batch = make_batch(p, kMixed, 17);
  const VarlenOutputs all = run_cpu_varlen(batch);
  const int64_t s = 6;  // the {17, 23} sequence, last in the batch
  const int64_t q0 = batch.layout.cu_seqlens_q[s], k0 = batch.layout.cu_seqlens_k[s];
  Batch alone = make_batch(p, {{17, 23}}, 99);
  const int64_t qw = p.H * p.d, kw = p.Hkv * p.d;
  alone.q = rows(batch.q, q0, 17, qw);
  alone.k = rows(batch.k, k0, 23, kw);
  alone.v = rows(batch.v, k0, 23, kw);
  alone.dout = rows(batch.dout, q0, 17, qw);
  const VarlenOutputs one = run_cpu_varlen(alone);
  EXPECT_TRUE(same_bits(one.o, rows(all.o, q0, 17, qw)));
  EXPECT_TRUE(same_bits(one.dq, rows(all.dq, q0, 17, qw)));
  EXPECT_TRUE(same_bits(one.dk, rows(all.dk, k0, 23, kw)));
  EXPECT_TRUE(same_bits(one.dv, rows(all.dv, k0, 23, kw)));
  for (int64_t h = 0; h < p.H; ++h)
    for (int64_t i = 0; i < 17; ++i)
      EXPECT_EQ(one.lse[h * 17 + i], all.lse[h * batch.total_q() + q0 + i]);
}

TEST(OracleVarlen, ABatchOfOneIsTheDenseProblem) {
  Problem p = base(2, 1, 8, true, 3, 5.0f);
  p.q_start = 4;
  Batch b = make_batch(p, {{7, 5}}, 18);
  Problem dense = p;
  dense.varlen = false;
  dense.B = 1;
  dense.Tq = 7;
  dense.Tk = 5;
  const auto v = oracle::forward_varlen(b.problem, b.layout, widen(b.q), widen(b.k), widen(b.v));
  const auto d = oracle::forward(dense, widen(b.q), widen(b.k), widen(b.v));
  EXPECT_EQ(v.o, d.o);
  EXPECT_EQ(v.lse, d.lse);
}

// Dense problems with an explicit q_start: the mirror against the oracle.
TEST(CpuQueryOffset, DenseMatchesOracle) {
  for (int64_t q_start : {-40, -3, 0, 5, 19, 60}) {
    for (bool causal : {false, true})
      for (int64_t window : {0, 1, 7}) {
        SCOPED_TRACE("q_start " + std::to_string(q_start) + " causal " + std::to_string(causal) +
                     " window " + std::to_string(window));
        Problem p = make_problem(2, 13, 20, 4, 2, 16, causal, window);
        p.q_start = q_start;
        const Inputs in = random_inputs(p, 500 + uint64_t(q_start + 50));
        const Outputs got = run_cpu(in);
        const Reference ref = run_oracle(in);
        EXPECT_LT(max_rel_error(got.o, ref.o), 1e-5) << "o";
        EXPECT_LT(max_rel_error(got.lse, ref.lse), 1e-5) << "lse";
        EXPECT_LT(max_rel_error(got.dq, ref.dq), 1e-5) << "dq";
        EXPECT_LT(max_rel_error(got.dk, ref.dk), 1e-5) << "dk";
        EXPECT_LT(max_rel_error(got.dv, ref.dv), 1e-5) << "dv";
      }
  }
}

// q_start = 0 is top-left alignment: with Tq < Tk and causal, query i keeps
// keys 0..i (bottom-right would keep 0..i + Tk - Tq).
TEST(CpuQueryOffset, ZeroIsTopLeft) {
  Problem p = make_problem(1, 3, 8, 1, 1, 4, true);
  p.q_start = 0;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(oracle::kept(p, i, j), j <= i);
}

}  // namespace
}  // namespace gqattn::test
