// Build configuration, and the CUDA device list and workspace release when
// CUDA is not compiled in.
#include <string>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/version.hpp"

#ifdef GQATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gqattn {

#ifndef GQATTN_WITH_CUDA
std::vector<CudaDeviceInfo> cuda_devices(std::string* why_none) {
  if (why_none) *why_none = "this build has no CUDA (nvcc was not found at configure time)";
  return {};
}

// Without CUDA there is no workspace pool (src/cuda/common/workspace.cpp).
void release_workspace_memory() {}
#endif

BuildInfo build_info() {
  BuildInfo info;
  info.version = GQATTN_VERSION_STRING;
#ifdef GQATTN_WITH_CUDA
  info.cuda_compiled = true;
  info.cuda_architectures = GQATTN_CUDA_ARCHS;
  info.cuda_runtime =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
#endif
  return info;
}

}  // namespace gqattn
