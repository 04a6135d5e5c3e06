// merge_attention_states: two partial results over disjoint key sets merged
// by their lse (include/gqattn/attention.hpp). The rules are checked in
// api/merge_states.cpp; the host loop is src/cpu/merge_states.cpp, the CUDA
// kernel src/cuda/common/merge_states.cu. Both compute, per row and head,
// m = max(lse_a, lse_b), w_x = exp(lse_x - m), o = (w_a o_a + w_b o_b) /
// (w_a + w_b), lse = m + log(w_a + w_b), in f32, and o = 0, lse = -inf when
// both lse are -inf.
#pragma once

#include "gqattn/types.hpp"

namespace gqattn::detail {

struct MergeArgs {
  TensorRef o_a, lse_a, o_b, lse_b, o, lse;  // validated: [B, Tq, H, d] and [B, H, Tq]
  void* stream = nullptr;
};

void merge_states_cpu(const MergeArgs& args);
// Defined in src/cuda/common/merge_states.cu; throws without CUDA.
void merge_states_cuda(const MergeArgs& args);

}  // namespace gqattn::detail
