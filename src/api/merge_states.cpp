// merge_attention_states's rules and dispatch by device; see merge_states.hpp.
#include "api/merge_states.hpp"

#include <string>

#include "api/validate.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/error.hpp"

namespace gqattn {

#ifndef GQATTN_WITH_CUDA
void detail::merge_states_cuda(const MergeArgs&) {
  throw Error("o_a.device = cuda", "this build has no CUDA (nvcc was not found at configure time)");
}
#endif

void merge_attention_states(const TensorRef& o_a, const TensorRef& lse_a, const TensorRef& o_b,
                            const TensorRef& lse_b, const TensorRef& o, const TensorRef& lse,
                            const Options& options) {
  using namespace detail;
  if (o_a.rank != 4)
    throw Error("o_a.rank = " + std::to_string(o_a.rank), "must be 4 ([B, Tq, H, d])");
  // The problem the shapes imply; validate_tensor checks each against it.
  Problem p;
  p.B = o_a.shape[0];
  p.Tq = o_a.shape[1];
  p.H = p.Hkv = o_a.shape[2];
  p.d = o_a.shape[3];
  validate_problem(p);
  validate_tensor(p, Role::o, o_a, o_a.dtype, o_a.device, true, {}, "o_a");
  validate_tensor(p, Role::o, o_b, o_a.dtype, o_a.device, true, {}, "o_b");
  validate_tensor(p, Role::o, o, o_a.dtype, o_a.device, true, {}, "o");
  validate_tensor(p, Role::lse, lse_a, o_a.dtype, o_a.device, true, {}, "lse_a");
  validate_tensor(p, Role::lse, lse_b, o_a.dtype, o_a.device, true, {}, "lse_b");
  validate_tensor(p, Role::lse, lse, o_a.dtype, o_a.device, true, {}, "lse");
  // In place over o_a, lse_a is allowed (each element is read before it is
  // written, by the same thread); any other overlap is not.
  const bool o_in_place = o.data == o_a.data;
  const bool lse_in_place = lse.data == lse_a.data;
  if (o_in_place && (o.stride[0] != o_a.stride[0] || o.stride[1] != o_a.stride[1] ||
                     o.stride[2] != o_a.stride[2]))
    throw Error("o", "may be o_a itself (same strides) or overlap nothing");
  if (lse_in_place && (lse.stride[0] != lse_a.stride[0] || lse.stride[1] != lse_a.stride[1]))
    throw Error("lse", "may be lse_a itself (same strides) or overlap nothing");
  const TensorRef none;
  validate_no_overlap({{"o", &o, true},
                       {"lse", &lse, true},
                       {"o_a", o_in_place ? &none : &o_a, false},
                       {"lse_a", lse_in_place ? &none : &lse_a, false},
                       {"o_b", &o_b, false},
                       {"lse_b", &lse_b, false}});
  const MergeArgs args{o_a, lse_a, o_b, lse_b, o, lse, options.stream};
  if (o_a.device == Device::cpu)
    merge_states_cpu(args);
  else
    merge_states_cuda(args);
}

}  // namespace gqattn
