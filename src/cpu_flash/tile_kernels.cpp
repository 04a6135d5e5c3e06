// The tile kernels (tile_kernels.hpp). Plain loops written for the
// auto-vectorizer: register blocks of 4 rows by 64 (or 16) columns held in
// local arrays, the inner loop over contiguous columns. target_clones builds
// an AVX-512, an AVX2+FMA and a baseline x86-64 copy of each and picks one
// at load time (the library's flags name no -march), so the library runs on
// any x86-64 and uses the vector width the CPU has.
#include "cpu_flash/tile_kernels.hpp"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__SANITIZE_ADDRESS__)
#define GQATTN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GQATTN_CLONES
#endif

namespace gqattn::cpu_flash {
namespace {

// 4 rows of C by W columns: acc = (C or 0) + sum over k of A[r][k] * B[k][:],
// k ascending.
// Always inlined: a call would run the baseline copy, not the caller's clone.
template <int W>
__attribute__((always_inline)) inline void block_4xw(int64_t K, const float* A, int64_t lda,
                                                     const float* B, int64_t ldb, float* C,
                                                     int64_t ldc, bool accumulate) {
  float acc[4][W];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < W; ++c) acc[r][c] = accumulate ? C[r * ldc + c] : 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    const float a0 = A[k], a1 = A[lda + k], a2 = A[2 * lda + k], a3 = A[3 * lda + k];
    for (int c = 0; c < W; ++c) {
      const float bc = b[c];
      acc[0][c] += a0 * bc;
      acc[1][c] += a1 * bc;
      acc[2][c] += a2 * bc;
      acc[3][c] += a3 * bc;
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < W; ++c) C[r * ldc + c] = acc[r][c];
}

}  // namespace

GQATTN_CLONES
void gemm_nn(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  for (int64_t n0 = 0; n0 < N;) {
    if (N - n0 >= 64) {
      for (int64_t m = 0; m < M; m += 4)
        block_4xw<64>(K, A + m * lda, lda, B + n0, ldb, C + m * ldc + n0, ldc, accumulate);
      n0 += 64;
    } else {
      for (int64_t m = 0; m < M; m += 4)
        block_4xw<16>(K, A + m * lda, lda, B + n0, ldb, C + m * ldc + n0, ldc, accumulate);
      n0 += 16;
    }
  }
}

GQATTN_CLONES
void row_dots(int64_t rows, int64_t n, const float* A, const float* B, int64_t ld, float* out) {
  // The loop order of gemm_nn (k outer, one accumulator per output element,
  // acc += a * b): a reduction loop over c would be split by the vectorizer
  // into a product and a separate add, rounding differently from the GEMM's
  // contracted fma.
  for (int64_t r = 0; r < rows; ++r) out[r] = 0.0f;
  for (int64_t c = 0; c < n; ++c)
    for (int64_t r = 0; r < rows; ++r) out[r] += A[r * ld + c] * B[r * ld + c];
}

GQATTN_CLONES
void transpose(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

GQATTN_CLONES
void exp_sub(int64_t n, const float* x, float sub, float* y) {
  // exp(t) = 2^(t log2 e) = 2^n 2^f, n = round(t log2 e), |f| <= 1/2;
  // 2^f by its Taylor series to degree 7 (error below 1e-8 relative).
  const float log2e = 1.44269504088896341f;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  for (int64_t i = 0; i < n; ++i) {
    const float t0 = (x[i] - sub) * log2e;
    const bool zero = !(t0 >= -126.0f);  // also -inf and NaN
    const float t = zero ? -126.0f : (t0 > 127.0f ? 127.0f : t0);
    const float rn = t + magic;
    const float nf = rn - magic;
    const float f = t - nf;
    float p = 1.5252733804059840e-5f;
    p = p * f + 1.5403530393381609e-4f;
    p = p * f + 1.3333558146428443e-3f;
    p = p * f + 9.6181291076284772e-3f;
    p = p * f + 5.5504108664821580e-2f;
    p = p * f + 2.4022650695910071e-1f;
    p = p * f + 6.9314718055994531e-1f;
    p = p * f + 1.0f;
    unsigned int pb, ib;
    std::memcpy(&pb, &p, 4);
    std::memcpy(&ib, &rn, 4);
    pb += ib << 23;  // adds n to the exponent: rn's low mantissa bits hold n
    float out;
    std::memcpy(&out, &pb, 4);
    y[i] = zero ? 0.0f : out;
  }
}

}  // namespace gqattn::cpu_flash
