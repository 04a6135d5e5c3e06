// Device helpers the cuda-unfused kernels share: row decoding, the kept
// ranges of the mask, the seed's dot product, and the grid-stride loop.
// Float arithmetic goes through __fmaf_rn / __fmul_rn / __fadd_rn /
// __fsub_rn / __fdiv_rn so nvcc's -fmad contraction cannot fuse a multiply
// and an add that the CPU mirror (std::fmaf, no contraction) keeps apart.
// Checked against the CPU backend by tests/gpu/test_cuda_unfused.cpp.
#pragma once

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/unfused/unfused.hpp"

namespace gqattn::cuda::unfused {

// Output dims a thread accumulates at once, in registers. A row of d floats
// cannot live in registers for a runtime d, so outputs are produced in chunks
// of this many dims, each chunk repeating the row's loop over keys (or
// queries) in the same order: every output element still sums its terms in
// the seed's order, and no f32 workspace or atomic is needed.
constexpr int kChunk = 32;

// exp, tanh and log of an f32, correctly rounded (evaluated in f64, rounded
// once; wrong only within an f64 ulp of an f32 rounding boundary). CUDA's
// expf/tanhf/logf are within 2 ulp, while glibc's expf and logf, which the
// CPU mirror calls, are correctly rounded on all but ~1e-4 of inputs: this
// way P, lse and the softcap agree with the mirror bit for bit almost always
// and sit closest to the f64 oracle. (glibc before 2.41 rounds tanhf wrongly
// on ~3% of inputs, an ulp; see the softcap tolerance in the GPU tests.)
__device__ __forceinline__ float exp_rn(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}
__device__ __forceinline__ float tanh_rn(float x) {
  return static_cast<float>(tanh(static_cast<double>(x)));
}
__device__ __forceinline__ float log_rn(float x) {
  return static_cast<float>(log(static_cast<double>(x)));
}

// Grid-stride loop bounds: any number of rows, whatever the grid size.
__device__ __forceinline__ int64_t first_row() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t row_step() { return int64_t(gridDim.x) * blockDim.x; }

// Query row `row` of [B, H, Tq] (the order of P's rows and of D).
struct QueryRow {
  int64_t b, h, i;
};
__device__ __forceinline__ QueryRow query_row(const Shape& s, int64_t row) {
  const int64_t bh = row / s.Tq;
  return {bh / s.H, bh % s.H, row % s.Tq};
}

// KV row `row` of [B, Hkv, Tk].
struct KvRow {
  int64_t b, hkv, j;
};
__device__ __forceinline__ KvRow kv_row(const Shape& s, int64_t row) {
  const int64_t bh = row / s.Tk;
  return {bh / s.Hkv, bh % s.Hkv, row % s.Tk};
}

// [first, last], empty when first > last.
struct Range {
  int64_t first, last;
};

// The keys query i keeps: the seed's [jmin, jmax], query i at position
// i + off (Problem::query_start(): q_start, or Tk - Tq; the only place the
// kernels place queries among keys). Signed, so a causal query before
// every key, or a window past the last, gets an empty range.
__device__ __forceinline__ Range kept_keys(const Shape& s, int64_t i) {
  const int64_t pos = i + s.off;
  const int64_t last = s.causal ? min(pos, s.Tk - 1) : s.Tk - 1;
  const int64_t first = s.window > 0 ? max(pos - s.window + 1, int64_t{0}) : 0;
  return {first, last};
}

// The queries that keep key j (j <= i + off when causal, j >= i + off -
// window + 1 with a window): kept_keys inverted. Outside it P is 0, which
// the seed's dkv loop skips, so visiting only this range changes no bit.
__device__ __forceinline__ Range queries_keeping(const Shape& s, int64_t j) {
  const int64_t first = s.causal ? max(j - s.off, int64_t{0}) : 0;
  const int64_t last = s.window > 0 ? min(j - s.off + s.window - 1, s.Tq - 1) : s.Tq - 1;
  return {first, last};
}

// The seed's dot product: s = fma(a[x], b[x], s) from s = 0, x ascending.
template <class T>
__device__ __forceinline__ float fma_dot(const T* a, const T* b, int64_t n) {
  float s = 0.0f;
  for (int64_t x = 0; x < n; ++x) s = __fmaf_rn(load_f32(a[x]), load_f32(b[x]), s);
  return s;
}

// Pointer to element [b][t][head][0] of a [B, T, heads, d] tensor.
template <class T>
__device__ __forceinline__ T* at(T* base, const RowStrides& s, int64_t b, int64_t t, int64_t head) {
  return base + b * s.b + t * s.t + head * s.h;
}

__device__ __forceinline__ void zero(float (&acc)[kChunk]) {
#pragma unroll
  for (int c = 0; c < kChunk; ++c) acc[c] = 0.0f;
}

// acc[c] = fma(w, x[c], acc[c]) for the chunk's first `width` dims.
template <class T>
__device__ __forceinline__ void fma_chunk(float (&acc)[kChunk], float w, const T* x, int width) {
#pragma unroll
  for (int c = 0; c < kChunk; ++c)
    if (c < width) acc[c] = __fmaf_rn(w, load_f32(x[c]), acc[c]);
}

template <class T>
__device__ __forceinline__ void store_chunk(T* dst, const float (&acc)[kChunk], int width) {
#pragma unroll
  for (int c = 0; c < kChunk; ++c)
    if (c < width) dst[c] = store_as<T>(acc[c]);
}

// Dims in the chunk starting at d0.
__device__ __forceinline__ int chunk_width(const Shape& s, int64_t d0) {
  return static_cast<int>(min(int64_t{kChunk}, s.d - d0));
}

// The seed's dS for one kept (i, j) with P_ij = prob:
// prob * (dp - D_i) * scale, times 1 - tanh^2 of the forward's tanh argument
// (the raw dot recomputed, then * scale / softcap) when capped.
template <class T>
__device__ __forceinline__ float seed_ds(const Shape& s, float prob, float dp, float row_dot,
                                         const T* q, const T* k) {
  float ds = __fmul_rn(__fmul_rn(prob, __fsub_rn(dp, row_dot)), s.scale);
  if (s.softcap > 0.0f) {
    const float raw = fma_dot(q, k, s.d);
    const float t = tanh_rn(__fdiv_rn(__fmul_rn(raw, s.scale), s.softcap));
    ds = __fmul_rn(ds, __fsub_rn(1.0f, __fmul_rn(t, t)));
  }
  return ds;
}

// Blocks for `rows` threads, at most launch.max_blocks.
inline unsigned int grid_blocks(int64_t rows, const Launch& launch) {
  const int64_t wanted = (rows + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned int>(wanted < launch.max_blocks ? wanted : launch.max_blocks);
}

}  // namespace gqattn::cuda::unfused
