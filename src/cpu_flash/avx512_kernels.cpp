// The AVX-512 tile kernels (avx512_kernels.hpp): intrinsics under target
// attributes, run only where avx512_supported() (and, for the bf16 products,
// bf16_dot_supported()) says the CPU has them. Elsewhere (other compilers or
// architectures) they are stubs that are never called.
#include "cpu_flash/avx512_kernels.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "cuda/fused/softcap_poly.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GQATTN_AVX512 1
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers pass a self-initialized "undefined" vector to
// the unpack builtins, which -Wmaybe-uninitialized reports once inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define GQATTN_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#define GQATTN_AVX512_INLINE GQATTN_AVX512_TARGET __attribute__((always_inline)) inline
#define GQATTN_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16")))
#define GQATTN_BF16_INLINE GQATTN_BF16_TARGET __attribute__((always_inline)) inline
#endif

namespace gqattn::cpu_flash {
namespace {

std::atomic<bool> turned_off{false};

}  // namespace

bool avx512_supported() {
#ifdef GQATTN_AVX512
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("fma");
  }();
  return yes;
#else
  return false;
#endif
}

bool bf16_dot_supported() {
#ifdef GQATTN_AVX512
  static const bool yes = avx512_supported() && __builtin_cpu_supports("avx512bf16");
  return yes;
#else
  return false;
#endif
}

bool avx512_enabled() { return avx512_supported() && !turned_off.load(std::memory_order_relaxed); }

bool bf16_dot_enabled() { return bf16_dot_supported() && avx512_enabled(); }

bool set_avx512_kernels(bool on) {
  const bool was = avx512_enabled();
  turned_off.store(!on, std::memory_order_relaxed);
  return was;
}

#ifdef GQATTN_AVX512
namespace {

// MR rows by NV vectors of 16 columns of C: acc = (C or 0) + sum over pairs
// kk ascending of vdpbf16ps(broadcast A[r][2kk..2kk+1], B[kk][columns]).
template <int MR, int NV>
GQATTN_BF16_INLINE void block_bf16(int64_t pairs, const uint16_t* A, int64_t lda, const uint32_t* B,
                                   int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t kk = 0; kk < pairs; ++kk) {
    __m512i b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(B + kk * ldb + 16 * v);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * kk, 4);
      const __m512i a = _mm512_set1_epi32(pair);
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)b[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
}

// Rows in blocks of MR (M a multiple of MR) for NV vectors of columns.
template <int MR, int NV>
GQATTN_BF16_INLINE void rows_bf16(int64_t M, int64_t pairs, const uint16_t* A, int64_t lda,
                                  const uint32_t* B, int64_t ldb, float* C, int64_t ldc,
                                  bool accumulate) {
  for (int64_t m = 0; m < M; m += MR)
    block_bf16<MR, NV>(pairs, A + m * lda, lda, B, ldb, C + m * ldc, ldc, accumulate);
}

// 16 x 16 32-bit words in place: r[c] becomes column c (rows 0..15 in lanes).
GQATTN_AVX512_INLINE void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
  }
}

// 16 floats to bf16 as float_to_bf16 rounds them: to nearest, ties to
// even, on the bits (subnormals kept); a NaN keeps its high half, quieted.
GQATTN_BF16_INLINE __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, is_nan, nan));
}

