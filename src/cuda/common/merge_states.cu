// merge_attention_states on CUDA tensors (api/merge_states.hpp): one warp per
// (b, i, h) row, lanes over d, in f32. Checked by tests/gpu/test_merge_states.cpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "api/merge_states.hpp"
#include "cuda/common/cuda_check.hpp"

namespace gqattn::detail {
namespace {

struct Strides4 {
  int64_t s0, s1, s2;
};
struct Strides3 {
  int64_t s0, s1, s2;
};

template <class T>
__device__ float to_float(T x);
template <>
__device__ float to_float(float x) {
  return x;
}
template <>
__device__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ float to_float(__half x) {
  return __half2float(x);
}
template <class T>
__device__ T from_float(float x);
template <>
__device__ float from_float(float x) {
  return x;
}
template <>
__device__ __nv_bfloat16 from_float(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __half from_float(float x) {
  return __float2half(x);
}

template <class T>
__global__ void merge_kernel(const T* o_a, Strides4 sa, const float* lse_a, Strides3 la,
                             const T* o_b, Strides4 sb, const float* lse_b, Strides3 lb, T* o,
                             Strides4 so, float* lse, Strides3 lo, int64_t B, int64_t Tq, int64_t H,
                             int64_t d) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= B * Tq * H) return;
  const int64_t h = row % H, i = row / H % Tq, b = row / (H * Tq);
  const float xa = lse_a[b * la.s0 + h * la.s1 + i * la.s2];
  const float xb = lse_b[b * lb.s0 + h * lb.s1 + i * lb.s2];
  const float m = fmaxf(xa, xb);
  const bool none = m == -INFINITY;
  const float wa = none ? 0.0f : expf(xa - m), wb = none ? 0.0f : expf(xb - m);
  const float inv = none ? 0.0f : 1.0f / (wa + wb);
  const T* pa = o_a + b * sa.s0 + i * sa.s1 + h * sa.s2;
  const T* pb = o_b + b * sb.s0 + i * sb.s1 + h * sb.s2;
  T* po = o + b * so.s0 + i * so.s1 + h * so.s2;
  for (int64_t c = lane; c < d; c += 32) {
    const float v = none ? 0.0f : (wa * to_float(pa[c]) + wb * to_float(pb[c])) * inv;
    po[c] = from_float<T>(v);
  }
  // Every lane read lse before lane 0 writes it (in place over lse_a).
  __syncwarp();
  if (lane == 0) lse[b * lo.s0 + h * lo.s1 + i * lo.s2] = none ? -INFINITY : m + logf(wa + wb);
}

Strides4 s4(const TensorRef& t) { return {t.stride[0], t.stride[1], t.stride[2]}; }
Strides3 s3(const TensorRef& t) { return {t.stride[0], t.stride[1], t.stride[2]}; }

template <class T>
void launch(const MergeArgs& a) {
  const int64_t B = a.o.shape[0], Tq = a.o.shape[1], H = a.o.shape[2], d = a.o.shape[3];
  const int64_t rows = B * Tq * H;
  if (rows == 0) return;
  const int threads = 256;
  const int64_t blocks = (rows * 32 + threads - 1) / threads;
  if (blocks > 2147483647LL) throw Error("o", "not supported: too many rows for one launch");
  merge_kernel<T><<<unsigned(blocks), threads, 0, static_cast<cudaStream_t>(a.stream)>>>(
      static_cast<const T*>(a.o_a.data), s4(a.o_a), static_cast<const float*>(a.lse_a.data),
      s3(a.lse_a), static_cast<const T*>(a.o_b.data), s4(a.o_b),
      static_cast<const float*>(a.lse_b.data), s3(a.lse_b), static_cast<T*>(a.o.data), s4(a.o),
      static_cast<float*>(a.lse.data), s3(a.lse), B, Tq, H, d);
  cuda::check_launch("merge_attention_states");
}

}  // namespace

void merge_states_cuda(const MergeArgs& a) {
  switch (a.o.dtype) {
    case DType::f32: launch<float>(a); break;
    case DType::bf16: launch<__nv_bfloat16>(a); break;
    case DType::f16: launch<__half>(a); break;
  }
}

}  // namespace gqattn::detail
