// The CUDA backends' workspace allocator: one memory pool of the library's
// own per device (release threshold kRetainedWorkspaceBytes, see
// workspace.hpp for why), StreamWorkspace on top of it, and
// gqattn::release_workspace_memory(). Checked by tests/gpu/test_workspace.cpp
// and by every GPU test of the backends that allocate through it.
#include "cuda/common/workspace.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "cuda/common/cuda_check.hpp"
#include "gqattn/attention.hpp"

namespace gqattn {
namespace cuda {
namespace {

struct DevicePool {
  bool queried = false;  // memory-pool support known, pool created if supported
  cudaMemPool_t pool = nullptr;
};

struct Pools {
  std::mutex mutex;
  std::vector<DevicePool> devices;  // indexed by device ordinal
};

// Never destroyed: the pools live as long as the process. Destroying them
// at static destruction could run after the CUDA runtime has torn the
// context down, which is undefined; the driver reclaims everything at exit.
// The registry itself is leaked for the same reason (no destructor runs).
Pools& pools() {
  static Pools* const registry = new Pools;
  return *registry;
}

// Reports a failed CUDA call by throwing; the error is cleared first so a
// later launch check does not mistake it for its own.
void fail(cudaError_t status, const char* what) {
  (void)cudaGetLastError();
  check(status, what);
}

cudaMemPool_t create_pool(int device) {
  cudaMemPoolProps props{};  // zero: no export handles, default maximum size
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  const cudaError_t created = cudaMemPoolCreate(&pool, &props);
  if (created != cudaSuccess) fail(created, "cudaMemPoolCreate(workspace)");
  std::uint64_t threshold = kRetainedWorkspaceBytes;  // the attribute is a cuuint64_t
  const cudaError_t set =
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (set != cudaSuccess) {
    (void)cudaMemPoolDestroy(pool);  // empty: nothing was allocated from it
    fail(set, "cudaMemPoolSetAttribute(workspace, release threshold)");
  }
  return pool;
}

}  // namespace

cudaMemPool_t workspace_pool(int device) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mutex);
  if (all.devices.size() <= std::size_t(device)) all.devices.resize(std::size_t(device) + 1);
  DevicePool& slot = all.devices[std::size_t(device)];
  if (!slot.queried) {
    int supported = 0;
    check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device),
          "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)");
    // A failed creation throws with slot.queried still false: the next
    // call tries again.
    if (supported != 0) slot.pool = create_pool(device);
    slot.queried = true;
  }
  return slot.pool;
}

void trim_workspace_pools() {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mutex);
  for (const DevicePool& slot : all.devices)
    if (slot.pool != nullptr)
      check(cudaMemPoolTrimTo(slot.pool, 0), "cudaMemPoolTrimTo(workspace)");
}

StreamWorkspace::StreamWorkspace(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes == 0) return;  // nothing to allocate; data() is null
  int device = 0;
  GQATTN_CUDA_CHECK(cudaGetDevice(&device));
  const cudaMemPool_t pool = workspace_pool(device);
  async_ = pool != nullptr;
  const cudaError_t status =
      async_ ? cudaMallocFromPoolAsync(&data_, bytes, pool, stream_) : cudaMalloc(&data_, bytes);
  if (status != cudaSuccess) {
    data_ = nullptr;
    fail(status, async_ ? "cudaMallocFromPoolAsync(workspace)" : "cudaMalloc(workspace)");
  }
}

StreamWorkspace::~StreamWorkspace() {
  if (data_ == nullptr) return;
  // A destructor cannot throw; a stream broken enough to fail here has
  // already failed a launch check, which is the error the caller sees.
  if (async_) {
    (void)cudaFreeAsync(data_, stream_);
  } else {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaFree(data_);
  }
}

}  // namespace cuda

void release_workspace_memory() { cuda::trim_workspace_pools(); }

}  // namespace gqattn
