// cuda-hopper: the forward kernels for head dimension 128 (bf16, f16; with and
// without softcap; the 128 x 128 tile and, with kWideNonCausalD128, the
// non-causal 128 x 176 tile: 8 kernels, 6 with kWideSoftcapD128 off), in
// their own translation unit for a parallel build. Checked through
// tests/gpu/test_hopper_forward.cpp.
#include "cuda/hopper/forward/launch.cuh"

namespace gqattn::hopper {
template void launch_forward<128>(const ForwardParams&, ElemType, void*);
}  // namespace gqattn::hopper
