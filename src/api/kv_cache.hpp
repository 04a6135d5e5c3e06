// The arguments of forward_with_kv_cache: the cache's shape rules, its int32
// vectors' value rules (when they are read on the host), and the memory
// rule of a call that writes the cache in place. Each failed rule throws
// gqattn::Error naming the argument and the rule, before anything is
// written. Checked by tests/cpu/test_kv_cache.cpp.
#pragma once

#include "api/backend.hpp"
#include "gqattn/types.hpp"

namespace gqattn::detail {

// Everything but the values of the int32 vectors. Returns T_new (0 without
// new keys).
int64_t validate_kv_cache_call(const Problem& problem, const KvCache& cache, const TensorRef& q,
                               const TensorRef& k_new, const TensorRef& v_new, const TensorRef& o,
                               const TensorRef& lse);

// The int32 vectors copied to the host (a synchronisation with `stream` for
// device memory) and their value rules: 0 <= seqlens[b], seqlens[b] + T_new
// <= the capacity; the pages a sequence uses in [0, num_pages); batch_idx in
// [0, B_cache); no page (or dense cache row) appended to by two sequences.
HostKvCache read_and_check_kv_cache(const Problem& problem, const KvCache& cache, int64_t t_new,
                                    void* stream);

}  // namespace gqattn::detail
