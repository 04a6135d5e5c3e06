// The tests' handle on cpu-flash's kernel paths: a scope that runs with the
// AVX-512 kernels on (where the CPU has them) or off (the portable loops
// every CPU runs), then restores the setting. Used by test_cpu_flash.cpp and
// test_cpu_flash_avx512.cpp to check both paths on one machine.
#pragma once

#include "cpu_flash/avx512_kernels.hpp"

namespace gqattn::test {

class Avx512Kernels {
 public:
  explicit Avx512Kernels(bool on) : was_(cpu_flash::set_avx512_kernels(on)) {}
  ~Avx512Kernels() { cpu_flash::set_avx512_kernels(was_); }
  Avx512Kernels(const Avx512Kernels&) = delete;
  Avx512Kernels& operator=(const Avx512Kernels&) = delete;

 private:
  bool was_;
};

}  // namespace gqattn::test
