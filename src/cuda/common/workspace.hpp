// Per-call device workspace of the CUDA backends: an allocation ordered on
// the caller's stream (StreamWorkspace), taken from a memory pool of the
// library's own per device that keeps up to kRetainedWorkspaceBytes of freed
// workspace across synchronisations. The device's default pool, which the
// library used before, keeps nothing (its release threshold is 0), so every
// call after a synchronisation mapped its workspace afresh; changing that
// pool's attributes would change every other user of it in the process.
// gqattn::release_workspace_memory() trims the library's pools to nothing.
// Checked by tests/gpu/test_workspace.cpp (backward results bitwise equal
// with the workspace reused and mapped afresh), by every GPU test of the
// three backends that allocate through it, and on the GPU by
// `gqattn_bench --release-workspace` (an A/B of the time it saves).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gqattn::cuda {

// Freed workspace each library pool keeps mapped across synchronisations.
// The largest linear workspace of the fused backends at the standard shapes
// of docs/performance.md is ~0.3 GB (cuda-hopper's fused-dQ f32 accumulator,
// B*H*Tq*d floats: 268 MB where B*Tq = 16384, H = 32, d = 128), so 1 GiB
// keeps it with room to spare. cuda-unfused's quadratic P workspace is
// mostly larger: what a pool holds above the threshold still goes back to
// the driver at the next synchronisation.
constexpr std::uint64_t kRetainedWorkspaceBytes = std::uint64_t(1) << 30;

// The library's pool of `device`, created on first use (thread-safe);
// nullptr where the device has no stream-ordered allocator
// (cudaDevAttrMemoryPoolsSupported == 0). Pools live as long as the process.
cudaMemPool_t workspace_pool(int device);

// Trims every library pool created so far to 0 bytes: all freed workspace
// whose free the host has observed (by a synchronisation) goes back to the
// driver. Backs gqattn::release_workspace_memory().
void trim_workspace_pools();

// A device allocation of `bytes` ordered on `stream`, from the library pool
// of the current device: usable by work queued on `stream` after the
// constructor, freed (cudaFreeAsync) after the work queued before the
// destructor ran, without a host synchronisation. Devices without
// stream-ordered allocation get cudaMalloc and a synchronising free
// instead. Aligned to at least 256 bytes (every CUDA allocator is). Throws
// gqattn::Error naming "workspace" when the allocation fails.
class StreamWorkspace {
 public:
  StreamWorkspace(std::size_t bytes, cudaStream_t stream);
  ~StreamWorkspace();
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;

  void* data() const { return data_; }
  float* floats() const { return static_cast<float*>(data_); }

 private:
  cudaStream_t stream_;
  void* data_ = nullptr;
  bool async_ = true;
};

}  // namespace gqattn::cuda
