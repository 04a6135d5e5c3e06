// The fused KV-cache path's kernels for head dimension 64 (bf16, f16; with
// and without softcap; warps over rows or keys), in their own translation
// unit for a parallel build. Checked through tests/gpu/test_kv_cache.cpp.
#include "cuda/kv_cache/launch.cuh"

namespace gqattn::kv_cache {
template void launch<64>(const Plan&, const Params&, fused::ElemType, void*);
template int resident_ctas_per_sm<64>(int, bool, fused::ElemType);

const void* any_kernel() {
  return reinterpret_cast<const void*>(attend_kernel<64, __nv_bfloat16, false, 1>);
}
}  // namespace gqattn::kv_cache
