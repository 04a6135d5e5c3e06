// cpu-flash's bf16 tile kernels: the tile products of bf16 problems on CPUs
// with AVX512-BF16 (vdpbf16ps: 16 f32 lanes, each adding two products of
// bf16 pairs, f32 accumulation), and the packing they need. Written with
// GCC's intrinsics under a target attribute and chosen at run time
// (bf16_dot_enabled), so the library's flags name no -march and a CPU
// without the instructions runs the f32 path (tile_kernels.hpp) instead.
// Why intrinsics and not a library: docs/decisions/cpu-flash-bf16.md.
//
// Layouts. An A operand is bf16 row-major, [M][K], K even. A B operand is
// "pair-major": B[K][N] stored as [K / 2][N] 32-bit words, word (kk, n)
// holding B[2 kk][n] in its low and B[2 kk + 1][n] in its high half (what
// vdpbf16ps multiplies against a broadcast pair of A's row). Every sum runs
// in an order fixed by the tile sizes (pairs ascending), so the bits are
// the same run to run. Checked through tests/cpu/test_cpu_flash_bf16.cpp
// (kernels exact on small integers, and the backend against the oracle).
#pragma once

#include <cstdint>

namespace gqattn::cpu_flash {

// Whether the CPU has AVX512-BF16 and AVX512BW (and the OS saves zmm state).
bool bf16_dot_supported();
// Whether bf16 problems take the bf16 tile path: supported and not turned
// off by set_bf16_dot (tests compare both paths).
bool bf16_dot_enabled();
// Turns the bf16 path on (where supported) or off; returns the previous
// bf16_dot_enabled(). For tests; not thread-safe against running calls.
bool set_bf16_dot(bool on);

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

// The softmax steps of the bf16 path on score tiles of 64 columns (the key
// block), vectorized; the f32 path keeps its per-row loops (forward.cpp,
// backward.cpp). Row r keeps columns [lo[r], hi[r]] (none when lo > hi).
// Scores are transformed as transform_row does (s * scale, then softcap *
// tanh(s / softcap) when softcap > 0, tanh by std::tanh as the mirror), and
// exp is exp_sub's polynomial. Sums over a row run in a fixed order (four
// vectors of 16 added pairwise, then the lanes).
struct ScoreRows {
  const int64_t* lo;
  const int64_t* hi;
  float scale, softcap;
};

// The online-softmax step of the forward (and of the backward's statistics,
// with O and P null) on S[rows][64] in place: m_new = max(m, kept s), alpha
// = exp(m - m_new), P = exp(s - m_new) (0 outside the kept columns), l = l *
// alpha + sum P, O's row (o_cols floats, ldo apart) times alpha where alpha
// != 1, and P rounded to bf16 (as operands_to_bf16) into P[rows][64]. Rows
// keeping nothing get P = 0 and keep their m, l and O.
void softmax_step_bf16(int64_t rows, float* S, const ScoreRows& k, float* m, float* l, float* O,
                       int64_t ldo, int64_t o_cols, uint16_t* P);

// The backward's P and dS on S[rows][64] (Q K^T) and dP[rows][64] (dO V^T)
// in place: P = exp(s - m) * inv_l where kept, else 0; dS = P * (dP - D) *
// scale, times 1 - tanh^2 under a softcap. Rows keeping nothing get zeros.
void probabilities_and_ds_bf16(int64_t rows, float* S, float* dP, const ScoreRows& k,
                               const float* m, const float* inv_l, const float* D);

}  // namespace gqattn::cpu_flash
