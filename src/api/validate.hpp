// Validation of every public argument, in one place, before anything runs.
// Each failed rule throws gqattn::Error naming the argument and the rule.
#pragma once

#include <initializer_list>

#include "gqattn/types.hpp"

namespace gqattn::detail {

// Problem fields alone (sizes, H % Hkv, window, softcap, scale).
void validate_problem(const Problem& problem);

// One tensor against the shape the problem implies. `required` false allows
// data == nullptr (forward's optional lse). A varlen problem's tensors are
// packed: q-like [total_q, H, d], k-like [total_k, Hkv, d], lse [H, total_q],
// with the totals read from q and k (validate q and k first); a packed
// tensor with no element may have data == nullptr.
enum class Role { q, k, v, o, lse, dout, dq, dk, dv };
const char* role_name(Role role);
struct PackedTotals {
  int64_t q = 0, k = 0;
};
// `name` (default: the role's) is what errors call the tensor.
void validate_tensor(const Problem& problem, Role role, const TensorRef& t, DType io_dtype,
                     Device device, bool required = true, const PackedTotals& totals = {},
                     const char* name = nullptr);

// The memory rule across the arguments of one call, after validate_tensor
// passed for each: an output may share no byte with any other argument
// (input or output), so no output aliases an input or another output, even
// partly. Interleaved views of one buffer that share no byte (dq, dk, dv as
// slices of one packed [B, T, H + 2 Hkv, d] gradient) are allowed; deciding
// that takes about one step per pair of neighbouring rows, and past 2^24
// steps the call is refused as overlapping. (Each output's own elements are
// checked not to overlap by validate_tensor.) Addresses are
// compared as numbers, never dereferenced: CUDA device pointers live in one
// address space with the host's (UVA). Tensors with data == nullptr
// (forward's absent lse) are skipped.
struct Argument {
  const char* name;
  const TensorRef* tensor;
  bool output;
};
void validate_no_overlap(std::initializer_list<Argument> arguments);
// The two calls' argument lists.
void validate_forward_memory(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                             const TensorRef& o, const TensorRef& lse);
void validate_backward_memory(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                              const TensorRef& o, const TensorRef& lse, const TensorRef& dout,
                              const TensorRef& dq, const TensorRef& dk, const TensorRef& dv);

}  // namespace gqattn::detail
