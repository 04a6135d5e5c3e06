// cuda-hopper: the forward launchers the backend calls, one per head
// dimension, explicitly instantiated in launch_forward_d{64,128,256}.cu so
// each head dimension compiles in its own translation unit. `stream` is a
// cudaStream_t. Checked through tests/gpu/test_hopper_forward.cpp.
#pragma once

#include <cstdint>

#include "cuda/hopper/forward/params.hpp"

namespace gqattn::hopper {

template <int kD>
void launch_forward(const ForwardParams& params, ElemType elem, void* stream);

extern template void launch_forward<64>(const ForwardParams&, ElemType, void*);
extern template void launch_forward<128>(const ForwardParams&, ElemType, void*);
extern template void launch_forward<256>(const ForwardParams&, ElemType, void*);

// Work tiles of a forward launch: one per (query tile of block_m rows, head,
// batch).
int64_t forward_blocks(int block_m, int64_t B, int64_t H, int64_t Tq);

}  // namespace gqattn::hopper
