// cuda-hopper: stmatrix (PTX ISA "stmatrix", sm_90): the warp stores four
// 8 x 8 matrices of 16-bit elements into shared memory, lane l giving the
// address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned) and each
// thread t holding, in register m, the pair of row t / 4, columns 2 (t % 4)
// and + 1 of matrix m. Every lane of the warp must execute it.
// Checked by tests/cpu/test_hopper_operand_layout.cpp (the addresses its
// callers compute) and the forward and backward GPU tests (staged_store.cuh
// stage_rows, epilogue.cuh store_output_by_warp_chunks).
#pragma once

#include <cstdint>

namespace gqattn::hopper::ptx {

__device__ __forceinline__ void stmatrix_x4(uint32_t row_addr, uint32_t m0, uint32_t m1,
                                            uint32_t m2, uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(row_addr),
               "r"(m0), "r"(m1), "r"(m2), "r"(m3)
               : "memory");
}

}  // namespace gqattn::hopper::ptx
