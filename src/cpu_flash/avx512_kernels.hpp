// cpu-flash's AVX-512 tile kernels: the f32 tile products and softmax
// steps on CPUs with AVX-512 (x86-64-v4), and the bf16 tile products on
// CPUs that also have AVX512-BF16 (vdpbf16ps: 16 f32 lanes, each adding two
// products of bf16 pairs, f32 accumulation), with the packing they need.
// Written with GCC's intrinsics under target attributes and chosen at run
// time (avx512_enabled, bf16_dot_enabled), so the library's flags name no
// -march and other CPUs run the portable loops of tile_kernels.hpp.
// Why intrinsics and not a library or the auto-vectorizer:
// docs/decisions/cpu-flash-bf16.md, docs/decisions/cpu-flash-gemm.md.
//
// bf16 layouts. An A operand is bf16 row-major, [M][K], K even. A B operand
// is "pair-major": B[K][N] stored as [K / 2][N] 32-bit words, word (kk, n)
// holding B[2 kk][n] in its low and B[2 kk + 1][n] in its high half (what
// vdpbf16ps multiplies against a broadcast pair of A's row). Every sum runs
// in an order fixed by the tile sizes (products or pairs ascending, one fma
// or vdpbf16ps each), so the bits are the same run to run. Checked through
// tests/cpu/test_cpu_flash_avx512.cpp and tests/cpu/test_cpu_flash.cpp
// (kernels exact on small integers, both paths against the oracle).
#pragma once

#include <cstdint>

namespace gqattn::cpu_flash {

// Whether the CPU has AVX-512 F, BW, DQ and VL (x86-64-v4's AVX-512 set;
// the OS saves zmm state).
bool avx512_supported();
// Whether it also has AVX512-BF16.
bool bf16_dot_supported();
// Whether problems take the AVX-512 kernels (f32 products and softmax steps;
// for bf16 I/O, the vdpbf16ps products where bf16_dot_supported): supported
// and not turned off by set_avx512_kernels (tests compare both paths).
bool avx512_enabled();
bool bf16_dot_enabled();
// Turns the AVX-512 kernels on (where supported) or off, so every problem
// runs the portable path; returns the previous avx512_enabled(). For tests;
// not thread-safe against running calls.
bool set_avx512_kernels(bool on);

// C[M][N] (+)= A[M][K] * B[K][N] in f32, A's element (r, k) at A[r * a_row
// + k * a_col] (a_col = 1: row-major; a_row = 1: A is the transpose of a
// row-major tile, read in place), B row-major (ldb), C row-major (ldc); M a
// multiple of 4, N of 16. accumulate = false starts from 0. Each element
// adds its products k ascending, one fma each: the bits of the portable
// gemm_nn where that one fuses its multiply-adds (its AVX2 and AVX-512
// clones).
void gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_col,
              const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);

// out[r] = sum over c < n of A[r][c] * B[r][c] (row-major, lda and ldb
// floats a row), c ascending, one fma each: gemm_f32's rounding of one
// element, so D = rowsum(dO * O) cancels exactly against dP = dO V^T where
// O equals a row of V (a window of one key).
void row_dots_f32(int64_t rows, int64_t n, const float* A, int64_t lda, const float* B, int64_t ldb,
                  float* out);

// dst[c][r] = src[r][c] for r < rows, c < cols (both multiples of 16).
void transpose_f32(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst,
                   int64_t ldd);

// C[M][N] (+)= A[M][K] * B[K][N], A bf16 row-major (lda in elements), B
// pair-major (ldb in words), C f32 (ldc in floats); M a multiple of 4, N of
// 16, K even. accumulate = false starts from 0. Each element: pairs kk
// ascending, one vdpbf16ps each.
void gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B,
               int64_t ldb, float* C, int64_t ldc, bool accumulate);

// out[r] = sum over c < n of A[r][c] * B[r][c] (n even, ld even, both bf16
// row-major with ld elements a row), pairs ascending, each with the same
// vdpbf16ps gemm_bf16 runs with A's pair as its first operand: the result
// equals gemm_bf16's element (r, j) bit for bit where B's row r equals
// column j of gemm_bf16's B (D = rowsum(dO * O) against dP = dO V^T).
void row_dots_bf16(int64_t rows, int64_t n, const uint16_t* A, const uint16_t* B, int64_t ld,
                   float* out);

