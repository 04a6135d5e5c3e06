// cuda-flash: the launchers the backend calls, one per head dimension,
// explicitly instantiated for d in {64, 128, 256} only (launch_*_d*.cu), so
// each head dimension compiles in its own translation unit; a head dim
// between them runs the next one's padded kernels (the plan's head_dim below
// its d). `stream` is a cudaStream_t. Checked through
// tests/gpu/test_flash_*.cpp and tests/gpu/test_padded_head_dims.cpp.
#pragma once

#include <cstdint>

#include "cuda/flash/params.hpp"
#include "cuda/flash/plan.hpp"
#include "cuda/flash/tile_sizes.hpp"

namespace gqattn::flash {

// o, lse (if non-null) from q, k, v, as the plan says.
template <int kD>
void launch_forward(const ForwardPlan& plan, const ForwardParams& params, void* stream);

// dq, dk, dv, as the plan says; params.lse2 / dsum (and for a fused dQ
// dq_accum, for the ordered one dq_counters) point at the plan's workspace.
template <int kD>
void launch_backward(const BackwardPlan& plan, const fused::BackwardParams& params, void* stream);

extern template void launch_forward<64>(const ForwardPlan&, const ForwardParams&, void*);
extern template void launch_forward<128>(const ForwardPlan&, const ForwardParams&, void*);
extern template void launch_forward<256>(const ForwardPlan&, const ForwardParams&, void*);
extern template void launch_backward<64>(const BackwardPlan&, const fused::BackwardParams&, void*);
extern template void launch_backward<128>(const BackwardPlan&, const fused::BackwardParams&, void*);
extern template void launch_backward<256>(const BackwardPlan&, const fused::BackwardParams&, void*);

// The address of one forward kernel (d = 64, bf16, no softcap; defined in
// launch_forward_d64.cu): why_not asks whether the build has a kernel image
// for the device (cuda::why_no_kernel_image).
const void* any_forward_kernel();

// Grid sizes the launchers use (the backend checks them against the limits).
int64_t forward_blocks(int d, int64_t B, int64_t H, int64_t Tq);
int64_t dkdv_blocks(int d, int64_t B, int64_t Hkv, int64_t Tk, DkdvTileSize tile);
int64_t dq_blocks(int d, int64_t B, int64_t H, int64_t Tq);
int64_t preprocess_blocks(int64_t B, int64_t H, int64_t tq_padded);
int64_t dq_postprocess_blocks(int d, int64_t B, int64_t H, int64_t tq_padded);

}  // namespace gqattn::flash
