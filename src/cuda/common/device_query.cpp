// CUDA device queries for `gqattn info` and the backends' why_not checks.
#include "cuda/common/device_query.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.hpp"
#include "gqattn/attention.hpp"

namespace gqattn {

std::vector<CudaDeviceInfo> cuda_devices(std::string* why_none) {
  std::vector<CudaDeviceInfo> out;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (why_none) *why_none = std::string("no CUDA device: ") + cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    CudaDeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
    info.memory_bytes = prop.totalGlobalMem;
    out.push_back(info);
  }
  if (out.empty() && why_none) *why_none = "no CUDA device visible";
  return out;
}

namespace cuda {

std::string why_no_device(int min_major, int min_minor) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    return std::string("needs a CUDA device, and none is usable (") +
           (status != cudaSuccess ? cudaGetErrorString(status) : "no device") + ")";
  }
  const DeviceProperties& p = current_device_properties();
  if (p.cc_major < min_major || (p.cc_major == min_major && p.cc_minor < min_minor))
    return "needs sm_" + std::to_string(min_major) + std::to_string(min_minor) +
           " or newer, device is sm_" + std::to_string(p.cc_major) + std::to_string(p.cc_minor);
  return "";
}

std::string why_not_device_pointer(const void* data, const char* name) {
  cudaPointerAttributes attr{};
  const cudaError_t status = cudaPointerGetAttributes(&attr, data);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string(name) + ".data is not a CUDA pointer (" + cudaGetErrorString(status) + ")";
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    return std::string(name) + ".data is host memory, but the tensor says device cuda";
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (attr.type == cudaMemoryTypeDevice && attr.device != current)
    return std::string(name) + ".data lives on CUDA device " + std::to_string(attr.device) +
           ", but the current device is " + std::to_string(current);
  return "";
}

const DeviceProperties& current_device_properties() {
  static std::mutex mutex;
  static std::vector<DeviceProperties> cache;
  static std::vector<bool> filled;
  std::lock_guard<std::mutex> lock(mutex);
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (cache.size() <= std::size_t(device)) {
    cache.resize(device + 1);
    filled.resize(device + 1, false);
  }
  if (!filled[device]) {
    DeviceProperties& p = cache[device];
    check(cudaDeviceGetAttribute(&p.cc_major, cudaDevAttrComputeCapabilityMajor, device), "cc");
    check(cudaDeviceGetAttribute(&p.cc_minor, cudaDevAttrComputeCapabilityMinor, device), "cc");
    check(cudaDeviceGetAttribute(&p.multiprocessors, cudaDevAttrMultiProcessorCount, device),
          "cudaDevAttrMultiProcessorCount");
    check(cudaDeviceGetAttribute(&p.max_grid_y, cudaDevAttrMaxGridDimY, device), "grid y");
    check(cudaDeviceGetAttribute(&p.max_grid_z, cudaDevAttrMaxGridDimZ, device), "grid z");
    int smem = 0;
    check(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "smem");
    p.max_shared_per_block_optin = std::size_t(smem);
    filled[device] = true;
  }
  return cache[device];
}

}  // namespace cuda
}  // namespace gqattn
