// The cpu-flash backend: the FlashAttention algorithm on the host
// (forward.cpp, backward.cpp) behind the BackendImpl interface. It runs
// every valid problem whose tensors are in host memory; KV-cache calls append
// in place, then gather each sequence's keys and run the dense forward
// (cpu/kv_cache_gather.hpp). Auto picks it before the mirror for host
// tensors; the mirror ("cpu") stays the parity reference, chosen by name.
// Checked through the public API by tests/cpu/test_cpu_flash.cpp and
// tests/cpu/test_kv_cache.cpp.
#include <string>

#include "api/backend.hpp"
#include "cpu/kv_cache_gather.hpp"
#include "cpu_flash/cpu_flash.hpp"

namespace gqattn::detail {
namespace {

class CpuFlashBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::CpuFlash; }

  std::string why_not(const Problem&, DType, Device device) const override {
    if (device != Device::cpu) return "tensors live on CUDA; cpu-flash needs host memory";
    return "";
  }

  // Varlen batches run sequence by sequence from the checked host offsets.
  bool needs_host_offsets() const override { return true; }
  void forward_kv_cache(const KvCacheArgs& args) const override {
    cpu::kv_cache_forward_by_gather(args, &cpu_flash::forward);
  }

  void forward(const ForwardArgs& args) const override {
    if (args.problem.varlen)
      cpu_flash::varlen_forward(args);
    else
      cpu_flash::forward(args);
  }
  void backward(const BackwardArgs& args) const override {
    if (args.problem.varlen)
      cpu_flash::varlen_backward(args);
    else
      cpu_flash::backward(args);
  }
};

}  // namespace

const BackendImpl* cpu_flash_backend() {
  static const CpuFlashBackend backend;
  return &backend;
}

}  // namespace gqattn::detail
