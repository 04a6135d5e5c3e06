// Device-side I/O element types, the one home of every bf16 / f16
// conversion of the CUDA backends: one value loaded as f32 or stored from
// f32 (load_f32, store_as: cuda-unfused, the softmax's rounding
// compensation), two values packed in one register (pack2, to_float2: the
// fused kernels' fragments and 16-byte chunks), and the host switch from
// gqattn::DType to the matching CUDA type. Loads are exact (every bf16/f16
// value is an f32 value); stores round to nearest even, the rounding of
// gqattn::float_to_bf16 / float_to_f16 on the host, so a kernel and the CPU
// backend that compute the same f32 produce the same output bits.
// Checked by tests/gpu/ (bf16 and f16 results compared with the CPU backend
// and the f64 oracle).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "gqattn/error.hpp"
#include "gqattn/types.hpp"

namespace gqattn::cuda {

__device__ __forceinline__ float load_f32(float x) { return x; }
__device__ __forceinline__ float load_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float load_f32(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T store_as(float x);
template <>
__device__ __forceinline__ float store_as<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 store_as<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half store_as<__half>(float x) {
  return __float2half_rn(x);
}

// Two floats rounded to nearest even into one register of two 16-bit values
// (`lo` in the low half, i.e. the lower column): one cvt for the pair.
template <typename Elem>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The two 16-bit values of one register as floats (x the low half): load_f32
// on each.
template <typename Elem>
__device__ __forceinline__ float2 to_float2(uint32_t packed) {
  static_assert(sizeof(Elem) == 2, "two 16-bit values per register");
  Elem x[2];
  memcpy(x, &packed, sizeof(x));
  return make_float2(load_f32(x[0]), load_f32(x[1]));
}

// Calls f(T{}) with T the CUDA element type of `dtype`; kernels template on
// the element type only, so this is the one place the three instantiations
// are chosen.
template <class F>
void with_element_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::f16: f(__half{}); return;
  }
  throw Error("dtype", "unknown element type " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace gqattn::cuda
