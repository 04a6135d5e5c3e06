// cuda-flash: where element (row, col) of the fused-dQ f32 accumulator
// [B*H, tq_padded, d] lives (the dK/dV kernel adds into it, the postprocess
// reads it back), as plain integer functions (host and device), checked on
// the CPU by tests/cpu/test_flash_dq_accum_layout.cpp and through the
// ordered- and atomic-dQ GPU tests.
//
// Fragment-major layout: the rows are cut into blocks of 16 rows x 8
// columns (the C fragment of one m16n8 mma), blocks stored row-major over
// (row / 16, col / 8), and inside a block lane l's four values of the
// fragment (rows g, g + 8, columns 2t, 2t + 1; g = l / 4, t = l % 4) are
// the 16 bytes at 4 l (lane-major; below sm90 a switch can make it
// value-major, DqBlockOrder). A warp then adds one fragment with one 16-byte
// reduction per lane over 512 contiguous bytes (4 cache lines), where the
// row-major layout needs two 8-byte reductions per lane over 8 rows, i.e.
// 8 lines per instruction (FlashAttention-2 likewise keeps its dQ
// accumulator in the order its threads add, not row-major).
//
// Invariant: every index in [0, rows * d) is reached by exactly one (row,
// col) with row < rows, a multiple of 16 (tq_padded is a multiple of the
// dK/dV query tile), and d a multiple of 8.
#pragma once

#include <cstdint>

#include "cuda/fused/host_device.hpp"

namespace gqattn::flash {

// Measured on the H200 (2026-12-01, one call, interleaved builds, bwd
// TFLOP/s, fragment-major / row-major, ordered dQ): d128 causal B4 T4k 287
// / 265, B1 T16k 312 / 284, non-causal B4 T4k 293 / 267, causal B16 T1k
// 229 / 219, window 1024 241 / 228, softcap 30 256 / 251; d64 255 / 240;
// d256 240 / 209; atomic likewise (T16k 314 / 286). Set to false for the
// row-major accumulator and two 8-byte reductions per lane and fragment.
constexpr bool kDqAccumFragmentMajor = true;

constexpr int kDqBlockRows = 16;  // m16 of mma.m16n8k16
constexpr int kDqBlockCols = 8;   // n8
constexpr int kDqBlockFloats = kDqBlockRows * kDqBlockCols;
constexpr int kDqLaneFloats = 4;  // a C fragment's values per lane

// Index of the first float of the 16 x 8 block whose top-left element is
// (row0, col0), both multiples of the block's sides, in rows of d floats.
GQATTN_HD constexpr int64_t dq_accum_block_offset(int64_t row0, int col0, int d) {
  return row0 * d + int64_t(col0 / kDqBlockCols) * kDqBlockFloats;
}

// The order inside a block. Lane-major: lane l's four values at 4 l (one
// 16-byte reduction per lane; sm90's red.global.add.v4.f32). Value-major:
// value v of every lane at 32 v + l, so each of a lane's four 4-byte
// reductions is one warp-wide instruction over one full 128-byte line
// (FlashAttention-2's order for its scalar atomics), for GPUs without
// vector float reductions.
enum class DqBlockOrder { kLaneMajor, kValueMajor };

// Below sm90 (no red.v4.f32): value-major when true, else lane-major with
// four scalar reductions per lane over 4 lines per instruction. An A/B
// switch, not measured yet (`scripts/h200-ab --preset sm80-ptx` times the
// sm80 code on the H200 through the driver's JIT).
constexpr bool kDqValueMajorBelowSm90 = false;

// The order of the code being compiled: lane-major on the host (tests) and
// on sm90; per kDqValueMajorBelowSm90 in a device pass below sm90. The
// kernel and the postprocess are compiled in the same pass, so they agree.
GQATTN_HD constexpr DqBlockOrder dq_block_order() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return kDqValueMajorBelowSm90 ? DqBlockOrder::kValueMajor : DqBlockOrder::kLaneMajor;
#else
  return DqBlockOrder::kLaneMajor;
#endif
}

constexpr int kDqBlockLanes = 32;  // the lanes of a warp, one C fragment

// Index of value v (0..3) of lane `lane`'s C fragment inside a block.
template <DqBlockOrder kOrder>
GQATTN_HD constexpr int dq_accum_in_block(int lane, int v) {
  return kOrder == DqBlockOrder::kLaneMajor ? lane * kDqLaneFloats + v : v * kDqBlockLanes + lane;
}

// Index of element (row, col): the definition the two functions above
// implement for C fragments.
template <DqBlockOrder kOrder>
GQATTN_HD constexpr int64_t dq_accum_offset(int64_t row, int col, int d) {
  const int r = int(row % kDqBlockRows), c = col % kDqBlockCols;
  const int lane = (r % 8) * 4 + c / 2;  // g = r mod 8, t = c / 2
  const int v = (r / 8) * 2 + c % 2;     // second row half: values 2, 3
  return dq_accum_block_offset(row - r, col - c, d) + dq_accum_in_block<kOrder>(lane, v);
}

}  // namespace gqattn::flash
