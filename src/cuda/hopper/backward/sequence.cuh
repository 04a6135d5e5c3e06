// cuda-hopper backward: sequence b of a batch and its workspace rows, per
// kernel variant. The varlen kernels (kVarlen) look the sequence up
// (fused::sequence_of: packed rows, its own mask, its workspace block);
// the dense ones take the batch's, with row offsets 0 known at compile
// time, so their code is what it was before varlen
// (docs/decisions/hopper-varlen-backward.md). Checked by
// tests/gpu/test_hopper_varlen_backward.cpp and, dense,
// tests/gpu/test_hopper_backward.cpp.
#pragma once

#include <cstdint>

#include "cuda/fused/params.hpp"
#include "cuda/fused/sequence.hpp"

namespace gqattn::hopper::bwd {

template <bool kVarlen>
__device__ __forceinline__ fused::Sequence backward_sequence(const fused::BackwardParams& p,
                                                             int b) {
  if constexpr (kVarlen) {
    return fused::sequence_of(p.seq, p.mask, b);
  } else {
    fused::Sequence seq;
    seq.mask = p.mask;
    seq.k_rows = p.mask.tk;
    return seq;
  }
}

// The first workspace row of (b, h): fused::workspace_row without its
// runtime choice.
template <bool kVarlen>
__device__ __forceinline__ int64_t workspace_row(const fused::BackwardParams& p, int b, int h,
                                                 int ws_row0) {
  if constexpr (kVarlen)
    return int64_t(h) * p.varlen_head_rows + ws_row0;
  else
    return (int64_t(b) * p.H + h) * p.tq_padded;
}

}  // namespace gqattn::hopper::bwd