// 16 floats to bf16 as an operand of vdpbf16ps: the instruction's own
// conversion (to nearest even as to_bf16, one instruction), which turns
// subnormals into zeros, as vdpbf16ps reads them anyway.
GQATTN_BF16_INLINE __m256i to_bf16_operand(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

// exp_sub's exp(t / log2e) for t = (x - sub) * log2e: 2^n 2^f, n =
// round(t), |f| <= 1/2, 2^f by its degree 7 Taylor polynomial; t below -126
// (also -inf and NaN) gives 0.
GQATTN_AVX512_INLINE __m512 exp2_poly(__m512 t0) {
  const __mmask16 keep = _mm512_cmp_ps_mask(t0, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  const __m512 t =
      _mm512_min_ps(_mm512_max_ps(t0, _mm512_set1_ps(-126.0f)), _mm512_set1_ps(127.0f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23
  const __m512 rn = _mm512_add_ps(t, magic);
  const __m512 f = _mm512_sub_ps(t, _mm512_sub_ps(rn, magic));
  __m512 p = _mm512_set1_ps(1.5252733804059840e-5f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381609e-4f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i bits =
      _mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(_mm512_castps_si512(rn), 23));
  return _mm512_maskz_mov_ps(keep, _mm512_castsi512_ps(bits));
}

constexpr float kLog2e = 1.44269504088896341f;

// Which of columns c0 .. c0 + 15 lie in [lo, hi].
GQATTN_AVX512_INLINE __mmask16 kept_lanes(int64_t c0, int64_t lo, int64_t hi) {
  const __m512i c =
      _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                       _mm512_set1_epi32(int32_t(c0)));
  return _mm512_cmp_epi32_mask(c, _mm512_set1_epi32(int32_t(lo)), _MM_CMPINT_NLT) &
         _mm512_cmp_epi32_mask(c, _mm512_set1_epi32(int32_t(hi)), _MM_CMPINT_LE);
}

// tanh(y) for 16 lanes, absolute error about 1.2e-7 (std::tanh's is about
// 6e-8): for |y| <= fused::kSoftcapPolyMaxY the odd minimax polynomial the
// CUDA kernels use (cuda/fused/softcap_poly.hpp), beyond it 1 - 2 / (e^2|y|
// + 1) with exp2_poly, where the difference no longer cancels; odd in y.
// Vectors whose every lane is small (most scores of a trained model) skip
// the exp and the division.
GQATTN_AVX512_INLINE __m512 tanh_poly(__m512 y) {
  const __m512 z = _mm512_mul_ps(y, y);
  __m512 p = _mm512_set1_ps(fused::kSoftcapPolyC4);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(fused::kSoftcapPolyC3));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(fused::kSoftcapPolyC2));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(fused::kSoftcapPolyC1));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(fused::kSoftcapPolyC0));
  const __m512 small = _mm512_mul_ps(y, p);
  const __m512 a = _mm512_abs_ps(y);
  const __mmask16 is_small =
      _mm512_cmp_ps_mask(a, _mm512_set1_ps(fused::kSoftcapPolyMaxY), _CMP_LE_OQ);
  if (is_small == 0xffff) return small;
  const __m512 e = exp2_poly(_mm512_mul_ps(a, _mm512_set1_ps(2.0f * kLog2e)));
  const __m512 large =
      _mm512_sub_ps(_mm512_set1_ps(1.0f),
                    _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  // The sign of y onto |tanh|.
  const __m512 signed_large = _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(large),
                      _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(INT32_MIN))));
  return _mm512_mask_mov_ps(signed_large, is_small, small);
}

// One score row's 64 values transformed (scale, then softcap * tanh(s /
// softcap) by tanh_poly, s / softcap as a product with 1 / softcap; the
// tanh kept in t when asked): x[v] holds columns 16 v .. 16 v + 15.
GQATTN_AVX512_INLINE void transform_scores(const float* row, const ScoreRows& k, __m512 x[4],
                                           __m512 t[4]) {
  const __m512 scale = _mm512_set1_ps(k.scale);
  for (int v = 0; v < 4; ++v) x[v] = _mm512_mul_ps(_mm512_loadu_ps(row + 16 * v), scale);
  if (k.softcap <= 0.0f) return;
  const __m512 cap = _mm512_set1_ps(k.softcap), inv_cap = _mm512_set1_ps(1.0f / k.softcap);
  for (int v = 0; v < 4; ++v) {
    const __m512 th = tanh_poly(_mm512_mul_ps(x[v], inv_cap));
    if (t != nullptr) t[v] = th;
    x[v] = _mm512_mul_ps(cap, th);
  }
}

// MR rows by NV vectors of 16 columns of C: acc = (C or 0) + sum over k
// ascending of fma(A(r, k), B[k][columns]). block_bf16's shape on f32: kept
// apart because a template shared by both would carry the avx512bf16 target
// into the f32 path, which CPUs without AVX512-BF16 run.
template <int MR, int NV>
GQATTN_AVX512_INLINE void block_f32(int64_t K, const float* A, int64_t a_row, int64_t a_col,
                                    const float* B, int64_t ldb, float* C, int64_t ldc,
                                    bool accumulate) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(B + k * ldb + 16 * v);
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * a_row + k * a_col]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
}

