// cpu-flash's AVX-512 kernels (src/cpu_flash/avx512_kernels.hpp) and its
// bf16 tile path (vdpbf16ps tile products, P and dS rounded to bf16, f32
// accumulation), where the CPU has AVX512-BF16, against the portable path
// every CPU takes (forced here by set_avx512_kernels(false)):
//   - the kernels: f32 and bf16 products exact on small integers (A read
//     row-major and transposed in place), row_dots_f32 and row_dots_bf16
//     equal bit for bit to their GEMM's element, the f32 transpose and
//     every bf16 packing layout element by element, bf16 rounding to
//     nearest even as the library's float_to_bf16;
//   - the backend on both paths against the f64 oracle within
//     check::tolerance of the mirror's error (docs/semantics.md: bf16 I/O
//     allows two roundings of 2^-8 on o, dq, dk, dv, one for P or dS fed in
//     bf16), on shapes that are no multiple of the 64-row tiles, causal,
//     windows, softcap, GQA and MQA, d 3, 64, 80, 128, q_start, packed and
//     strided;
//   - a window of one key: dq = dk = 0 exactly (D cancels dP bit for bit);
//   - the same bits across runs, thread counts, and the fused and separate
//     dQ passes.
// The kernel tests and the fast path's checks skip on CPUs without the
// instructions; the fallback's run everywhere.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_flash_paths.hpp"
#include "cpu/cpu_test_util.hpp"
#include "cpu_flash/avx512_kernels.hpp"
#include "gqattn/check.hpp"

namespace gqattn::test {
namespace {

using cpu_flash::avx512_supported;
using cpu_flash::bf16_dot_supported;

// The bf16 path on (where supported) or the portable path.
using Bf16Dot = Avx512Kernels;

uint16_t bits_of(float x) { return float_to_bf16(x); }
float value_of(uint16_t b) { return bf16_to_float(b); }

// ---- f32 kernels -----------------------------------------------------------

TEST(CpuFlashAvx512Kernels, GemmF32IsExactOnSmallIntegers) {
  if (!avx512_supported()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(4);
  std::uniform_int_distribution<int> small(-8, 8);
  for (int64_t M : {4, 8, 12, 40, 64})
    for (int64_t N : {16, 32, 48, 64, 80, 144})
      for (int64_t K : {1, 3, 16, 80, 128})
        for (bool transposed : {false, true})
          for (bool accumulate : {false, true}) {
            SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " trans "
                                            << transposed << " acc " << accumulate);
            // A(r, k) at A[r * a_row + k * a_col], with padding either way.
            const int64_t a_row = transposed ? 1 : K + 5, a_col = transposed ? M + 3 : 1;
            const int64_t ldb = N + 16, ldc = N + 5;
            std::vector<float> A((transposed ? K * a_col : M * a_row) + 8), B(K * ldb), C(M * ldc);
            for (auto& x : A) x = float(small(rng));
            for (auto& x : B) x = float(small(rng));
            for (auto& x : C) x = float(small(rng));
            std::vector<float> want = C;
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n) {
                float sum = accumulate ? C[m * ldc + n] : 0.0f;
                for (int64_t k = 0; k < K; ++k) sum += A[m * a_row + k * a_col] * B[k * ldb + n];
                want[m * ldc + n] = sum;
              }
            cpu_flash::gemm_f32(M, N, K, A.data(), a_row, a_col, B.data(), ldb, C.data(), ldc,
                                accumulate);
            EXPECT_EQ(C, want);
          }
}

// On values whose products round: row_dots_f32's sum of row r equals the
// GEMM's element (r, r) of A B^T bit for bit (D against dP).
TEST(CpuFlashAvx512Kernels, RowDotsF32RoundAsTheGemm) {
  if (!avx512_supported()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.3f, 2.0f);
  for (int64_t rows : {4, 16, 20, 64})
    for (int64_t n : {1, 3, 64, 80, 128}) {
      SCOPED_TRACE(testing::Message() << rows << " rows, n " << n);
      const int64_t ld = n + 16 - n % 16;
      std::vector<float> A(rows * ld), B(rows * ld);
      for (auto& x : A) x = normal(rng);
      for (auto& x : B) x = normal(rng);
      // Bt[c][j] = B[j][c], padded to 16 columns.
      const int64_t cols = (rows + 15) / 16 * 16;
      std::vector<float> Bt(n * cols, 0.0f), C(rows * cols), out(rows, -1.0f);
      for (int64_t j = 0; j < rows; ++j)
        for (int64_t c = 0; c < n; ++c) Bt[c * cols + j] = B[j * ld + c];
      cpu_flash::gemm_f32(rows, cols, n, A.data(), ld, 1, Bt.data(), cols, C.data(), cols, false);
      cpu_flash::row_dots_f32(rows, n, A.data(), ld, B.data(), ld, out.data());
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(out[r], C[r * cols + r]) << "row " << r;
    }
}

TEST(CpuFlashAvx512Kernels, TransposeF32) {
  if (!avx512_supported()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t rows : {16, 64})
    for (int64_t cols : {16, 48, 80, 128}) {
      const int64_t lds = cols + 3, ldd = rows + 16;
      std::vector<float> src(rows * lds), dst(cols * ldd, -7.0f);
      for (auto& x : src) x = normal(rng);
      cpu_flash::transpose_f32(rows, cols, src.data(), lds, dst.data(), ldd);
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < ldd; ++r)
          ASSERT_EQ(dst[c * ldd + r], r < rows ? src[r * lds + c] : -7.0f) << r << ", " << c;
    }
}

