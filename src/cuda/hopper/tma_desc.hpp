// cuda-hopper: host side of TMA: the tensor maps (CUtensorMap) of q, k, v,
// encoded by cuTensorMapEncodeTiled, which is looked up through the runtime
// (cudaGetDriverEntryPointByVersion), so the library never links libcuda.
// Checked by tests/gpu/test_hopper_forward.cpp (padded strides, partial
// tiles) and test_hopper_support (the alignment refusal).
#pragma once

#include <cuda.h>

#include <string>

#include "gqattn/types.hpp"

namespace gqattn::hopper {

// "" when TMA can read `t` ([B, T, heads, d], or a varlen batch's packed
// [total, heads, d], 16-bit): data 16-byte aligned and the stride of every
// dimension but d that is longer than 1 a multiple of 16 bytes; otherwise
// why not, naming the tensor.
std::string why_not_tma(const TensorRef& t, const char* name);

// The map of `t` over dimensions (d, heads, T, B), innermost first, with
// boxes of 64 columns x `box_heads` heads x `box_rows` rows x 1 batch,
// 128-byte swizzle, zeros out of bounds. A box lands in shared memory as
// box_rows x box_heads rows of 64 columns, the heads of a row innermost
// (packed GQA, pack_gqa.hpp). Throws gqattn::Error if the driver refuses.
CUtensorMap make_tile_map(const TensorRef& t, int box_rows, const char* name, int box_heads = 1);

}  // namespace gqattn::hopper