// Rows in blocks of MR (M a multiple of MR) for NV vectors of columns.
template <int MR, int NV>
GQATTN_AVX512_INLINE void rows_f32(int64_t M, int64_t K, const float* A, int64_t a_row,
                                   int64_t a_col, const float* B, int64_t ldb, float* C,
                                   int64_t ldc, bool accumulate) {
  for (int64_t m = 0; m < M; m += MR)
    block_f32<MR, NV>(K, A + m * a_row, a_row, a_col, B, ldb, C + m * ldc, ldc, accumulate);
}

// Lane i of the result = the sum (kMax: the maximum) of v[i]'s 16 lanes,
// for 16 rows at once by a tree of in-register shuffles: about 45
// instructions where 16 horizontal reductions take about 140 (measured: the
// softmax step's share of an f32 d64 forward fell from 13.7% to 12.2%).
// Each level halves every row's partial lanes and doubles the rows a vector
// holds; the last leaves row k + 4j in lane 4k + j, which the permutation
// puts back in lane k + 4j.
template <bool kMax>
GQATTN_AVX512_INLINE __m512 combine(__m512 a, __m512 b) {
  if constexpr (kMax)
    return _mm512_max_ps(a, b);
  else
    return _mm512_add_ps(a, b);
}

template <bool kMax>
GQATTN_AVX512_INLINE __m512 reduce_rows16(const __m512 v[16]) {
  __m512 two[8], four[4], eight[2];
  for (int i = 0; i < 8; ++i)  // quarters: row 2i, 2i, 2i + 1, 2i + 1
    two[i] = combine<kMax>(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                           _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // quarter q: row 4i + q
    four[i] = combine<kMax>(_mm512_shuffle_f32x4(two[2 * i], two[2 * i + 1], 0x88),
                            _mm512_shuffle_f32x4(two[2 * i], two[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // quarter q: rows 8i + q, 8i + 4 + q, two lanes each
    eight[i] = combine<kMax>(_mm512_shuffle_ps(four[2 * i], four[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(four[2 * i], four[2 * i + 1], 0xEE));
  const __m512 all = combine<kMax>(_mm512_shuffle_ps(eight[0], eight[1], 0x88),
                                   _mm512_shuffle_ps(eight[0], eight[1], 0xDD));
  return _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), all);
}

// The softmax step in phases over blocks of 16 rows, so that no row's chain
// (max, then alpha, then the exps, then the sum) waits on the previous
// row's. Phase 1: rows r0 .. r0 + n - 1 of S transformed in place (-inf
// outside the kept columns), each row's maximum in mx, rows keeping nothing
// flagged in the result.
GQATTN_AVX512_INLINE __mmask16 row_maxima(float* S, int64_t r0, int64_t n, const ScoreRows& k,
                                          __m512& mx) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 empty = 0;
  __m512 most[16];
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t r = r0 + i;
    most[i] = neg_inf;
    if (i >= n) continue;
    float* row = S + r * 64;
    if (k.lo[r] > k.hi[r]) {
      empty = __mmask16(empty | (1u << i));
      continue;
    }
    __m512 x[4];
    transform_scores(row, k, x, nullptr);
    for (int v = 0; v < 4; ++v) {
      x[v] = _mm512_mask_mov_ps(neg_inf, kept_lanes(16 * v, k.lo[r], k.hi[r]), x[v]);
      most[i] = _mm512_max_ps(most[i], x[v]);
      _mm512_storeu_ps(row + 16 * v, x[v]);
    }
  }
  mx = reduce_rows16<true>(most);
  return empty;
}

// Phase 2: m_new = max(m, row max), alpha = exp(m - m_new) (0 while m was
// -inf) for the block's rows, m updated; rows keeping nothing keep m and get
// alpha = 1.
GQATTN_AVX512_INLINE void row_alphas(float* m, int64_t r0, __mmask16 lanes, __mmask16 empty,
                                     __m512 mx, float m_new[16], float alpha[16]) {
  const __m512 m_old = _mm512_maskz_loadu_ps(lanes, m + r0);
  const __m512 most = _mm512_max_ps(m_old, mx);
  const __m512 a = exp2_poly(_mm512_mul_ps(_mm512_sub_ps(m_old, most), _mm512_set1_ps(kLog2e)));
  _mm512_storeu_ps(m_new, _mm512_mask_mov_ps(most, empty, m_old));
  _mm512_storeu_ps(alpha, _mm512_mask_mov_ps(a, empty, _mm512_set1_ps(1.0f)));
  _mm512_mask_storeu_ps(m + r0, lanes, _mm512_loadu_ps(m_new));
}

// Phase 3, one row: p = exp(s - m_new) of its 64 transformed scores; returns
// their sum by lanes (the four vectors added pairwise; reduce_rows16 adds
// the lanes of 16 rows at once).
GQATTN_AVX512_INLINE __m512 row_probabilities(const float* row, float m_new, __m512 p[4]) {
  const __m512 sub = _mm512_set1_ps(m_new), log2e = _mm512_set1_ps(kLog2e);
  for (int v = 0; v < 4; ++v)
    p[v] = exp2_poly(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(row + 16 * v), sub), log2e));
  return _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3]));
}

