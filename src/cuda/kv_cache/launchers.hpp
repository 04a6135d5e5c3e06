// The fused KV-cache path's launchers, declared for the host side
// (kv_cache_path.cpp), which compiles with the host compiler. Defined per
// head dimension in launch_d*.cu. Checked through tests/gpu/test_kv_cache.cpp.
#pragma once

#include "cuda/fused/params.hpp"
#include "cuda/kv_cache/params.hpp"
#include "cuda/kv_cache/plan.hpp"

namespace gqattn::kv_cache {

// Appends p's new keys (if any), then attends; `stream` is a cudaStream_t.
// p.o_part / p.lse_part hold plan.workspace_floats when plan.num_splits > 1.
template <int kD>
void launch(const Plan& plan, const Params& p, fused::ElemType elem, void* stream);

// Resident CTAs per SM of the attention kernel of (warps_m, softcap, elem)
// on the current device (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
template <int kD>
int resident_ctas_per_sm(int warps_m, bool softcap, fused::ElemType elem);

// The append alone (append_kernel.cuh), in its own translation unit; launch
// runs it first when p.t_new > 0.
void launch_append(const Params& p, void* stream);

// One attention kernel's address, to ask whether the build has an image of
// it for the device (cuda::why_no_kernel_image).
const void* any_kernel();

}  // namespace gqattn::kv_cache
