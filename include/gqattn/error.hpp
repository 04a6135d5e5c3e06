// gqattn's one error type. Every message names the argument and the rule it
// broke, e.g. "gqattn: H = 6: must be a multiple of Hkv = 4". Validation runs
// before anything is written, so a thrown Error leaves all outputs untouched.
#pragma once

#include <stdexcept>
#include <string>

namespace gqattn {

class Error : public std::runtime_error {
 public:
  Error(std::string argument, const std::string& rule)
      : std::runtime_error("gqattn: " + argument + ": " + rule),
        argument_(std::move(argument)),
        rule_(rule) {}
  // The argument that broke a rule ("H", "q.stride", "backend", ...).
  const std::string& argument() const { return argument_; }
  // The rule it broke ("must be a multiple of Hkv = 4 ...").
  const std::string& rule() const { return rule_; }

 private:
  std::string argument_;
  std::string rule_;
};

}  // namespace gqattn
