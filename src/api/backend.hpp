// The interface every backend implements, and the registry dispatch reads.
//
// Dispatch (src/api/dispatch.cpp) validates the arguments once, resolves the
// scale, then asks each backend `why_not`; a backend runs only problems for
// which it answered "". Backends never re-validate what validate.cpp checks.
// A fused backend decides its plan for a call once (its plan.hpp); why_not,
// describe_plan and the pass itself all read that one plan.
#pragma once

#include <string>

#include "gqattn/types.hpp"

namespace gqattn::detail {

// Arguments after validation: shapes agree with the problem, pointers are
// non-null and aligned to their element, and problem.scale holds a value.
struct ForwardArgs {
  Problem problem;
  TensorRef q, k, v, o, lse;  // lse.data may be null (not written)
  Options options;
};

struct BackwardArgs {
  Problem problem;
  TensorRef q, k, v, o, lse, dout, dq, dk, dv;
  Options options;
};

class BackendImpl {
 public:
  virtual ~BackendImpl() = default;
  virtual Backend id() const = 0;
  // "" when this backend can run the problem's forward, else one line saying why not.
  virtual std::string why_not(const Problem& problem, DType dtype, Device device) const = 0;
  // The same for backward; a forward-only backend overrides it.
  virtual std::string why_not_backward(const Problem& problem, DType dtype, Device device) const {
    return why_not(problem, dtype, device);
  }
  // Checks one argument tensor needs beyond validate.cpp's (residency on the
  // device, alignment for wide loads), for the pass it is an argument of (o
  // is an output of forward and an input of backward). Dispatch asks for
  // every tensor of the call, lse included when present. "" when fine.
  virtual std::string why_not_tensor(const TensorRef& tensor, const char* name, Pass pass) const {
    (void)tensor;
    (void)name;
    (void)pass;
    return "";
  }
  // The plan the backend would run `pass` of `problem` with, in one line
  // (explain() shows it): "" for a backend with nothing to choose, or when
  // why_not refuses the problem.
  virtual std::string describe_plan(const Problem& problem, DType dtype, Pass pass,
                                    const Options& options) const {
    (void)problem;
    (void)dtype;
    (void)pass;
    (void)options;
    return "";
  }
  virtual void forward(const ForwardArgs& args) const = 0;
  virtual void backward(const BackwardArgs& args) const = 0;
};

// Each returns the backend's singleton, or nullptr when it is not compiled in
// (then `reason` says why). Defined in the backend's own folder, or in
// registry.cpp when the backend is not built.
const BackendImpl* cpu_backend();
const BackendImpl* cuda_unfused_backend(std::string* reason);
const BackendImpl* cuda_flash_backend(std::string* reason);
const BackendImpl* cuda_hopper_backend(std::string* reason);

const BackendImpl* find_backend(Backend backend, std::string* reason);

}  // namespace gqattn::detail