// ---- bf16 kernels ----------------------------------------------------------

TEST(CpuFlashBf16Kernels, GemmIsExactOnSmallIntegers) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-8, 8);
  for (int64_t M : {4, 8, 12, 40, 64})
    for (int64_t N : {16, 32, 48, 64, 80, 144})
      for (int64_t K : {2, 16, 80, 128})
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << "M " << M << " N " << N << " K " << K << " acc " << accumulate);
          const int64_t lda = K + 6, ldb = N + 16, ldc = N + 5;
          std::vector<uint16_t> A(M * lda);
          std::vector<float> B(K * N), C(M * ldc);
          for (auto& x : A) x = bits_of(float(small(rng)));
          for (auto& x : B) x = float(small(rng));
          for (auto& x : C) x = float(small(rng));
          std::vector<uint32_t> Bp(K / 2 * ldb);
          for (int64_t kk = 0; kk < K / 2; ++kk)
            for (int64_t n = 0; n < N; ++n)
              Bp[kk * ldb + n] = uint32_t(bits_of(B[2 * kk * N + n])) |
                                 uint32_t(bits_of(B[(2 * kk + 1) * N + n])) << 16;
          std::vector<float> want = C;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              float sum = accumulate ? C[m * ldc + n] : 0.0f;
              for (int64_t k = 0; k < K; ++k) sum += value_of(A[m * lda + k]) * B[k * N + n];
              want[m * ldc + n] = sum;
            }
          cpu_flash::gemm_bf16(M, N, K, A.data(), lda, Bp.data(), ldb, C.data(), ldc, accumulate);
          EXPECT_EQ(C, want);
        }
}

TEST(CpuFlashBf16Kernels, PackingLayouts) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(6);
  std::uniform_int_distribution<int> any(0, 0xffff);
  for (int64_t rows : {16, 64})
    for (int64_t cols : {16, 32, 48, 80, 128}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << cols);
      const int64_t lds = cols + 16;
      std::vector<uint16_t> src(rows * lds);
      for (auto& x : src) x = uint16_t(any(rng));
      // pair_rows: dst[r / 2][c] = src[r][c] | src[r + 1][c] << 16.
      const int64_t ldp = cols + 16;
      std::vector<uint32_t> pairs(rows / 2 * ldp, 0xdeadbeef);
      cpu_flash::pair_rows(rows, cols, src.data(), lds, pairs.data(), ldp);
      for (int64_t r = 0; r < rows; r += 2)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(pairs[r / 2 * ldp + c],
                    uint32_t(src[r * lds + c]) | uint32_t(src[(r + 1) * lds + c]) << 16);
      // transpose_pairs: dst[c / 2][r] = src[r][c] | src[r][c + 1] << 16.
      const int64_t ldt = rows + 16;
      std::vector<uint32_t> trans(cols / 2 * ldt, 0xdeadbeef);
      cpu_flash::transpose_pairs(rows, cols, src.data(), lds, trans.data(), ldt);
      for (int64_t c = 0; c < cols; c += 2)
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(trans[c / 2 * ldt + r],
                    uint32_t(src[r * lds + c]) | uint32_t(src[r * lds + c + 1]) << 16);
    }
}

