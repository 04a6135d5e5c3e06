// cuda-flash: the forward kernels for head dimension 256 (bf16, f16; with and
// without softcap), in their own translation unit for a parallel build.
// Checked through tests/gpu/test_flash_*.cpp.
#include "cuda/flash/launch_forward.cuh"

namespace gqattn::flash {
template void launch_forward<256>(const ForwardPlan&, const ForwardParams&, void*);
}  // namespace gqattn::flash
