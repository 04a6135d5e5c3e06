// Which backends this build contains. A backend that is not compiled in is
// registered here as absent, with the reason; compiled ones define their
// accessor in their own folder (CMake sets GQATTN_HAS_<BACKEND>).
#include <string>

#include "api/backend.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/error.hpp"

namespace gqattn::detail {

#ifndef GQATTN_WITH_CUDA
constexpr const char* kNoCuda =
    "not compiled in: this build has no CUDA (nvcc was not found at configure time)";
#endif

#ifndef GQATTN_HAS_CUDA_UNFUSED
const BackendImpl* cuda_unfused_backend(std::string* reason) {
#ifdef GQATTN_WITH_CUDA
  if (reason)
    *reason = "not compiled in: this build leaves it out (GQATTN_CUDA_BACKENDS has no unfused)";
#else
  if (reason) *reason = kNoCuda;
#endif
  return nullptr;
}
#endif

#ifndef GQATTN_HAS_CUDA_FLASH
const BackendImpl* cuda_flash_backend(std::string* reason) {
#ifdef GQATTN_WITH_CUDA
  if (reason)
    *reason = "not compiled in: this build leaves it out (GQATTN_CUDA_BACKENDS has no flash)";
#else
  if (reason) *reason = kNoCuda;
#endif
  return nullptr;
}
#endif

#ifndef GQATTN_HAS_CUDA_HOPPER
const BackendImpl* cuda_hopper_backend(std::string* reason) {
#ifdef GQATTN_WITH_CUDA
  if (reason)
    *reason = "not compiled in: this build leaves it out (GQATTN_CUDA_BACKENDS has no hopper)";
#else
  if (reason) *reason = kNoCuda;
#endif
  return nullptr;
}
#endif

const BackendImpl* find_backend(Backend backend, std::string* reason) {
  switch (backend) {
    case Backend::Cpu: return cpu_backend();
    case Backend::CpuFlash: return cpu_flash_backend();
    case Backend::CudaUnfused: return cuda_unfused_backend(reason);
    case Backend::CudaFlash: return cuda_flash_backend(reason);
    case Backend::CudaHopper: return cuda_hopper_backend(reason);
    case Backend::Auto: break;
  }
  if (reason) *reason = "Auto is not a concrete backend";
  return nullptr;
}

}  // namespace gqattn::detail