TEST(CpuFlashBf16Kernels, RoundingToNearestEven) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t rows : {4, 12, 16, 20, 40, 64}) {
    const int64_t cols = 64, lds = cols + 3;
    std::vector<float> src(rows * lds);
    for (auto& x : src) x = normal(rng);
    src[0] = value_of(0x3f80) + 0x1p-8f;  // a tie between 1 and 1 + 2^-7: to 1
    src[1] = value_of(0x3f81) + 0x1p-8f;  // a tie above an odd value: up
    src[2] = -0.0f;
    src[3] = 0x1.8p-130f;  // subnormal: kept by round_to_bf16, zero as an operand
    src[4] = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint16_t> rounded(rows * cols), operands(rows * cols, 0xdead),
        trans(cols * (rows + 4), 0xdead);
    cpu_flash::round_to_bf16(rows, cols, src.data(), lds, rounded.data(), cols);
    cpu_flash::operands_to_bf16(rows, cols, src.data(), lds, operands.data(), cols);
    cpu_flash::operands_to_bf16_transposed(rows, cols, src.data(), lds, trans.data(), rows + 4);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint16_t want = bits_of(src[r * lds + c]);
        ASSERT_EQ(rounded[r * cols + c], want) << r << ", " << c;
        if (r == 0 && (c == 3 || c == 4)) continue;
        ASSERT_EQ(operands[r * cols + c], want) << r << ", " << c;
        ASSERT_EQ(trans[c * (rows + 4) + r], want) << r << ", " << c;
      }
    EXPECT_EQ(rounded[0], 0x3f80);
    EXPECT_EQ(rounded[1], 0x3f82);
    EXPECT_EQ(rounded[2], 0x8000);
    EXPECT_EQ(rounded[3], bits_of(0x1.8p-130f));
    EXPECT_NE(rounded[3], 0);
    EXPECT_EQ(operands[3], 0);
    EXPECT_EQ(trans[3 * (rows + 4)], 0);
    EXPECT_TRUE(std::isnan(value_of(rounded[4])));
    // The rows past `rows` of the transposed tile stay untouched.
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = rows; r < rows + 4; ++r) ASSERT_EQ(trans[c * (rows + 4) + r], 0xdead);
  }
}

// D = rowsum(dO * O) must equal dP = dO V^T's element bit for bit where O's
// row equals a row of V (a window of one key), so dP - D cancels exactly.
TEST(CpuFlashBf16Kernels, RowDotsRoundAsTheGemm) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.5f, 2.0f);
  for (int64_t n : {2, 4, 64, 80, 128}) {
    const int64_t rows = 64, ld = n + 16;  // rows of dO; V has the same rows
    std::vector<uint16_t> dO(rows * ld, 0), V(rows * ld, 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < n; ++c) {
        dO[r * ld + c] = bits_of(normal(rng));
        V[r * ld + c] = bits_of(normal(rng));
      }
    std::vector<uint32_t> Vt(ld / 2 * rows);
    cpu_flash::transpose_pairs(rows, ld, V.data(), ld, Vt.data(), rows);
    std::vector<float> dP(rows * rows), D(rows);
    cpu_flash::gemm_bf16(rows, rows, n, dO.data(), ld, Vt.data(), rows, dP.data(), rows, false);
    cpu_flash::row_dots_bf16(rows, n, dO.data(), V.data(), ld, D.data());
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(D[r], dP[r * rows + r]) << "n " << n << " row " << r;
    // Fewer rows than a vector: the masked tail.
    std::vector<float> D12(12);
    cpu_flash::row_dots_bf16(12, n, dO.data(), V.data(), ld, D12.data());
    for (int64_t r = 0; r < 12; ++r) ASSERT_EQ(D12[r], D[r]);
  }
}

// ---- the backend on both paths ---------------------------------------------

Outputs run_flash(const Inputs& in, Layout layout, int num_threads = 0) {
  return run_on(Backend::CpuFlash, in, DType::bf16, layout, num_threads);
}

Inputs bf16_inputs(const Problem& p, uint64_t seed) {
  Inputs in = random_inputs(p, seed);
  for (std::vector<float>* x : {&in.q, &in.k, &in.v, &in.dout})
    for (float& value : *x) value = value_of(bits_of(value));
  return in;
}

