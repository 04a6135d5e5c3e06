// Validation of every public argument, in one place, before anything runs.
// Each failed rule throws gqattn::Error naming the argument and the rule.
#pragma once

#include "gqattn/types.hpp"

namespace gqattn::detail {

// Problem fields alone (sizes, H % Hkv, window, softcap, scale).
void validate_problem(const Problem& problem);

// One tensor against the shape the problem implies. `required` false allows
// data == nullptr (forward's optional lse).
enum class Role { q, k, v, o, lse, dout, dq, dk, dv };
const char* role_name(Role role);
void validate_tensor(const Problem& problem, Role role, const TensorRef& t, DType io_dtype,
                     Device device, bool required = true);

}  // namespace gqattn::detail
