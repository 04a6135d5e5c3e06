// cuda-hopper: the forward kernels for head dimension 64 (bf16, f16; with and
// without softcap; the 128 x 128 tile and the 192 x 128 tile
// without softcap), in their own translation unit for a parallel build.
// Checked through tests/gpu/test_hopper_forward.cpp.
#include "cuda/hopper/forward/launch.cuh"

namespace gqattn::hopper {
template void launch_forward<64>(const ForwardPlan&, const ForwardParams&, void*);

// An instance launch_forward<64> already compiles.
const void* any_forward_kernel() {
  return reinterpret_cast<const void*>(
      forward_kernel<ForwardTile<64>, __nv_bfloat16, ScoreMode::plain, 1>);
}
}  // namespace gqattn::hopper
