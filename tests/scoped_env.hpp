// ScopedEnv: an environment variable set (or unset) for a scope, for the
// tests of the backends' benchmarking switches (GQATTN_FLASH_DQ,
// GQATTN_HOPPER_DQ). No CUDA; used by CPU and GPU tests alike.
#pragma once

#include <cstdlib>
#include <string>

namespace gqattn::test {

// Sets an environment variable (or unsets it, with value null) for the
// object's lifetime; the previous value is restored afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_old_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  bool had_old_ = false;
  std::string old_;
};

}  // namespace gqattn::test
