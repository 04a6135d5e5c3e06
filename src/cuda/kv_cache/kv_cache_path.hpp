// The fused KV-cache path, host side: what cuda-flash and cuda-hopper answer
// for a KV-cache call (forward_with_kv_cache). Both run the same kernels
// (attend_kernel.cuh, on mma.sync), chosen for decoding, which reads far
// more bytes than it computes (docs/decisions/kv-cache-kernel.md). The
// int32 vectors are read on the device, never on the host (the kernels
// clamp them), so a call needs no synchronisation and can be captured in a
// CUDA graph. Checked by tests/gpu/test_kv_cache.cpp and, the plan, by
// tests/cpu/test_kv_cache_plan.cpp.
#pragma once

#include <string>

#include "api/backend.hpp"
#include "gqattn/types.hpp"

namespace gqattn::kv_cache {

// "" when the path runs problem p (Problem::kv_cache) for `backend` (the
// name in the reasons) on the current device; else why not.
std::string why_not(const char* backend, const Problem& p, DType dtype, Device device);

// The rule of the cache's tensors and the new keys (16-byte aligned rows for
// cp.async and the append's copies); "" for every other name.
std::string why_not_cache_tensor(const TensorRef& t, const char* name);

std::string describe_plan(const Problem& p, const Options& options);

void forward(const detail::KvCacheArgs& args);

}  // namespace gqattn::kv_cache
