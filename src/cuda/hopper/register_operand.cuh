// cuda-hopper: a K-major operand tile in shared memory (as the TMA writes it,
// with the 128-byte swizzle) read into wgmma's register A fragments, for a
// GEMM whose A operand stays the same over a whole walk of key tiles: read
// once by ldmatrix instead of by every wgmma from shared memory (an SS
// m64n64k16 reads 4 KB there per 32 clocks of tensor work, all of the SM's
// 128 bytes per clock; an RS one only B's 2 KB). Users: the forward's Q
// (kQInRegisters, consumer.cuh) and the backward dQ kernel's Q and dO
// (kBwdDqOperandsInRegisters, backward_dq_kernel.cuh). The addresses come
// from operand_layout.hpp, which tests/cpu/test_hopper_operand_layout.cpp
// checks on the CPU by simulating ldmatrix on the swizzled layout.
#pragma once

#include <cstdint>

#include "cuda/flash/mma.cuh"
#include "cuda/hopper/operand_layout.hpp"

namespace gqattn::hopper {

// k-steps kk = 0 .. kSteps - 1 (columns 16 kk .. 16 kk + 15) of this warp's
// 16 rows of the warpgroup's 64-row part of a K-major tile whose column
// blocks hold kRows rows; wg_tile is the address of the warpgroup's first
// row in the tile's first column block.
template <int kRows, int kSteps>
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[kSteps][4], uint32_t wg_tile,
                                                 int warp, int lane) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    flash::ldsm_x4(a[kk], wg_tile + a_fragment_ldmatrix_offset(kk, warp, lane, kRows));
}

}  // namespace gqattn::hopper
