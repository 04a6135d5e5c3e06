// cuda-flash: the backward kernels for head dimension 64 (bf16, f16; with and
// without softcap), in their own translation unit for a parallel build.
// Checked through tests/gpu/test_flash_*.cpp.
#include "cuda/flash/launch_backward.cuh"

namespace gqattn::flash {
template void launch_backward<64>(const BackwardPlan&, const fused::BackwardParams&, void*);
}  // namespace gqattn::flash
