// cuda-flash: the forward kernels for head dimension 64 (bf16, f16; with and
// without softcap), in their own translation unit for a parallel build.
// Checked through tests/gpu/test_flash_*.cpp.
#include "cuda/flash/launch_forward.cuh"

namespace gqattn::flash {
template void launch_forward<64>(const ForwardPlan&, const ForwardParams&, void*);

// An instance launch_forward<64> already compiles.
const void* any_forward_kernel() {
  return reinterpret_cast<const void*>(forward_kernel<64, __nv_bfloat16, fused::ScoreMode::plain>);
}
}  // namespace gqattn::flash
