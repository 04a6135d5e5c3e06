// Error checks for CUDA runtime calls and launches. A failed call throws
// gqattn::Error naming the call, so no CUDA error is ever swallowed.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "gqattn/error.hpp"

namespace gqattn::cuda {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(what, std::string("CUDA error ") + cudaGetErrorName(status) + ": " +
                          cudaGetErrorString(status));
}

// After a kernel launch: launch-configuration errors surface here.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace gqattn::cuda

#define GQATTN_CUDA_CHECK(call) ::gqattn::cuda::check((call), #call)
