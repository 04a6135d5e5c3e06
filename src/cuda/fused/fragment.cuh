// Thin wrappers over the sm80 warp-level tensor-core and shared memory
// instructions (mma.sync m16n8k16, ldmatrix; 16-bit packing from
// common/element.cuh) and the register fragment layout they imply, for
// cuda-flash's kernels and cuda-hopper's register-side work. Checked through
// the kernels' tests against the f64 oracle (tests/gpu/test_flash_*.cpp).
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4; every fragment register holds two 16-bit
// values, the lower column in the low half:
//   A (16 x 16, row-major): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16 x 8, "col"):      b0 (k 2t..2t+1, n g)  b1 (k 2t+8..2t+9, n g)
//   C (16 x 8, f32):        c0, c1 (g, 2t..2t+1)  c2, c3 (g+8, 2t..2t+1)
// Two adjacent n8 C tiles, packed to 16 bits, are exactly one k16 A fragment
// (a0 = tile0 c0c1, a1 = tile0 c2c3, a2 = tile1 c0c1, a3 = tile1 c2c3): this is
// how P (and dS) go from an accumulator to the A operand of the next GEMM
// without touching shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/element.cuh"

namespace gqattn::fused {

constexpr int kWarpSize = 32;
constexpr int kMmaM = 16;                    // rows of one mma tile
constexpr int kMmaN = 8;                     // columns of one mma tile
constexpr int kMmaK = 16;                    // reduction depth of one mma
constexpr int kFragRowHalf = 8;              // a C fragment's second row is g + 8
constexpr unsigned kFullWarp = 0xffffffffu;  // every lane takes part in a shuffle

// Lane coordinates inside a fragment.
__device__ __forceinline__ int frag_row(int lane) { return lane >> 2; }       // g
__device__ __forceinline__ int frag_col(int lane) { return (lane & 3) * 2; }  // 2t

// Returns x, hiding from the compiler that it is the same value on every
// loop iteration. Used on the lane / thread index at the top of the main
// loops: otherwise every swizzled shared-memory address and every global
// row offset derived from it is hoisted out of the loop and held in a
// register (dozens of them), which pushes the accumulators into spills.
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// c += a * b on one m16n8k16 tile, f32 accumulation.
template <typename Elem>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16-bit packing, the conversion common/element.cuh defines for every
// backend.
using gqattn::cuda::pack2;

// The A fragment of k-step `kk` of P (or dS) from the f32 accumulator tiles
// 2kk and 2kk+1 of the same 16 rows (see the layout note above).
template <typename Elem>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4]) {
  a[0] = pack2<Elem>(lo[0], lo[1]);
  a[1] = pack2<Elem>(lo[2], lo[3]);
  a[2] = pack2<Elem>(hi[0], hi[1]);
  a[3] = pack2<Elem>(hi[2], hi[3]);
}

// Four 8x8 16-bit matrices from shared memory; lanes 8i..8i+7 give the row
// addresses of matrix i, register i receives matrix i.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// As ldsm_x4, each matrix transposed (for B operands stored [k][n]).
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 2^x on the special function unit (ex2.approx: about 2 ulp; 2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Max and sum over the four lanes of a quad (the lanes sharing a row g).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullWarp, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFullWarp, x, 1);
  return x + __shfl_xor_sync(kFullWarp, x, 2);
}

}  // namespace gqattn::fused