struct Case {
  const char* name;
  Problem problem;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

Problem with_q_start(Problem p, int64_t q_start) {
  p.q_start = q_start;
  return p;
}

std::string oracle_case_name(const ::testing::TestParamInfo<std::tuple<Case, bool>>& c) {
  return std::string(std::get<0>(c.param).name) + (std::get<1>(c.param) ? "_bf16dot" : "_fallback");
}

// (case, fast path on): the fast path's runs skip where the CPU lacks it.
class CpuFlashBf16Oracle : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(CpuFlashBf16Oracle, WithinTolerance) {
  const auto& [c, fast] = GetParam();
  if (fast && !bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const Problem& p = c.problem;
  const Inputs in = bf16_inputs(p, 5000 + uint64_t(p.Tq * 7 + p.Tk + p.d));
  const Reference ref = run_oracle(in);
  const Outputs mirror = run_cpu(in, DType::bf16, Layout::strided);
  const Bf16Dot path(fast);
  for (Layout layout : {Layout::packed, Layout::strided}) {
    SCOPED_TRACE(layout == Layout::packed ? "packed" : "strided");
    const Outputs got = run_flash(in, layout);
    const auto expect = [&](const char* name, const std::vector<float>& x,
                            const std::vector<float>& m, const std::vector<double>& r) {
      EXPECT_LE(max_rel_error(x, r), check::tolerance(DType::bf16, name, max_rel_error(m, r)))
          << name;
    };
    expect("o", got.o, mirror.o, ref.o);
    expect("lse", got.lse, mirror.lse, ref.lse);
    expect("dq", got.dq, mirror.dq, ref.dq);
    expect("dk", got.dk, mirror.dk, ref.dk);
    expect("dv", got.dv, mirror.dv, ref.dv);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuFlashBf16Oracle,
    ::testing::Combine(
        ::testing::Values(
            Case{"T1_d3", make_problem(1, 1, 1, 2, 1, 3, true)},
            Case{"T37_causal_gqa_d3", make_problem(2, 37, 37, 4, 2, 3, true)},
            Case{"T200_causal_gqa_d64", make_problem(1, 200, 200, 8, 2, 64, true)},
            Case{"T131_noncausal_d128", make_problem(2, 131, 131, 2, 2, 128)},
            Case{"T257_causal_window_d80", make_problem(1, 257, 257, 4, 2, 80, true, 100)},
            Case{"Tq_lt_Tk_softcap_gqa_d128", make_problem(1, 150, 190, 6, 2, 128, true, 0, 30.0f)},
            Case{"Tq_gt_Tk_noncausal_window_d80", make_problem(1, 190, 70, 3, 1, 80, false, 40)},
            Case{"softcap_large_logits_d64", make_problem(1, 100, 129, 4, 4, 64, false, 0, 5.0f)},
            Case{"decode_mqa_Tq1_d128", make_problem(1, 1, 300, 8, 1, 128, true)},
            Case{"q_start_negative_d64",
                 with_q_start(make_problem(1, 90, 160, 2, 1, 64, true), -30)},
            Case{"q_start_past_Tk_d80",
                 with_q_start(make_problem(1, 20, 80, 2, 2, 80, true, 7), 100)},
            Case{"d16_many_blocks", make_problem(1, 300, 330, 2, 1, 16, true)}),
        ::testing::Bool()),
    oracle_case_name);

// A window of one key: every row attends to itself, o = v, so dS = P (dP -
// D) is zero only if D rounds exactly as dP; the gradients of q and k are
// then exactly zero, as the oracle's.
TEST(CpuFlashBf16, WindowOfOneKeyGivesZeroDqDk) {
  for (bool fast : {true, false}) {
    if (fast && !bf16_dot_supported()) continue;
    SCOPED_TRACE(fast ? "bf16 dot" : "fallback");
    const Bf16Dot path(fast);
    const Inputs in = bf16_inputs(make_problem(1, 150, 150, 4, 2, 80, true, 1), 91);
    const Outputs got = run_flash(in, Layout::packed);
    EXPECT_TRUE(std::all_of(got.dq.begin(), got.dq.end(), [](float x) { return x == 0.0f; }));
    EXPECT_TRUE(std::all_of(got.dk.begin(), got.dk.end(), [](float x) { return x == 0.0f; }));
  }
}

TEST(CpuFlashBf16, SameBitsAcrossRunsThreadsAndDqPasses) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const Bf16Dot path(true);
  // One thread fuses dQ into the dK/dV pass, three do not (B x Hkv <= 2).
  for (const Problem& p : {make_problem(2, 150, 130, 4, 1, 48, true, 0, 20.0f),
                           make_problem(1, 200, 260, 3, 1, 80, true, 70),
                           make_problem(1, 100, 140, 6, 1, 32, false, 0, 15.0f),
                           with_q_start(make_problem(1, 70, 150, 2, 1, 128, true), -20)}) {
    const Inputs in = bf16_inputs(p, 79);
    const Outputs one = run_flash(in, Layout::packed, 1);
    for (int threads : {1, 2, 3, 0}) {
      SCOPED_TRACE(threads);
      expect_same_bits(one, run_flash(in, Layout::packed, threads));
    }
  }
}

// The switch takes effect: the two paths round differently (P and dS in
// bf16 on one), so their bits differ on a typical problem.
TEST(CpuFlashBf16, FastPathRunsWhereSupported) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const Inputs in = bf16_inputs(make_problem(1, 130, 130, 4, 2, 64, true), 80);
  Outputs fast, fallback;
  {
    const Bf16Dot path(true);
    fast = run_flash(in, Layout::packed);
  }
  {
    const Bf16Dot path(false);
    fallback = run_flash(in, Layout::packed);
  }
  EXPECT_FALSE(same_bits(fast.dq, fallback.dq) && same_bits(fast.dk, fallback.dk) &&
               same_bits(fast.dv, fallback.dv));
}

}  // namespace
}  // namespace gqattn::test
