// cuda-hopper: the forward kernels for head dimension 128 (bf16, f16; with and
// without softcap; the 128 x 128 tile, and the 128 x 176 tile for
// non-causal problems without softcap), in their own translation unit for a
// parallel build. Checked through
// tests/gpu/test_hopper_forward.cpp.
#include "cuda/hopper/forward/launch.cuh"

namespace gqattn::hopper {
template void launch_forward<128>(const ForwardPlan&, const ForwardParams&, void*);
}  // namespace gqattn::hopper
