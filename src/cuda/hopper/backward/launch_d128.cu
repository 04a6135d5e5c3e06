// cuda-hopper: the backward kernels for head dimension 128 (bf16, f16; with and
// without softcap), in their own translation unit for a parallel build.
// Checked through tests/gpu/test_hopper_backward.cpp.
#include "cuda/hopper/backward/launch.cuh"

namespace gqattn::hopper::bwd {
template void launch_backward<128>(const BackwardPlan&, const BackwardParams&, void*);
}  // namespace gqattn::hopper::bwd
