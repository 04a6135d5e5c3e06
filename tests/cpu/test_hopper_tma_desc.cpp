// cuda-hopper's TMA alignment rule (src/cuda/hopper/tma_desc.hpp
// why_not_tma), without a GPU: dense [B, T, heads, d] tensors and a varlen
// batch's packed [total, heads, d] ones are judged on the strides of every
// dimension but d (contiguous). Built where the CUDA backends are.
#ifdef GQATTN_HAS_CUDA_HOPPER
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cuda/hopper/tma_desc.hpp"

namespace {

using gqattn::Device;
using gqattn::DType;
using gqattn::TensorRef;

// A 256-byte aligned address: never dereferenced.
void* const kAligned = reinterpret_cast<void*>(std::uintptr_t{1} << 20);

TEST(HopperTmaDesc, DenseAndPackedContiguousTensorsPass) {
  EXPECT_EQ(gqattn::hopper::why_not_tma(
                gqattn::contiguous(kAligned, DType::bf16, Device::cuda, 2, 100, 8, 128), "q"),
            "");
  // Packed varlen q [total, heads, d]: d's stride 1 is not asked about.
  EXPECT_EQ(gqattn::hopper::why_not_tma(
                gqattn::contiguous(kAligned, DType::bf16, Device::cuda, 1000, 8, 128), "q"),
            "");
  EXPECT_EQ(gqattn::hopper::why_not_tma(
                gqattn::contiguous(kAligned, DType::f16, Device::cuda, 3, 1, 64), "k"),
            "");
}

TEST(HopperTmaDesc, PackedRowStrideOffSixteenBytesIsRefused) {
  TensorRef k = gqattn::contiguous(kAligned, DType::bf16, Device::cuda, 1000, 2, 64);
  k.stride[0] = 2 * 64 + 4;  // rows 264 bytes apart
  const std::string why = gqattn::hopper::why_not_tma(k, "k");
  EXPECT_NE(why.find("k.stride[0]"), std::string::npos) << why;
}

}  // namespace
#endif  // GQATTN_HAS_CUDA_HOPPER
