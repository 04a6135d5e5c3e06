// Questions CUDA backends ask before running: is there a usable device of a
// given compute capability, does the build have a kernel image for it, and
// do these pointers live on it.
#pragma once

#include <cstddef>
#include <string>

#include "gqattn/types.hpp"

namespace gqattn::cuda {

// "" when the current device exists and has compute capability >= min_major.min_minor.
std::string why_no_device(int min_major, int min_minor);

// "" when this build has a kernel image (SASS for the device, or PTX the
// driver can JIT-compile for it) of `kernel`, a __global__ function's
// address, for the current device; else which device and which
// architectures were built (cudaFuncGetAttributes says
// cudaErrorNoKernelImageForDevice / cudaErrorInvalidDeviceFunction).
std::string why_no_kernel_image(const void* kernel);

// "" when `data` is device-accessible memory of the current device.
std::string why_not_device_pointer(const void* data, const char* name);

struct DeviceProperties {
  int cc_major = 0;
  int cc_minor = 0;
  int multiprocessors = 0;
  int max_grid_y = 0;
  int max_grid_z = 0;
  std::size_t max_shared_per_block_optin = 0;
};
// Properties of the current device, cached per device.
const DeviceProperties& current_device_properties();

// What a fused backend's plan needs of the device. 0 where unknown (no
// usable device): then the plan takes no device-dependent option (no
// split-KV, the smallest tiles) and gives no shared-memory verdict.
struct DeviceLimits {
  int multiprocessors = 0;
  std::size_t smem_per_block = 0;  // the opt-in maximum
};
// The current device's limits if it exists and has compute capability >=
// min_major.min_minor, else unknown.
DeviceLimits current_device_limits(int min_major, int min_minor);

// How many clusters of cluster_ctas CTAs of `kernel` (threads per CTA,
// dynamic shared memory bytes) can be resident at once on the current
// device (cudaOccupancyMaxActiveClusters), cached per device and launch
// shape: persistent cluster kernels size their grid by it on every launch.
// Throws gqattn::Error when none fits.
int max_active_clusters(const void* kernel, int cluster_ctas, int threads, std::size_t smem_bytes);

}  // namespace gqattn::cuda
