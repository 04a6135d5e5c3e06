// The fused KV-cache path's append kernel (append_kernel.cuh), launched in
// its own translation unit: one kernel for every head dim and element type
// (it moves 16-byte chunks). Checked through tests/gpu/test_kv_cache.cpp.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/cuda_check.hpp"
#include "cuda/kv_cache/append_kernel.cuh"
#include "cuda/kv_cache/launchers.hpp"

namespace gqattn::kv_cache {

void launch_append(const Params& p, void* stream) {
  const int64_t chunks = int64_t(p.B) * p.t_new * p.Hkv * (p.head_dim / fused::kElemsPerChunk);
  if (chunks == 0) return;  // a grid of no blocks is a launch error
  // A grid-stride loop: a bounded grid covers any count.
  const int64_t blocks = std::min<int64_t>((chunks + kAppendThreads - 1) / kAppendThreads, 65536);
  append_kernel<<<unsigned(blocks), kAppendThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  cuda::check_launch("kv-cache append_kernel");
}

}  // namespace gqattn::kv_cache