// dst[r][c] = bf16(src[r][c]) for r < rows, c < cols: rounded to nearest
// even as float_to_bf16 rounds (subnormals kept, NaN stays NaN), so a tile
// stored through it has the bits the generic store gives.
void round_to_bf16(int64_t rows, int64_t cols, const float* src, int64_t lds, uint16_t* dst,
                   int64_t ldd);

// An A operand (dS) of a tile: dst[r][c] = bf16(src[r][c]), c < cols (a
// multiple of 16), by the instruction's conversion: to nearest even as
// round_to_bf16, but subnormals become zeros (as vdpbf16ps reads them).
void operands_to_bf16(int64_t rows, int64_t cols, const float* src, int64_t lds, uint16_t* dst,
                      int64_t ldd);

// The transposed A operand (P^T, dS^T) of a tile: dst[c][r] = bf16(src[r][c])
// for r < rows, c < cols (a multiple of 16), rounded as operands_to_bf16.
void operands_to_bf16_transposed(int64_t rows, int64_t cols, const float* src, int64_t lds,
                                 uint16_t* dst, int64_t ldd);

// The pair-major B operand of a row-major bf16 tile src[rows][cols]:
// dst[r / 2][c] = src[r][c] | src[r + 1][c] << 16; rows even, cols a
// multiple of 16, ldd in words.
void pair_rows(int64_t rows, int64_t cols, const uint16_t* src, int64_t lds, uint32_t* dst,
               int64_t ldd);

// The pair-major B operand of src^T, for src[rows][cols] bf16 row-major
// (cols even): dst[c / 2][r] = src[r][c] | src[r][c + 1] << 16, i.e. the
// 32-bit words of each row transposed; rows a multiple of 16, lds and ldd
// even / in words.
void transpose_pairs(int64_t rows, int64_t cols, const uint16_t* src, int64_t lds, uint32_t* dst,
                     int64_t ldd);

// The softmax steps on score tiles of 64 columns (the key block),
// vectorized; the portable path keeps its per-row loops (forward.cpp,
// backward.cpp). Row r keeps columns [lo[r], hi[r]] (none when lo > hi).
// Scores are transformed as transform_row does (s * scale, then softcap *
// tanh(s / softcap) when softcap > 0), tanh by a polynomial (absolute error
// about 1.2e-7, the CUDA kernels' for small arguments) where transform_row
// calls std::tanh, and exp is exp_sub's polynomial. Sums over a row run in a fixed order (four
// vectors of 16 added pairwise, then the lanes in a halving tree: i + 8, i + 4,
// i + 2, i + 1).
struct ScoreRows {
  const int64_t* lo;
  const int64_t* hi;
  float scale, softcap;
};

// The online-softmax step of the forward (and of the backward's statistics,
// with O null) on S[rows][64] in place: m_new = max(m, kept s), alpha =
// exp(m - m_new), P = exp(s - m_new) (0 outside the kept columns) into S, l
// = l * alpha + sum P, O's row (o_cols floats, ldo apart) times alpha where
// alpha != 1. Rows keeping nothing get P = 0 and keep their m, l and O.
void softmax_step_f32(int64_t rows, float* S, const ScoreRows& k, float* m, float* l, float* O,
                      int64_t ldo, int64_t o_cols);

// The same step with P rounded to bf16 (as operands_to_bf16) into
// P[rows][64] (P null: not written) instead of S.
void softmax_step_bf16(int64_t rows, float* S, const ScoreRows& k, float* m, float* l, float* O,
                       int64_t ldo, int64_t o_cols, uint16_t* P);

// The backward's P and dS on S[rows][64] (Q K^T) and dP[rows][64] (dO V^T)
// in place: P = exp(s - m) * inv_l where kept, else 0; dS = P * (dP - D) *
// scale, times 1 - tanh^2 under a softcap. Rows keeping nothing get zeros.
void probabilities_and_ds_avx512(int64_t rows, float* S, float* dP, const ScoreRows& k,
                                 const float* m, const float* inv_l, const float* D);

}  // namespace gqattn::cpu_flash
