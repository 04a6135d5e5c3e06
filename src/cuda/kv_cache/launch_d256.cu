// The fused KV-cache path's kernels for head dimension 256 (bf16, f16; with
// and without softcap; warps over rows or keys), in their own translation
// unit for a parallel build. Checked through tests/gpu/test_kv_cache.cpp.
#include "cuda/kv_cache/launch.cuh"

namespace gqattn::kv_cache {
template void launch<256>(const Plan&, const Params&, fused::ElemType, void*);
template int resident_ctas_per_sm<256>(int, bool, fused::ElemType);
}  // namespace gqattn::kv_cache
