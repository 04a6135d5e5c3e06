// cuda-hopper: the launchers the backend calls, one per pass and head
// dimension, explicitly instantiated in forward/launch_d{64,128,256}.cu and
// backward/launch_d{64,128,256}.cu so each compiles in its own translation
// unit. They launch
// what the plan says. `stream` is a cudaStream_t. Checked through
// tests/gpu/test_hopper_forward.cpp.
#pragma once

#include <cstdint>

#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/forward/params.hpp"
#include "cuda/hopper/plan.hpp"

namespace gqattn::hopper {

template <int kD>
void launch_forward(const ForwardPlan& plan, const ForwardParams& params, void* stream);

extern template void launch_forward<64>(const ForwardPlan&, const ForwardParams&, void*);
extern template void launch_forward<128>(const ForwardPlan&, const ForwardParams&, void*);
extern template void launch_forward<256>(const ForwardPlan&, const ForwardParams&, void*);

// The address of one forward kernel (d = 64, bf16, no softcap, no cluster;
// defined in forward/launch_d64.cu): why_not asks whether the build has a
// kernel image for the device (cuda::why_no_kernel_image).
const void* any_forward_kernel();

// dq, dk, dv; params.c.lse2 / dsum (and, for a fused dQ, dq_accum and
// dq_semaphores) point at the plan's workspace.
namespace bwd {
template <int kD>
void launch_backward(const BackwardPlan& plan, const BackwardParams& params, void* stream);

extern template void launch_backward<64>(const BackwardPlan&, const BackwardParams&, void*);
extern template void launch_backward<128>(const BackwardPlan&, const BackwardParams&, void*);
extern template void launch_backward<256>(const BackwardPlan&, const BackwardParams&, void*);
}  // namespace bwd

}  // namespace gqattn::hopper
