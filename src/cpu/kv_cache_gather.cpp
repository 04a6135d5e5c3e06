// The host backends' KV-cache forward (the mirror's and cpu-flash's): the new
// keys and values written into the cache in place, then sequence by
// sequence its keys gathered from the cache (dense rows or pages) into one
// contiguous [1, keys, Hkv, d] buffer of the I/O dtype and the backend's
// dense forward run over it: a sequence's result is the dense problem of its
// own keys, whatever the batch. Checked against the f64 oracle over an
// independently gathered cache by tests/cpu/test_kv_cache.cpp, on both
// backends.
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cpu/kv_cache_gather.hpp"
#include "cpu/mirror.hpp"
#include "gqattn/dtype.hpp"

namespace gqattn::cpu {
namespace {

char* element(const TensorRef& t, int64_t i0, int64_t i1, int64_t i2) {
  return static_cast<char*>(t.data) +
         element_offset(t, i0, i1, i2) * static_cast<int64_t>(dtype_size(t.dtype));
}

}  // namespace

void kv_cache_forward_by_gather(const detail::KvCacheArgs& a,
                                void (*dense_forward)(const detail::ForwardArgs&)) {
  const detail::HostKvCache& h = *a.host;
  const Problem& p = a.problem;
  const KvCache& cache = a.cache;
  const int64_t t_new = a.k_new.data ? a.k_new.shape[1] : 0;
  const int64_t row_bytes = p.d * static_cast<int64_t>(dtype_size(a.q.dtype));
  // Where key position `pos` of sequence b lives in the cache: (i0, i1).
  auto cache_slot = [&](int64_t b, int64_t pos) -> std::pair<int64_t, int64_t> {
    if (p.kv_page_size > 0)
      return {h.block_table[b * cache.pages_per_seq + pos / p.kv_page_size], pos % p.kv_page_size};
    return {h.batch_idx.empty() ? b : h.batch_idx[b], pos};
  };

  // Scratch first: a failed allocation leaves the cache and outputs untouched.
  std::vector<char> k_rows(static_cast<std::size_t>(p.Tk * p.Hkv * row_bytes));
  std::vector<char> v_rows(k_rows.size());

  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t t = 0; t < t_new; ++t) {
      const auto [i0, i1] = cache_slot(b, h.seqlens[b] + t);
      for (int64_t hk = 0; hk < p.Hkv; ++hk) {
        std::memcpy(element(cache.k, i0, i1, hk), element(a.k_new, b, t, hk), row_bytes);
        std::memcpy(element(cache.v, i0, i1, hk), element(a.v_new, b, t, hk), row_bytes);
      }
    }

  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t keys = h.seqlens[b] + t_new;
    detail::ForwardArgs one;
    one.problem = p;
    one.problem.kv_cache = false;
    one.problem.kv_page_size = 0;
    one.problem.B = 1;
    one.problem.Tk = keys;
    one.options = a.options;
    auto batch_row = [b](TensorRef t) {  // batch b of a [B, ...] tensor as a batch of one
      t.data =
          static_cast<char*>(t.data) + b * t.stride[0] * static_cast<int64_t>(dtype_size(t.dtype));
      t.shape[0] = 1;
      return t;
    };
    one.q = batch_row(a.q);
    one.o = batch_row(a.o);
    if (a.lse.data != nullptr) one.lse = batch_row(a.lse);
    if (keys == 0) {  // no key: o = 0, lse = -inf
      const std::vector<float> zeros(static_cast<std::size_t>(p.d), 0.0f);
      for (int64_t i = 0; i < p.Tq; ++i)
        for (int64_t hq = 0; hq < p.H; ++hq)
          store_floats(one.o, element_offset(one.o, 0, i, hq), p.d, zeros.data());
      if (one.lse.data != nullptr)
        for (int64_t hq = 0; hq < p.H; ++hq)
          for (int64_t i = 0; i < p.Tq; ++i)
            store_from_float(one.lse.data, DType::f32,
                             hq * one.lse.stride[1] + i * one.lse.stride[2],
                             -std::numeric_limits<float>::infinity());
      continue;
    }
    for (int64_t pos = 0; pos < keys; ++pos) {
      const auto [i0, i1] = cache_slot(b, pos);
      for (int64_t hk = 0; hk < p.Hkv; ++hk) {
        const std::size_t at = static_cast<std::size_t>((pos * p.Hkv + hk) * row_bytes);
        std::memcpy(&k_rows[at], element(cache.k, i0, i1, hk), row_bytes);
        std::memcpy(&v_rows[at], element(cache.v, i0, i1, hk), row_bytes);
      }
    }
    one.k = contiguous(k_rows.data(), a.q.dtype, Device::cpu, 1, keys, p.Hkv, p.d);
    one.v = contiguous(v_rows.data(), a.q.dtype, Device::cpu, 1, keys, p.Hkv, p.d);
    dense_forward(one);
  }
}

}  // namespace gqattn::cpu
