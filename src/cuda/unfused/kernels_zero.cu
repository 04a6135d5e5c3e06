// zero_rows: writes +0 over rows of a [1, T, heads, d] tensor through its
// strides, one thread per element. cuda-unfused's varlen path uses it for
// the dk, dv rows of keys that no query of their sequence reads (past
// seqused_k, or of a sequence without queries), which the per-sequence
// kernels never visit. +0 is what the kernels store for a key no query
// keeps. Checked by tests/gpu/test_varlen.cpp (NaN-poisoned outputs).
#include "cuda/common/cuda_check.hpp"
#include "cuda/unfused/kernels_common.cuh"

namespace gqattn::cuda::unfused {
namespace {

template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    zero_rows(T* base, RowStrides stride, int64_t rows, int64_t heads, int64_t d) {
  const int64_t elements = rows * heads * d;
  for (int64_t e = first_row(); e < elements; e += row_step()) {
    const int64_t x = e % d, h = (e / d) % heads, r = e / (d * heads);
    at(base, stride, 0, r, h)[x] = store_as<T>(0.0f);
  }
}

}  // namespace

void launch_zero_rows(const ZeroRows& zero, const Launch& launch) {
  const int64_t elements = zero.rows * zero.heads * zero.d;
  if (elements == 0) return;  // a grid of no blocks is a launch error
  with_element_type(zero.dtype, [&](auto tag) {
    using T = decltype(tag);
    zero_rows<T><<<grid_blocks(elements, launch), kThreadsPerBlock, 0, launch.stream>>>(
        static_cast<T*>(zero.t.data), zero.t.stride, zero.rows, zero.heads, zero.d);
    check_launch("zero_rows");
  });
}

}  // namespace gqattn::cuda::unfused
