// cpu-flash's tile kernels: the one GEMM shape every step of the algorithm
// is written in (C = A B or C += A B, row-major f32 tiles), a tile transpose,
// and a vectorizable exp. Each reduction runs in a fixed order that depends
// only on the tile sizes, never on the thread or the CPU's vector width
// choice beyond what the compiled clone fixes, so a result is reproducible
// run to run. Checked through the oracle and determinism tests of
// tests/cpu/test_cpu_flash.cpp.
#pragma once

#include <cstdint>

namespace gqattn::cpu_flash {

// C[M][N] (+)= A[M][K] * B[K][N]; M a multiple of 4, N a multiple of 16;
// leading dimensions in floats. accumulate = false overwrites C.
void gemm_nn(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate);

// out[r] = sum over c < n of A[r][c] * B[r][c], c ascending, for r < rows:
// rounded exactly as gemm_nn rounds one element of its product (the same
// expression in the same clone), so D = rowsum(dO * O) cancels exactly
// against dP = dO V^T where O equals a row of V (a window of one key).
void row_dots(int64_t rows, int64_t n, const float* A, const float* B, int64_t ld, float* out);

// dst[c][r] = src[r][c] for r < rows, c < cols.
void transpose(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd);

// y[x] = exp(x[x] - sub) for n values; an argument below -87 (or -inf) gives
// 0. Relative error about 1e-7 (a degree 7 polynomial of 2^f, |f| <= 1/2).
void exp_sub(int64_t n, const float* x, float sub, float* y);

}  // namespace gqattn::cpu_flash
