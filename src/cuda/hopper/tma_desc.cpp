// cuda-hopper: host side of TMA (see tma_desc.hpp). Checked by
// tests/gpu/test_hopper_forward.cpp (padded strides, partial tiles, Tq != Tk).
#include "cuda/hopper/tma_desc.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.hpp"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

namespace gqattn::hopper {
namespace {

constexpr std::size_t kTmaAlign = 16;  // global address and stride granularity (bytes)
constexpr int kRank = 4;               // (d, heads, T, B)
// The CUDA version whose ABI of cuTensorMapEncodeTiled we call (12.0).
constexpr unsigned kEntryPointVersion = 12000;

// TensorRef dimensions of [B, T, heads, d].
constexpr int kDimB = 0, kDimT = 1, kDimHead = 2, kDimD = 3;

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    GQATTN_CUDA_CHECK(cudaGetDriverEntryPointByVersion(
        "cuTensorMapEncodeTiled", &ptr, kEntryPointVersion, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw Error("backend",
                  "cuda-hopper: the driver has no cuTensorMapEncodeTiled (needs CUDA 12.0+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// A stride the map may use: the tensor's, except for a dimension of extent 1,
// whose stride is never applied and may be anything (then 16).
cuuint64_t stride_bytes(const TensorRef& t, int dim) {
  if (t.shape[dim] == 1) return kTmaAlign;
  return cuuint64_t(t.stride[dim]) * dtype_size(t.dtype);
}

}  // namespace

std::string why_not_tma(const TensorRef& t, const char* name) {
  if (reinterpret_cast<std::uintptr_t>(t.data) % kTmaAlign != 0)
    return std::string(name) + ".data must be 16-byte aligned for TMA";
  const std::size_t elem = dtype_size(t.dtype);
  for (int i = 0; i + 1 < t.rank; ++i) {  // every dimension but d (contiguous)
    if (t.shape[i] > 1 && (std::size_t(t.stride[i]) * elem) % kTmaAlign != 0)
      return std::string(name) + ".stride[" + std::to_string(i) + "]*" + std::to_string(elem) +
             " bytes must be a multiple of 16 for TMA (stride[" + std::to_string(i) +
             "] = " + std::to_string(t.stride[i]) + ")";
  }
  return "";
}

CUtensorMap make_tile_map(const TensorRef& t, int box_rows, const char* name, int box_heads) {
  CUtensorMap map{};
  const CUtensorMapDataType type =
      t.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // A varlen batch whose sequences have no queries (or keys) has tensors of
  // 0 rows, an extent TMA refuses; no tile then loads or stores a row of
  // them (every sequence's tiles are empty), so 1 row is as good.
  const cuuint64_t rows = cuuint64_t(t.shape[kDimT] > 0 ? t.shape[kDimT] : 1);
  const cuuint64_t dims[kRank] = {cuuint64_t(t.shape[kDimD]), cuuint64_t(t.shape[kDimHead]), rows,
                                  cuuint64_t(t.shape[kDimB])};
  // Strides of dimensions 1..3 (dimension 0 is contiguous).
  const cuuint64_t strides[kRank - 1] = {stride_bytes(t, kDimHead), stride_bytes(t, kDimT),
                                         stride_bytes(t, kDimB)};
  const cuuint32_t box[kRank] = {cuuint32_t(kColBlock), cuuint32_t(box_heads), cuuint32_t(box_rows),
                                 1};
  const cuuint32_t element_strides[kRank] = {1, 1, 1, 1};
  const CUresult status =
      encoder()(&map, type, kRank, t.data, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw Error("backend", std::string("cuda-hopper: cuTensorMapEncodeTiled refused ") + name +
                               " (CUresult " + std::to_string(int(status)) + ")");
  return map;
}

}  // namespace gqattn::hopper