// Phase 4: l = l * alpha + sum; O's rows times alpha where it is not 1.
GQATTN_AVX512_INLINE void rescale_rows(float* l, float* O, int64_t ldo, int64_t o_cols, int64_t r0,
                                       int64_t n, __mmask16 lanes, const float alpha[16],
                                       __m512 sum) {
  const __m512 l_new =
      _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes, l + r0), _mm512_loadu_ps(alpha), sum);
  _mm512_mask_storeu_ps(l + r0, lanes, l_new);
  if (O == nullptr) return;
  for (int64_t i = 0; i < n; ++i) {
    if (alpha[i] == 1.0f) continue;
    float* o = O + (r0 + i) * ldo;
    const __m512 scale = _mm512_set1_ps(alpha[i]);
    for (int64_t c = 0; c < o_cols; c += 16)
      _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), scale));
  }
}

GQATTN_AVX512_INLINE __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

}  // namespace

GQATTN_AVX512_TARGET
void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_col,
              const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  int64_t n0 = 0;
  for (; N - n0 >= 64; n0 += 64)
    rows_f32<4, 4>(M, K, A, a_row, a_col, B + n0, ldb, C + n0, ldc, accumulate);
  // 16 to 48 columns left: 8-row blocks where M allows, for enough
  // independent accumulators to cover the fma's latency.
  const int64_t nv = (N - n0) / 16;
  const bool tall = M % 8 == 0;
  const float* Bt = B + n0;
  float* Ct = C + n0;
  if (nv == 3) {
    if (tall)
      rows_f32<8, 3>(M, K, A, a_row, a_col, Bt, ldb, Ct, ldc, accumulate);
    else
      rows_f32<4, 3>(M, K, A, a_row, a_col, Bt, ldb, Ct, ldc, accumulate);
  } else if (nv == 2) {
    if (tall)
      rows_f32<8, 2>(M, K, A, a_row, a_col, Bt, ldb, Ct, ldc, accumulate);
    else
      rows_f32<4, 2>(M, K, A, a_row, a_col, Bt, ldb, Ct, ldc, accumulate);
  } else if (nv == 1) {
    if (tall)
      rows_f32<8, 1>(M, K, A, a_row, a_col, Bt, ldb, Ct, ldc, accumulate);
    else
      rows_f32<4, 1>(M, K, A, a_row, a_col, Bt, ldb, Ct, ldc, accumulate);
  }
}

