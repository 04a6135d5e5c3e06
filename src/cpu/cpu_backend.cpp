// The CPU backend: the f32 mirror of the seed behind the BackendImpl
// interface. It runs every valid problem whose tensors are in host memory.
// Checked through the public API by every test in tests/cpu/
// (test_cpu_backend.cpp covers what it reports).
#include <string>

#include "api/backend.hpp"
#include "cpu/kv_cache_gather.hpp"
#include "cpu/mirror.hpp"

namespace gqattn::detail {
namespace {

class CpuBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::Cpu; }

  std::string why_not(const Problem&, DType, Device device) const override {
    if (device != Device::cpu) return "tensors live on CUDA; the cpu backend needs host memory";
    return "";
  }

  // Varlen batches run sequence by sequence from the checked host offsets.
  bool needs_host_offsets() const override { return true; }
  void forward_kv_cache(const KvCacheArgs& args) const override {
    cpu::kv_cache_forward_by_gather(args, &cpu::mirror_forward);
  }

  void forward(const ForwardArgs& args) const override {
    if (args.problem.varlen)
      cpu::mirror_varlen_forward(args);
    else
      cpu::mirror_forward(args);
  }
  void backward(const BackwardArgs& args) const override {
    if (args.problem.varlen)
      cpu::mirror_varlen_backward(args);
    else
      cpu::mirror_backward(args);
  }
};

}  // namespace

const BackendImpl* cpu_backend() {
  static const CpuBackend backend;
  return &backend;
}

}  // namespace gqattn::detail
