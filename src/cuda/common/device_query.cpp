// CUDA device queries for `gqattn info` and the backends' why_not checks.
#include "cuda/common/device_query.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/common/cuda_check.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/error.hpp"

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

std::string why_no_kernel_image(const void* kernel) {
  cudaFuncAttributes attributes{};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, kernel);
  if (status == cudaSuccess) return "";
  (void)cudaGetLastError();  // returned as the reason instead
  const DeviceProperties& device = current_device_properties();
  return "this build has no kernel image for sm_" + std::to_string(device.cc_major) +
         std::to_string(device.cc_minor) +
         " (built for " GQATTN_CUDA_ARCHS "): " + cudaGetErrorString(status);
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

int max_active_clusters(const void* kernel, int cluster_ctas, int threads, std::size_t smem_bytes) {
  using Key = std::tuple<int, const void*, int, int, std::size_t>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const Key key{device, kernel, cluster_ctas, threads, smem_bytes};
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = unsigned(cluster_ctas);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(cluster_ctas));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem_bytes;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  check(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config),
        "cudaOccupancyMaxActiveClusters");
  if (clusters <= 0)
    throw Error("cuda", "no cluster of " + std::to_string(cluster_ctas) +
                            " CTAs of the kernel fits on the device");
  cache.emplace(key, clusters);
  return clusters;
}

DeviceLimits current_device_limits(int min_major, int min_minor) {
  DeviceLimits limits;
  if (!why_no_device(min_major, min_minor).empty()) return limits;
  const DeviceProperties& props = current_device_properties();
  limits.multiprocessors = props.multiprocessors;
  limits.smem_per_block = props.max_shared_per_block_optin;
  return limits;
}

}  // namespace cuda
}  // namespace gqattn
