// forward_with_kv_cache's argument rules; see kv_cache.hpp.
#include "api/kv_cache.hpp"

#include <set>
#include <string>
#include <utility>

#include "api/validate.hpp"
#include "api/varlen.hpp"
#include "gqattn/error.hpp"

namespace gqattn::detail {
namespace {

std::string str(int64_t x) { return std::to_string(x); }

std::string shape_of(const TensorRef& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + str(t.shape[i]);
  return s + "]";
}

// The cache tensor's own shape, then the rules of a written tensor.
void validate_cache_tensor(const Problem& p, const char* name, const TensorRef& t,
                           const TensorRef& q) {
  const bool paged = p.kv_page_size > 0;
  const char* dims = paged ? "[num_pages, page_size, Hkv, d]" : "[B_cache, T_cache, Hkv, d]";
  if (t.rank != 4)
    throw Error(std::string(name) + ".rank = " + str(t.rank), std::string("must be 4 ") + dims);
  if (t.shape[0] < 1 || t.shape[1] != (paged ? p.kv_page_size : p.Tk) || t.shape[2] != p.Hkv ||
      t.shape[3] != p.d)
    throw Error(std::string(name) + ".shape = " + shape_of(t),
                std::string("must be ") + dims + " with " +
                    (paged ? "page_size = Problem::kv_page_size = " + str(p.kv_page_size)
                           : "T_cache = Problem::Tk = " + str(p.Tk)) +
                    ", Hkv = " + str(p.Hkv) + ", d = " + str(p.d));
  Problem as_cache = p;
  as_cache.kv_cache = false;
  as_cache.B = t.shape[0];
  as_cache.Tk = t.shape[1];
  // Role::dk: the rules of an output (it is written), under the cache's name.
  validate_tensor(as_cache, Role::dk, t, q.dtype, q.device, true, {}, name);
}

}  // namespace

int64_t validate_kv_cache_call(const Problem& p, const KvCache& cache, const TensorRef& q,
                               const TensorRef& k_new, const TensorRef& v_new, const TensorRef& o,
                               const TensorRef& lse) {
  if (!p.kv_cache)
    throw Error("problem.kv_cache = false", "must be true for forward_with_kv_cache");
  if (p.varlen)
    throw Error("problem.varlen = true", "not supported with a KV cache (use B sequences)");
  if (p.kv_page_size < 0)
    throw Error("problem.kv_page_size = " + str(p.kv_page_size), "must be >= 0 (0 = dense)");
  validate_problem(p);
  validate_tensor(p, Role::q, q, q.dtype, q.device);
  validate_tensor(p, Role::o, o, q.dtype, q.device);
  validate_tensor(p, Role::lse, lse, q.dtype, q.device, /*required=*/false);
  validate_cache_tensor(p, "k_cache", cache.k, q);
  validate_cache_tensor(p, "v_cache", cache.v, q);
  if (cache.k.shape[0] != cache.v.shape[0])
    throw Error("v_cache.shape = " + shape_of(cache.v),
                "must equal k_cache.shape = " + shape_of(cache.k));
  if ((k_new.data == nullptr) != (v_new.data == nullptr))
    throw Error(k_new.data ? "v_new" : "k_new", "new keys and values come together: pass both");
  int64_t t_new = 0;
  if (k_new.data != nullptr) {
    if (k_new.rank != 4 || k_new.shape[1] < 1)
      throw Error("k_new.shape = " + shape_of(k_new), "must be [B, T_new, Hkv, d], T_new >= 1");
    t_new = k_new.shape[1];
    Problem as_new = p;
    as_new.kv_cache = false;
    as_new.Tk = t_new;
    validate_tensor(as_new, Role::k, k_new, q.dtype, q.device, true, {}, "k_new");
    validate_tensor(as_new, Role::v, v_new, q.dtype, q.device, true, {}, "v_new");
    if (t_new > p.Tk)
      throw Error("k_new.shape[1] = " + str(t_new),
                  "must be at most the cache's capacity, Problem::Tk = " + str(p.Tk));
  }
  validate_int32_vector("cache_seqlens", cache.seqlens, p.B, q.device);
  if (p.kv_page_size > 0) {
    if (cache.pages_per_seq < 1 || cache.pages_per_seq * p.kv_page_size != p.Tk)
      throw Error("pages_per_seq = " + str(cache.pages_per_seq),
                  "must be >= 1 with pages_per_seq * page_size = Problem::Tk = " + str(p.Tk));
    validate_int32_vector("block_table", cache.block_table, p.B * cache.pages_per_seq, q.device);
    if (cache.batch_idx.data != nullptr)
      throw Error("cache_batch_idx",
                  "is for a dense cache; a paged one maps sequences by block_table");
  } else {
    if (cache.block_table.data != nullptr)
      throw Error("block_table", "needs a paged cache (Problem::kv_page_size > 0)");
    if (cache.batch_idx.data != nullptr)
      validate_int32_vector("cache_batch_idx", cache.batch_idx, p.B, q.device);
    else if (cache.k.shape[0] < p.B)
      throw Error("k_cache.shape[0] = " + str(cache.k.shape[0]),
                  "must be >= B = " + str(p.B) + " without cache_batch_idx (row b is sequence b)");
  }
  const TensorRef seqlens = offsets_tensor(cache.seqlens);
  const TensorRef table = offsets_tensor(cache.block_table);
  const TensorRef batch_idx = offsets_tensor(cache.batch_idx);
  validate_no_overlap({{"o", &o, true},
                       {"lse", &lse, true},
                       {"k_cache", &cache.k, true},
                       {"v_cache", &cache.v, true},
                       {"q", &q, false},
                       {"k_new", &k_new, false},
                       {"v_new", &v_new, false},
                       {"cache_seqlens", &seqlens, false},
                       {"block_table", &table, false},
                       {"cache_batch_idx", &batch_idx, false}});
  return t_new;
}

HostKvCache read_and_check_kv_cache(const Problem& p, const KvCache& cache, int64_t t_new,
                                    void* stream) {
  HostKvCache h;
  h.seqlens = copy_to_host(cache.seqlens, stream);
  if (p.kv_page_size > 0) h.block_table = copy_to_host(cache.block_table, stream);
  if (cache.batch_idx.data != nullptr) h.batch_idx = copy_to_host(cache.batch_idx, stream);
  const int64_t rows = cache.k.shape[0];  // pages, or dense cache rows
  std::set<int64_t> written;              // pages (or rows) new keys go to
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t cached = h.seqlens[b];
    if (cached < 0 || cached + t_new > p.Tk)
      throw Error("cache_seqlens[" + str(b) + "] = " + str(cached),
                  "must be in [0, " + str(p.Tk - t_new) + "]: with the " + str(t_new) +
                      " new keys it must fit the capacity, Problem::Tk = " + str(p.Tk));
    const int64_t keys = cached + t_new;
    if (p.kv_page_size > 0) {
      const int64_t pages = (keys + p.kv_page_size - 1) / p.kv_page_size;
      for (int64_t x = 0; x < pages; ++x) {
        const int64_t page = h.block_table[b * cache.pages_per_seq + x];
        if (page < 0 || page >= rows)
          throw Error("block_table[" + str(b) + ", " + str(x) + "] = " + str(page),
                      "must be a page of the cache, in [0, " + str(rows) + ")");
      }
      for (int64_t x = cached / p.kv_page_size; t_new > 0 && x < pages; ++x) {
        const int64_t page = h.block_table[b * cache.pages_per_seq + x];
        if (!written.insert(page).second)
          throw Error("block_table[" + str(b) + ", " + str(x) + "] = " + str(page),
                      "another sequence appends to this page too: new keys of two sequences "
                      "may not share a page");
      }
    } else {
      const int64_t row = h.batch_idx.empty() ? b : h.batch_idx[b];
      if (row < 0 || row >= rows)
        throw Error("cache_batch_idx[" + str(b) + "] = " + str(row),
                    "must be a row of the cache, in [0, " + str(rows) + ")");
      if (t_new > 0 && !written.insert(row).second)
        throw Error("cache_batch_idx[" + str(b) + "] = " + str(row),
                    "another sequence appends to this cache row too");
    }
  }
  return h;
}

}  // namespace gqattn::detail
