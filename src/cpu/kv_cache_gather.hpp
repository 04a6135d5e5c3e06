// The host backends' KV-cache forward (kv_cache_gather.cpp): append in place,
// then per sequence a gather of its keys and the backend's dense forward.
// Checked by tests/cpu/test_kv_cache.cpp on the mirror and cpu-flash.
#pragma once

#include "api/backend.hpp"

namespace gqattn::cpu {

// args.host holds the checked host copy of the cache's int32 vectors.
void kv_cache_forward_by_gather(const detail::KvCacheArgs& args,
                                void (*dense_forward)(const detail::ForwardArgs&));

}  // namespace gqattn::cpu
