// cuda-hopper: thin wrappers over the warpgroup MMA control instructions
// (wgmma.fence / commit_group / wait_group), the shared-memory matrix
// descriptor, and the register pinning the compiler needs around them. The
// MMA instructions themselves are in wgmma_ops.cuh. Checked by compiling for
// sm_90a and by tests/gpu/test_hopper_forward.cpp.
//
// Accumulator fragment of wgmma m64nNk16 (PTX ISA "Register fragments and
// shared memory matrix layouts", WGMMA D): warp w of the warpgroup owns rows
// 16w..16w+15; inside the warp, per n8 block i, with g = lane / 4 and
// t = lane % 4: d[i][0], d[i][1] at (g, 8i + 2t..2t+1), d[i][2], d[i][3] at
// (g + 8, same columns) — the m16n8 C fragment of mma.sync repeated along N,
// so the flash helpers that work on C fragments (mask, softmax) apply as is.
// The 16-bit A fragment from registers is the m16n8k16 A fragment: an f32
// accumulator's n8 blocks 2k and 2k+1, packed to 16 bits, are k-step k's A.
#pragma once

#include <cstdint>

namespace gqattn::hopper::ptx {

// Orders register accesses before the next wgmma.mma_async (every accumulator
// or A register written by ordinary instructions must be fenced).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// Closes the group of wgmma.mma_async issued since the previous commit.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins every register of an accumulator at this point of the program: the
// compiler may not move a read or write of them across it. Used right after
// wgmma_wait (else the compiler, which sees the asm of the MMA as the only
// writer, could read the registers before the hardware has written them) and
// right before issuing MMAs on registers it just computed.
template <int kRows, int kCols>
__device__ __forceinline__ void pin(float (&r)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
}
template <int kRows, int kCols>
__device__ __forceinline__ void pin(uint32_t (&r)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"):
// bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4,
// 32-45 stride-dimension byte offset >> 4, 49-51 base offset (0: every
// swizzled tile starts on a 1024-byte boundary), 62-63 swizzle mode.
constexpr uint64_t kDescSwizzle128B = 1;  // field value of the 128-byte swizzle
constexpr int kDescAddressMask = 0x3FFFF;
constexpr int kDescFieldShift = 4;  // every field counts 16-byte units
constexpr int kDescLboBit = 16;
constexpr int kDescSboBit = 32;
constexpr int kDescSwizzleBit = 62;

__device__ __forceinline__ uint64_t make_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                    uint32_t sbo_bytes) {
  const auto field = [](uint32_t x) { return uint64_t((x & kDescAddressMask) >> kDescFieldShift); };
  return field(smem_addr) | field(lbo_bytes) << kDescLboBit | field(sbo_bytes) << kDescSboBit |
         kDescSwizzle128B << kDescSwizzleBit;
}

// The descriptor of the tile `bytes` (a multiple of 16) past the one `desc`
// describes, by one add: the start address is the low field, and shared
// memory addresses (< 2^18, so the field stays below 2^14) never carry out
// of it. Lets a GEMM's k-steps share one make_desc_sw128 instead of
// rebuilding every descriptor from its address.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> kDescFieldShift);
}

}  // namespace gqattn::hopper::ptx
