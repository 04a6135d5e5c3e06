// The cpu backend against a literal transliteration of the seed's four Metal
// kernels (attention_fwd, attention_bwd_d, attention_bwd_dq,
// attention_bwd_dkv: one loop iteration per GPU thread, the seed's layouts
// and P [B,H,T,T]) on problems the seed can express (Tq == Tk, f32, packed).
// The mirror must match it bit for bit: that is what lets the unfused CUDA
// path be compared with the mirror tightly.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/cpu_test_util.hpp"

// The transliteration must not contract a*b+c into fma where the seed does not.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace gqattn::test {
namespace {

struct AttnParams {
  uint32_t B, T, H, HKV, HD;
  float scale;
  uint32_t causal;
  uint32_t window;
  float softcap;
};

struct SeedResult {
  std::vector<float> o, dq, dk, dv;
};

SeedResult run_seed(const AttnParams& p, const std::vector<float>& Q, const std::vector<float>& K,
                    const std::vector<float>& V, const std::vector<float>& dO) {
  using ulong = uint64_t;
  std::vector<float> O(Q.size()), P(ulong(p.B) * p.H * p.T * p.T), D(ulong(p.B) * p.H * p.T);
  std::vector<float> dQ(Q.size(), 0.0f), dK(K.size(), 0.0f), dV(V.size(), 0.0f);
  const uint32_t rows = p.B * p.H * p.T;

  for (uint32_t gid = 0; gid < rows; ++gid) {  // attention_fwd_f32
    const uint32_t i = gid % p.T;
    const uint32_t h = (gid / p.T) % p.H;
    const uint32_t b = gid / (p.T * p.H);
    const uint32_t rep = p.H / p.HKV;
    const uint32_t hkv = h / rep;
    const uint32_t Cq = p.H * p.HD;
    const uint32_t Ckv = p.HKV * p.HD;
    const float* qi = Q.data() + (ulong(b) * p.T + i) * Cq + h * p.HD;
    float* prow_base = P.data() + ((ulong(b) * p.H + h) * p.T + i) * p.T;
    const uint32_t jmax = p.causal ? i : p.T - 1;
    const uint32_t jmin = (p.window > 0 && i + 1 > p.window) ? i + 1 - p.window : 0;
    float m = -FLT_MAX;
    for (uint32_t j = jmin; j <= jmax; ++j) {
      const float* kj = K.data() + (ulong(b) * p.T + j) * Ckv + hkv * p.HD;
      float s = 0.0f;
      for (uint32_t d = 0; d < p.HD; ++d) s = std::fmaf(qi[d], kj[d], s);
      s *= p.scale;
      if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
      prow_base[j] = s;
      m = std::max(m, s);
    }
    float sum = 0.0f;
    for (uint32_t j = jmin; j <= jmax; ++j) {
      const float e = std::exp(prow_base[j] - m);
      prow_base[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
    for (uint32_t j = 0; j < jmin; ++j) prow_base[j] = 0.0f;
    for (uint32_t j = jmin; j <= jmax; ++j) prow_base[j] *= inv;
    for (uint32_t j = jmax + 1; j < p.T; ++j) prow_base[j] = 0.0f;
    float* oi = O.data() + (ulong(b) * p.T + i) * Cq + h * p.HD;
    for (uint32_t d = 0; d < p.HD; ++d) oi[d] = 0.0f;
    for (uint32_t j = jmin; j <= jmax; ++j) {
      const float prob = prow_base[j];
      if (prob == 0.0f) continue;
      const float* vj = V.data() + (ulong(b) * p.T + j) * Ckv + hkv * p.HD;
      for (uint32_t d = 0; d < p.HD; ++d) oi[d] = std::fmaf(prob, vj[d], oi[d]);
    }
  }

  for (uint32_t gid = 0; gid < rows; ++gid) {  // attention_bwd_d_f32
    const uint32_t i = gid % p.T;
    const uint32_t h = (gid / p.T) % p.H;
    const uint32_t b = gid / (p.T * p.H);
    const uint32_t Cq = p.H * p.HD;
    const float* oi = O.data() + (ulong(b) * p.T + i) * Cq + h * p.HD;
    const float* doi = dO.data() + (ulong(b) * p.T + i) * Cq + h * p.HD;
    float acc = 0.0f;
    for (uint32_t d = 0; d < p.HD; ++d) acc = std::fmaf(doi[d], oi[d], acc);
    D[(ulong(b) * p.H + h) * p.T + i] = acc;
  }

  for (uint32_t gid = 0; gid < rows; ++gid) {  // attention_bwd_dq_f32
    const uint32_t i = gid % p.T;
    const uint32_t h = (gid / p.T) % p.H;
    const uint32_t b = gid / (p.T * p.H);
    const uint32_t rep = p.H / p.HKV;
    const uint32_t hkv = h / rep;
    const uint32_t Cq = p.H * p.HD;
    const uint32_t Ckv = p.HKV * p.HD;
    const float* prow = P.data() + ((ulong(b) * p.H + h) * p.T + i) * p.T;
    const float* doi = dO.data() + (ulong(b) * p.T + i) * Cq + h * p.HD;
    float* dqi = dQ.data() + (ulong(b) * p.T + i) * Cq + h * p.HD;
    const float row_dot = D[(ulong(b) * p.H + h) * p.T + i];
    for (uint32_t j = 0; j < p.T; ++j) {
      const float prob = prow[j];
      if (prob == 0.0f) continue;
      const float* vj = V.data() + (ulong(b) * p.T + j) * Ckv + hkv * p.HD;
      const float* kj = K.data() + (ulong(b) * p.T + j) * Ckv + hkv * p.HD;
      float dp = 0.0f;
      for (uint32_t d = 0; d < p.HD; ++d) dp = std::fmaf(doi[d], vj[d], dp);
      float ds = prob * (dp - row_dot) * p.scale;
      if (p.softcap > 0.0f) {
        const float* qq = Q.data() + (ulong(b) * p.T + i) * Cq + h * p.HD;
        float s = 0.0f;
        for (uint32_t d = 0; d < p.HD; ++d) s = std::fmaf(qq[d], kj[d], s);
        const float t = std::tanh(s * p.scale / p.softcap);
        ds *= 1.0f - t * t;
      }
      for (uint32_t d = 0; d < p.HD; ++d) dqi[d] = std::fmaf(ds, kj[d], dqi[d]);
    }
  }

  for (uint32_t gid = 0; gid < p.B * p.HKV * p.T; ++gid) {  // attention_bwd_dkv_f32
    const uint32_t j = gid % p.T;
    const uint32_t hkv = (gid / p.T) % p.HKV;
    const uint32_t b = gid / (p.T * p.HKV);
    const uint32_t rep = p.H / p.HKV;
    const uint32_t Cq = p.H * p.HD;
    const uint32_t Ckv = p.HKV * p.HD;
    const float* vj = V.data() + (ulong(b) * p.T + j) * Ckv + hkv * p.HD;
    float* dkj = dK.data() + (ulong(b) * p.T + j) * Ckv + hkv * p.HD;
    float* dvj = dV.data() + (ulong(b) * p.T + j) * Ckv + hkv * p.HD;
    for (uint32_t r = 0; r < rep; ++r) {
      const uint32_t h = hkv * rep + r;
      for (uint32_t i = 0; i < p.T; ++i) {
        const float prob = P[((ulong(b) * p.H + h) * p.T + i) * p.T + j];
        if (prob == 0.0f) continue;
        const float* qi = Q.data() + (ulong(b) * p.T + i) * Cq + h * p.HD;
        const float* doi = dO.data() + (ulong(b) * p.T + i) * Cq + h * p.HD;
        const float row_dot = D[(ulong(b) * p.H + h) * p.T + i];
        float dp = 0.0f;
        for (uint32_t d = 0; d < p.HD; ++d) dp = std::fmaf(doi[d], vj[d], dp);
        float ds = prob * (dp - row_dot) * p.scale;
        if (p.softcap > 0.0f) {
          const float* kk = K.data() + (ulong(b) * p.T + j) * Ckv + hkv * p.HD;
          float s = 0.0f;
          for (uint32_t d = 0; d < p.HD; ++d) s = std::fmaf(qi[d], kk[d], s);
          const float t = std::tanh(s * p.scale / p.softcap);
          ds *= 1.0f - t * t;
        }
        for (uint32_t d = 0; d < p.HD; ++d) {
          dvj[d] = std::fmaf(prob, doi[d], dvj[d]);
          dkj[d] = std::fmaf(ds, qi[d], dkj[d]);
        }
      }
    }
  }
  return SeedResult{O, dQ, dK, dV};
}

void expect_matches_seed(const Problem& p, uint64_t seed) {
  const Inputs in = random_inputs(p, seed);
  const AttnParams params{
      static_cast<uint32_t>(p.B),   static_cast<uint32_t>(p.Tq),     static_cast<uint32_t>(p.H),
      static_cast<uint32_t>(p.Hkv), static_cast<uint32_t>(p.d),      p.effective_scale(),
      p.causal ? 1u : 0u,           static_cast<uint32_t>(p.window), p.softcap};
  const SeedResult want = run_seed(params, in.q, in.k, in.v, in.dout);
  const Outputs got = run_cpu(in);
  EXPECT_TRUE(same_bits(got.o, want.o)) << "o";
  EXPECT_TRUE(same_bits(got.dq, want.dq)) << "dq";
  EXPECT_TRUE(same_bits(got.dk, want.dk)) << "dk";
  EXPECT_TRUE(same_bits(got.dv, want.dv)) << "dv";
}

TEST(MirrorSeed, CausalGqa) { expect_matches_seed(make_problem(2, 37, 37, 4, 2, 32, true), 1); }

TEST(MirrorSeed, NonCausalMha) { expect_matches_seed(make_problem(1, 19, 19, 3, 3, 5), 2); }

TEST(MirrorSeed, WindowSoftcapMqa) {
  expect_matches_seed(make_problem(1, 23, 23, 4, 1, 16, true, /*window=*/5, /*softcap=*/4.0f), 3);
}

TEST(MirrorSeed, WindowOneSingleDim) {
  expect_matches_seed(make_problem(2, 9, 9, 2, 1, 1, true, /*window=*/1), 4);
}

TEST(MirrorSeed, NonCausalWindowSoftcap) {
  expect_matches_seed(make_problem(1, 17, 17, 2, 2, 80, false, /*window=*/4, /*softcap=*/30.0f), 5);
}

}  // namespace
}  // namespace gqattn::test
