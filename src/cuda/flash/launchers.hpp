// cuda-flash: the launchers the backend calls, one per head dimension,
// explicitly instantiated for d in {64, 128, 256} only (launch_*_d*.cu), so
// each head dimension compiles in its own translation unit. `stream` is a
// cudaStream_t. Checked through tests/gpu/test_flash_*.cpp.
#pragma once

#include <cstdint>

#include "cuda/flash/params.hpp"
#include "cuda/flash/tile_sizes.hpp"

namespace gqattn::flash {

// o, lse (if non-null) from q, k, v.
template <int kD>
void launch_forward(const ForwardParams& params, fused::ElemType elem, void* stream);

// dq, dk, dv; params.lse2 / dsum must point at a workspace of
// 2 * B * H * tq_padded floats' worth (see BackwardParams).
// tile: dkdv_tile_for_device (tile_sizes.hpp) for this device, or the test
// switch; clamped to the sizes d has. With a kFusedDqOnly tile params.dq_accum
// must be set (ordered or atomic dQ).
template <int kD>
void launch_backward(const fused::BackwardParams& params, fused::ElemType elem, DkdvTileSize tile,
                     void* stream);

extern template void launch_forward<64>(const ForwardParams&, fused::ElemType, void*);
extern template void launch_forward<128>(const ForwardParams&, fused::ElemType, void*);
extern template void launch_forward<256>(const ForwardParams&, fused::ElemType, void*);
extern template void launch_backward<64>(const fused::BackwardParams&, fused::ElemType,
                                         DkdvTileSize, void*);
extern template void launch_backward<128>(const fused::BackwardParams&, fused::ElemType,
                                          DkdvTileSize, void*);
extern template void launch_backward<256>(const fused::BackwardParams&, fused::ElemType,
                                          DkdvTileSize, void*);

// Grid sizes the launchers use (the backend checks them against the limits).
int64_t forward_blocks(int d, int64_t B, int64_t H, int64_t Tq);
int64_t dkdv_blocks(int d, int64_t B, int64_t Hkv, int64_t Tk, DkdvTileSize tile);
int64_t dq_blocks(int d, int64_t B, int64_t H, int64_t Tq);
int64_t preprocess_blocks(int64_t B, int64_t H, int64_t tq_padded);
int64_t dq_postprocess_blocks(int d, int64_t B, int64_t H, int64_t tq_padded);

}  // namespace gqattn::flash