GQATTN_AVX512_TARGET
void row_dots_f32(int64_t rows, int64_t n, const float* A, int64_t lda, const float* B, int64_t ldb,
                  float* out) {
  // Lane i holds row r0 + i: 16 x 16 blocks of A and B transposed, so
  // vector c holds column c0 + c of the 16 rows, then one fma per column.
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t live = std::min<int64_t>(16, rows - r0);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c0 = 0; c0 < n; c0 += 16) {
      const __mmask16 cols = first_lanes(n - c0);
      __m512i a[16], b[16];
      for (int r = 0; r < 16; ++r) {
        a[r] = r < live ? _mm512_maskz_loadu_epi32(cols, A + (r0 + r) * lda + c0)
                        : _mm512_setzero_si512();
        b[r] = r < live ? _mm512_maskz_loadu_epi32(cols, B + (r0 + r) * ldb + c0)
                        : _mm512_setzero_si512();
      }
      transpose16(a);
      transpose16(b);
      for (int64_t c = 0; c < std::min<int64_t>(16, n - c0); ++c)
        acc = _mm512_fmadd_ps(_mm512_castsi512_ps(a[c]), _mm512_castsi512_ps(b[c]), acc);
    }
    _mm512_mask_storeu_ps(out + r0, first_lanes(live), acc);
  }
}

GQATTN_AVX512_TARGET
void transpose_f32(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst,
                   int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      __m512i x[16];
      for (int r = 0; r < 16; ++r)
        x[r] = _mm512_castps_si512(_mm512_loadu_ps(src + (r0 + r) * lds + c0));
      transpose16(x);
      for (int c = 0; c < 16; ++c)
        _mm512_storeu_ps(dst + (c0 + c) * ldd + r0, _mm512_castsi512_ps(x[c]));
    }
}

GQATTN_AVX512_TARGET
void softmax_step_f32(int64_t rows, float* S, const ScoreRows& k, float* m, float* l, float* O,
                      int64_t ldo, int64_t o_cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t n = std::min<int64_t>(16, rows - r0);
    const __mmask16 lanes = first_lanes(n);
    __m512 mx, sums[16];
    float alpha[16], m_new[16];
    const __mmask16 empty = row_maxima(S, r0, n, k, mx);
    row_alphas(m, r0, lanes, empty, mx, m_new, alpha);
    for (int64_t i = 0; i < 16; ++i) {
      sums[i] = _mm512_setzero_ps();
      if (i >= n) continue;
      float* row = S + (r0 + i) * 64;
      __m512 p[4];
      if (empty & (1u << i)) {
        for (int v = 0; v < 4; ++v) _mm512_storeu_ps(row + 16 * v, _mm512_setzero_ps());
        continue;
      }
      sums[i] = row_probabilities(row, m_new[i], p);
      for (int v = 0; v < 4; ++v) _mm512_storeu_ps(row + 16 * v, p[v]);
    }
    rescale_rows(l, O, ldo, o_cols, r0, n, lanes, alpha, reduce_rows16<false>(sums));
  }
}

GQATTN_BF16_TARGET
void gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B,
               int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  const int64_t pairs = K / 2;
  int64_t n0 = 0;
  for (; N - n0 >= 64; n0 += 64)
    rows_bf16<4, 4>(M, pairs, A, lda, B + n0, ldb, C + n0, ldc, accumulate);
  // 16 to 48 columns left: 8-row blocks where M allows, for enough
  // independent accumulators to cover the instruction's latency.
  const int64_t nv = (N - n0) / 16;
  const bool tall = M % 8 == 0;
  if (nv == 3) {
    if (tall)
      rows_bf16<8, 3>(M, pairs, A, lda, B + n0, ldb, C + n0, ldc, accumulate);
    else
      rows_bf16<4, 3>(M, pairs, A, lda, B + n0, ldb, C + n0, ldc, accumulate);
  } else if (nv == 2) {
    if (tall)
      rows_bf16<8, 2>(M, pairs, A, lda, B + n0, ldb, C + n0, ldc, accumulate);
    else
      rows_bf16<4, 2>(M, pairs, A, lda, B + n0, ldb, C + n0, ldc, accumulate);
  } else if (nv == 1) {
    if (tall)
      rows_bf16<8, 1>(M, pairs, A, lda, B + n0, ldb, C + n0, ldc, accumulate);
    else
      rows_bf16<4, 1>(M, pairs, A, lda, B + n0, ldb, C + n0, ldc, accumulate);
  }
}

