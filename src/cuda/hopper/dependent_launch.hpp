// cuda-hopper: launching a kernel by programmatic dependent launch, the host
// side of ptx/grid_dependency.cuh. With `overlap` the kernel may be
// scheduled while the previous kernel on the stream still runs (once every
// CTA of that one has executed launch_dependents or exited), and must call
// wait_on_prerequisites before it reads what that kernel writes; without, it
// is an ordinary stream-ordered launch. Used for the split-KV combine
// (forward/launch.cuh) and the fused dQ's conversion
// (backward/launch.cuh). Checked through
// tests/gpu/test_hopper_forward.cpp, test_hopper_backward.cpp and
// test_graph_capture.cpp (the graph keeps the programmatic edge).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common/cuda_check.hpp"

namespace gqattn::hopper {

template <typename Params>
void launch_dependent(void (*kernel)(Params), unsigned grid, unsigned threads,
                      std::size_t smem_bytes, cudaStream_t stream, bool overlap,
                      const Params& params) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = overlap ? 1 : 0;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  GQATTN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
}

}  // namespace gqattn::hopper
