// nvml_energy.hpp: the GPU's energy counter (NVML's
// nvmlDeviceGetTotalEnergyConsumption, millijoules since the driver loaded,
// Volta and later) for gqattn_bench, so that a pass's energy per FLOP is
// the counter's difference over its timed calls rather than an average of
// instantaneous power samples. NVML is opened with dlopen at run time: the
// bench neither links it nor needs its header, and where the library, the
// GPU or the counter is missing, `available()` is false and the bench
// prints no energy. Checked by running the bench on the GPU machine.
//
// The counter advances in steps the driver chooses; a span of a second or
// more (thousands of calls at T16k's 3 ms, or --repeats accordingly) is
// what the reading is good for, not a 30-call burst.
#pragma once

#include <dlfcn.h>

#include <cstdint>

namespace gqattn_bench {

class EnergyCounter {
 public:
  // pci_bus_id: the CUDA device's, as cudaDeviceGetPCIBusId writes it.
  explicit EnergyCounter(const char* pci_bus_id) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    const auto init = reinterpret_cast<Return (*)()>(dlsym(lib_, "nvmlInit_v2"));
    const auto by_bus = reinterpret_cast<Return (*)(const char*, Device*)>(
        dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    energy_ = reinterpret_cast<Return (*)(Device, unsigned long long*)>(
        dlsym(lib_, "nvmlDeviceGetTotalEnergyConsumption"));
    shutdown_ = reinterpret_cast<Return (*)()>(dlsym(lib_, "nvmlShutdown"));
    if (init == nullptr || by_bus == nullptr || energy_ == nullptr || shutdown_ == nullptr) return;
    if (init() != kSuccess) return;
    initialised_ = true;
    unsigned long long probe = 0;
    ok_ = by_bus(pci_bus_id, &device_) == kSuccess && energy_(device_, &probe) == kSuccess;
  }
  ~EnergyCounter() {
    if (initialised_) shutdown_();
    if (lib_ != nullptr) dlclose(lib_);
  }
  EnergyCounter(const EnergyCounter&) = delete;
  EnergyCounter& operator=(const EnergyCounter&) = delete;

  bool available() const { return ok_; }

  // Millijoules since the driver loaded; false if the read fails.
  bool read_mj(std::uint64_t& mj) const {
    unsigned long long v = 0;
    if (!ok_ || energy_(device_, &v) != kSuccess) return false;
    mj = v;
    return true;
  }

 private:
  // NVML's ABI as its header declares it: nvmlReturn_t is an enum whose
  // NVML_SUCCESS is 0, nvmlDevice_t an opaque pointer.
  using Return = int;
  using Device = struct DeviceOpaque*;
  static constexpr Return kSuccess = 0;

  void* lib_ = nullptr;
  bool initialised_ = false;
  bool ok_ = false;
  Device device_ = nullptr;
  Return (*energy_)(Device, unsigned long long*) = nullptr;
  Return (*shutdown_)() = nullptr;
};

}  // namespace gqattn_bench