GQATTN_BF16_TARGET
void row_dots_bf16(int64_t rows, int64_t n, const uint16_t* A, const uint16_t* B, int64_t ld,
                   float* out) {
  // Lane r holds row r0 + r: its pairs gathered, then the GEMM's
  // vdpbf16ps(acc, A's pair, B's pair) per pair, ascending.
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i index = _mm512_mullo_epi32(lane, _mm512_set1_epi32(int32_t(ld / 2)));
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t left = rows - r0;
    const __mmask16 mask = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < n / 2; ++kk) {
      const __m512i a =
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, index, A + r0 * ld + 2 * kk, 4);
      const __m512i b =
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, index, B + r0 * ld + 2 * kk, 4);
      acc = _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
    }
    _mm512_mask_storeu_ps(out + r0, mask, acc);
  }
}

GQATTN_BF16_TARGET
void round_to_bf16(int64_t rows, int64_t cols, const float* src, int64_t lds, uint16_t* dst,
                   int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16) {
      const int64_t left = cols - c;
      const __mmask16 mask = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
      const __m256i x = to_bf16(_mm512_maskz_loadu_ps(mask, src + r * lds + c));
      _mm256_mask_storeu_epi16(dst + r * ldd + c, mask, x);
    }
}

GQATTN_BF16_TARGET
void operands_to_bf16(int64_t rows, int64_t cols, const float* src, int64_t lds, uint16_t* dst,
                      int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + r * ldd + c),
                          to_bf16_operand(_mm512_loadu_ps(src + r * lds + c)));
}

GQATTN_BF16_TARGET
void operands_to_bf16_transposed(int64_t rows, int64_t cols, const float* src, int64_t lds,
                                 uint16_t* dst, int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t left = rows - r0;
    const __mmask16 mask = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      __m512i x[16];
      for (int r = 0; r < 16; ++r)
        x[r] = r < left ? _mm512_castps_si512(_mm512_loadu_ps(src + (r0 + r) * lds + c0))
                        : _mm512_setzero_si512();
      transpose16(x);
      for (int c = 0; c < 16; ++c)
        _mm256_mask_storeu_epi16(dst + (c0 + c) * ldd + r0, mask,
                                 to_bf16_operand(_mm512_castsi512_ps(x[c])));
    }
  }
}

GQATTN_BF16_TARGET
void pair_rows(int64_t rows, int64_t cols, const uint16_t* src, int64_t lds, uint32_t* dst,
               int64_t ldd) {
  // Words 0..15 of a row pair's 16-column chunk: element c of row r, then of r + 1.
  static const uint16_t order[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_loadu_si512(order);
  for (int64_t r = 0; r < rows; r += 2)
    for (int64_t c = 0; c < cols; c += 16) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + r * lds + c));
      const __m256i hi =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (r + 1) * lds + c));
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      _mm512_storeu_si512(dst + (r / 2) * ldd + c, _mm512_permutexvar_epi16(interleave, both));
    }
}

GQATTN_BF16_TARGET
void transpose_pairs(int64_t rows, int64_t cols, const uint16_t* src, int64_t lds, uint32_t* dst,
                     int64_t ldd) {
  const int64_t words = cols / 2, ldw = lds / 2;
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t w0 = 0; w0 < words; w0 += 16) {
      const int64_t left = words - w0 < 16 ? words - w0 : 16;
      const __mmask16 mask = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
      __m512i x[16];
      for (int r = 0; r < 16; ++r)
        x[r] = _mm512_maskz_loadu_epi32(mask, src + 2 * ((r0 + r) * ldw + w0));
      transpose16(x);
      for (int64_t w = 0; w < left; ++w) _mm512_storeu_si512(dst + (w0 + w) * ldd + r0, x[w]);
    }
}

GQATTN_BF16_TARGET
void softmax_step_bf16(int64_t rows, float* S, const ScoreRows& k, float* m, float* l, float* O,
                       int64_t ldo, int64_t o_cols, uint16_t* P) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t n = std::min<int64_t>(16, rows - r0);
    const __mmask16 lanes = first_lanes(n);
    __m512 mx, sums[16];
    float alpha[16], m_new[16];
    const __mmask16 empty = row_maxima(S, r0, n, k, mx);
    row_alphas(m, r0, lanes, empty, mx, m_new, alpha);
    for (int64_t i = 0; i < 16; ++i) {
      sums[i] = _mm512_setzero_ps();
      if (i >= n) continue;
      uint16_t* prow = P != nullptr ? P + (r0 + i) * 64 : nullptr;
      __m512 p[4];
      if (empty & (1u << i)) {
        for (int v = 0; v < 4; ++v) p[v] = _mm512_setzero_ps();
      } else {
        sums[i] = row_probabilities(S + (r0 + i) * 64, m_new[i], p);
      }
      if (prow != nullptr)
        for (int v = 0; v < 4; ++v)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(prow + 16 * v), to_bf16_operand(p[v]));
    }
    rescale_rows(l, O, ldo, o_cols, r0, n, lanes, alpha, reduce_rows16<false>(sums));
  }
}

GQATTN_AVX512_TARGET
void probabilities_and_ds_avx512(int64_t rows, float* S, float* dP, const ScoreRows& k,
                                 const float* m, const float* inv_l, const float* D) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = S + r * 64;
    float* dp = dP + r * 64;
    if (k.lo[r] > k.hi[r]) {
      for (int v = 0; v < 4; ++v) {
        _mm512_storeu_ps(row + 16 * v, _mm512_setzero_ps());
        _mm512_storeu_ps(dp + 16 * v, _mm512_setzero_ps());
      }
      continue;
    }
    __m512 x[4], t[4];
    transform_scores(row, k, x, t);
    const __m512 sub = _mm512_set1_ps(m[r]), log2e = _mm512_set1_ps(kLog2e);
    const __m512 inv = _mm512_set1_ps(inv_l[r]), d = _mm512_set1_ps(D[r]);
    const __m512 scale = _mm512_set1_ps(k.scale);
    for (int v = 0; v < 4; ++v) {
      const __mmask16 kept = kept_lanes(16 * v, k.lo[r], k.hi[r]);
      const __m512 p = _mm512_mul_ps(
          _mm512_maskz_mov_ps(kept, exp2_poly(_mm512_mul_ps(_mm512_sub_ps(x[v], sub), log2e))),
          inv);
      __m512 ds =
          _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + 16 * v), d)), scale);
      if (k.softcap > 0.0f)
        ds = _mm512_mul_ps(ds, _mm512_fnmadd_ps(t[v], t[v], _mm512_set1_ps(1.0f)));
      _mm512_storeu_ps(row + 16 * v, p);
      _mm512_storeu_ps(dp + 16 * v, ds);
    }
  }
}

#else  // no AVX-512 code on this compiler or architecture: never called

void gemm_f32(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
              float*, int64_t, bool) {
  std::abort();
}
void row_dots_f32(int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*) {
  std::abort();
}
void transpose_f32(int64_t, int64_t, const float*, int64_t, float*, int64_t) { std::abort(); }
void softmax_step_f32(int64_t, float*, const ScoreRows&, float*, float*, float*, int64_t, int64_t) {
  std::abort();
}

void gemm_bf16(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t,
               float*, int64_t, bool) {
  std::abort();
}
void row_dots_bf16(int64_t, int64_t, const uint16_t*, const uint16_t*, int64_t, float*) {
  std::abort();
}
void round_to_bf16(int64_t, int64_t, const float*, int64_t, uint16_t*, int64_t) { std::abort(); }
void operands_to_bf16(int64_t, int64_t, const float*, int64_t, uint16_t*, int64_t) { std::abort(); }
void operands_to_bf16_transposed(int64_t, int64_t, const float*, int64_t, uint16_t*, int64_t) {
  std::abort();
}
void pair_rows(int64_t, int64_t, const uint16_t*, int64_t, uint32_t*, int64_t) { std::abort(); }
void transpose_pairs(int64_t, int64_t, const uint16_t*, int64_t, uint32_t*, int64_t) {
  std::abort();
}
void softmax_step_bf16(int64_t, float*, const ScoreRows&, float*, float*, float*, int64_t, int64_t,
                       uint16_t*) {
  std::abort();
}
void probabilities_and_ds_avx512(int64_t, float*, float*, const ScoreRows&, const float*,
                                 const float*, const float*) {
  std::abort();
}

#endif

}  // namespace gqattn::cpu_flash
