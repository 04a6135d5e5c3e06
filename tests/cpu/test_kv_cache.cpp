// forward_with_kv_cache on the host backends (the mirror, cpu, and cpu-flash),
// through the public API: dense
// caches (with and without cache_batch_idx) and paged caches of page sizes 1,
// 3, 16 and 256, with and without new keys. The append is checked element
// by element (new keys where they belong, every other cache element
// untouched), the outputs against the f64 oracle over a cache gathered here
// independently, batch invariance (a sequence alone and in a batch), and
// the argument rules (each error names its argument; nothing is written).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_test_util.hpp"
#include "gqattn/error.hpp"

namespace gqattn::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

OffsetsRef ints(const std::vector<int32_t>& x) {
  OffsetsRef r;
  r.data = x.empty() ? nullptr : x.data();
  r.size = int64_t(x.size());
  return r;
}

// A cache problem: B sequences, `cached[b]` keys in the cache, t_new new
// ones; paged when page > 0 (pages shuffled), else dense with `rows` rows
// (cache_batch_idx when use_batch_idx).
struct Case {
  int64_t B = 3, Tq = 2, H = 4, Hkv = 2, d = 8;
  int64_t page = 0;  // 0: dense
  int64_t capacity = 20;
  std::vector<int32_t> cached = {5, 0, 12};
  int64_t t_new = 3;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0.0f;
  bool use_batch_idx = false;
  uint64_t seed = 1;
};

struct CacheRun {
  Problem problem;
  std::vector<float> k_cache, v_cache, k_cache_before, v_cache_before, q, k_new, v_new, o, lse;
  std::vector<int32_t> seqlens, table, batch_idx;
  int64_t cache_rows = 0, pages_per_seq = 0;
  KvCache cache;
  TensorRef tq, tk_new, tv_new, to, tlse;

  // (row, slot) of key position pos of sequence b.
  std::pair<int64_t, int64_t> slot(int64_t b, int64_t pos) const {
    if (problem.kv_page_size > 0)
      return {table[b * pages_per_seq + pos / problem.kv_page_size], pos % problem.kv_page_size};
    return {batch_idx.empty() ? b : batch_idx[b], pos};
  }
  int64_t cache_index(int64_t row, int64_t s, int64_t hk) const {
    const int64_t slots = problem.kv_page_size > 0 ? problem.kv_page_size : problem.Tk;
    return ((row * slots + s) * problem.Hkv + hk) * problem.d;
  }
};

CacheRun make_run(const Case& c) {
  CacheRun r;
  Problem& p = r.problem;
  p = make_problem(c.B, c.Tq, c.capacity, c.H, c.Hkv, c.d, c.causal, c.window, c.softcap);
  p.kv_cache = true;
  p.kv_page_size = c.page;
  std::mt19937 rng(unsigned(c.seed));
  if (c.page > 0) {
    r.pages_per_seq = c.capacity / c.page;
    r.cache_rows = c.B * r.pages_per_seq + 2;  // two spare pages nobody uses
    std::vector<int32_t> pages(size_t(r.cache_rows));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    r.table.assign(pages.begin(), pages.begin() + c.B * r.pages_per_seq);
  } else {
    r.cache_rows = c.B + (c.use_batch_idx ? 2 : 0);
    if (c.use_batch_idx) {
      std::vector<int32_t> rows(size_t(r.cache_rows));
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), rng);
      r.batch_idx.assign(rows.begin(), rows.begin() + c.B);
    }
  }
  const int64_t slots = c.page > 0 ? c.page : c.capacity;
  const int64_t cache_n = r.cache_rows * slots * c.Hkv * c.d;
  r.k_cache = random_input(cache_n, c.d, c.seed + 1, false);
  r.v_cache = random_input(cache_n, c.d, c.seed + 2);
  r.k_cache_before = r.k_cache;
  r.v_cache_before = r.v_cache;
  r.q = random_input(c.B * c.Tq * c.H * c.d, c.d, c.seed + 3);
  r.k_new = random_input(c.B * c.t_new * c.Hkv * c.d, c.d, c.seed + 4, false);
  r.v_new = random_input(c.B * c.t_new * c.Hkv * c.d, c.d, c.seed + 5);
  r.o.assign(c.B * c.Tq * c.H * c.d, kNaN);
  r.lse.assign(c.B * c.H * c.Tq, kNaN);
  r.seqlens = c.cached;
  r.cache.k =
      contiguous(r.k_cache.data(), DType::f32, Device::cpu, r.cache_rows, slots, c.Hkv, c.d);
  r.cache.v =
      contiguous(r.v_cache.data(), DType::f32, Device::cpu, r.cache_rows, slots, c.Hkv, c.d);
  r.cache.seqlens = ints(r.seqlens);
  r.cache.block_table = ints(r.table);
  r.cache.pages_per_seq = r.pages_per_seq;
  r.cache.batch_idx = ints(r.batch_idx);
  r.tq = contiguous(r.q.data(), DType::f32, Device::cpu, c.B, c.Tq, c.H, c.d);
  if (c.t_new > 0) {
    r.tk_new = contiguous(r.k_new.data(), DType::f32, Device::cpu, c.B, c.t_new, c.Hkv, c.d);
    r.tv_new = contiguous(r.v_new.data(), DType::f32, Device::cpu, c.B, c.t_new, c.Hkv, c.d);
  }
  r.to = contiguous(r.o.data(), DType::f32, Device::cpu, c.B, c.Tq, c.H, c.d);
  r.tlse = contiguous(r.lse.data(), DType::f32, Device::cpu, c.B, c.H, c.Tq);
  return r;
}

// The backend under test: KvCacheOn's parameter.
Backend backend_under_test = Backend::Cpu;

class KvCacheOn : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { backend_under_test = GetParam(); }
};

void call(CacheRun& r) {
  Options options;
  options.backend = backend_under_test;
  forward_with_kv_cache(r.problem, r.cache, r.tq, r.tk_new, r.tv_new, r.to, r.tlse, options);
}

void check_run(const Case& c) {
  CacheRun r = make_run(c);
  call(r);
  const Problem& p = r.problem;
  // The append, element by element; everything else untouched.
  std::vector<bool> written(r.k_cache.size(), false);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.t_new; ++t) {
      const auto [row, s] = r.slot(b, r.seqlens[b] + t);
      for (int64_t hk = 0; hk < c.Hkv; ++hk)
        for (int64_t x = 0; x < c.d; ++x) {
          const int64_t at = r.cache_index(row, s, hk) + x;
          const int64_t from = ((b * c.t_new + t) * c.Hkv + hk) * c.d + x;
          EXPECT_EQ(r.k_cache[at], r.k_new[from]);
          EXPECT_EQ(r.v_cache[at], r.v_new[from]);
          written[at] = true;
        }
    }
  for (size_t x = 0; x < written.size(); ++x)
    if (!written[x]) {
      ASSERT_EQ(r.k_cache[x], r.k_cache_before[x]) << x;
      ASSERT_EQ(r.v_cache[x], r.v_cache_before[x]) << x;
    }
  // Each sequence against the oracle over its gathered keys.
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t keys = r.seqlens[b] + c.t_new;
    const int64_t qn = c.Tq * c.H * c.d;
    if (keys == 0) {
      for (int64_t x = 0; x < qn; ++x) EXPECT_EQ(r.o[b * qn + x], 0.0f);
      for (int64_t x = 0; x < c.H * c.Tq; ++x) EXPECT_EQ(r.lse[b * c.H * c.Tq + x], -INFINITY);
      continue;
    }
    std::vector<double> K, V, Q(r.q.begin() + b * qn, r.q.begin() + (b + 1) * qn);
    for (int64_t pos = 0; pos < keys; ++pos) {
      const auto [row, s] = r.slot(b, pos);
      for (int64_t hk = 0; hk < c.Hkv; ++hk)
        for (int64_t x = 0; x < c.d; ++x) {
          K.push_back(r.k_cache[r.cache_index(row, s, hk) + x]);
          V.push_back(r.v_cache[r.cache_index(row, s, hk) + x]);
        }
    }
    Problem dense = p;
    dense.kv_cache = false;
    dense.kv_page_size = 0;
    dense.B = 1;
    dense.Tk = keys;
    const oracle::ForwardResult ref = oracle::forward(dense, Q, K, V);
    const std::vector<float> o(r.o.begin() + b * qn, r.o.begin() + (b + 1) * qn);
    const std::vector<float> lse(r.lse.begin() + b * c.H * c.Tq,
                                 r.lse.begin() + (b + 1) * c.H * c.Tq);
    EXPECT_LT(max_rel_error(o, ref.o), 1e-5) << "o of sequence " << b;
    EXPECT_LT(max_rel_error(lse, ref.lse), 1e-5) << "lse of sequence " << b;
  }
}

TEST_P(KvCacheOn, DenseCacheAppendAndAttend) { check_run(Case{}); }

TEST_P(KvCacheOn, DenseCacheWithBatchIdx) {
  Case c;
  c.use_batch_idx = true;
  c.window = 4;
  c.softcap = 5.0f;
  check_run(c);
}

TEST_P(KvCacheOn, PagedCachesOfEveryPageSize) {
  for (int64_t page : {1, 3, 16, 256}) {
    SCOPED_TRACE("page " + std::to_string(page));
    Case c;
    c.page = page;
    c.capacity = page * (page >= 16 ? 2 : 9);
    c.cached = {int32_t(c.capacity - 3), 0, int32_t(c.capacity / 2)};
    c.seed = 10 + uint64_t(page);
    check_run(c);
  }
}

TEST_P(KvCacheOn, WithoutNewKeysAndDecoding) {
  Case c;
  c.page = 3;
  c.capacity = 21;
  c.t_new = 0;
  c.Tq = 1;
  c.cached = {7, 0, 21};
  c.causal = false;
  check_run(c);
}

TEST_P(KvCacheOn, QueryOffsetGiven) {
  Case c;
  c.page = 16;
  c.capacity = 32;
  c.cached = {20, 3, 9};
  CacheRun r = make_run(c);
  r.problem.q_start = 2;  // the queries sit at positions 2 and 3 of every sequence
  call(r);
  for (int64_t b = 0; b < c.B; ++b) EXPECT_TRUE(std::isfinite(r.lse[b * c.H * c.Tq]));
}

TEST_P(KvCacheOn, ASequenceGivesTheSameBitsAloneAndInABatch) {
  Case c;
  c.page = 16;
  c.capacity = 48;
  c.cached = {30, 7, 44};
  CacheRun batch = make_run(c);
  const std::vector<float> cache_k = batch.k_cache, cache_v = batch.v_cache;
  call(batch);
  for (int64_t b = 0; b < c.B; ++b) {
    CacheRun alone = make_run(c);
    alone.k_cache = cache_k;
    alone.v_cache = cache_v;
    alone.problem.B = 1;
    alone.seqlens = {batch.seqlens[b]};
    alone.table.assign(batch.table.begin() + b * batch.pages_per_seq,
                       batch.table.begin() + (b + 1) * batch.pages_per_seq);
    alone.cache.seqlens = ints(alone.seqlens);
    alone.cache.block_table = ints(alone.table);
    const int64_t qn = c.Tq * c.H * c.d, kn = c.t_new * c.Hkv * c.d;
    alone.tq.data = alone.q.data() + 0;
    std::copy(batch.q.begin() + b * qn, batch.q.begin() + (b + 1) * qn, alone.q.begin());
    std::copy(batch.k_new.begin() + b * kn, batch.k_new.begin() + (b + 1) * kn,
              alone.k_new.begin());
    std::copy(batch.v_new.begin() + b * kn, batch.v_new.begin() + (b + 1) * kn,
              alone.v_new.begin());
    alone.cache.k.data = alone.k_cache.data();
    alone.cache.v.data = alone.v_cache.data();
    alone.tq.shape[0] = alone.tk_new.shape[0] = alone.tv_new.shape[0] = 1;
    alone.to.shape[0] = alone.tlse.shape[0] = 1;
    call(alone);
    EXPECT_TRUE(std::equal(alone.o.begin(), alone.o.begin() + qn, batch.o.begin() + b * qn))
        << "sequence " << b;
  }
}

void expect_error(CacheRun& r, const std::string& argument) {
  try {
    call(r);
    ADD_FAILURE() << "no error; expected one naming " << argument;
  } catch (const Error& e) {
    EXPECT_NE(e.argument().find(argument), std::string::npos) << e.what();
  }
  for (float x : r.o) EXPECT_TRUE(std::isnan(x));  // nothing written
  EXPECT_EQ(r.k_cache, r.k_cache_before);
}

TEST_P(KvCacheOn, BadArgumentsNameTheArgumentAndWriteNothing) {
  Case c;
  c.page = 3;
  c.capacity = 9;
  c.cached = {2, 0, 5};
  {
    CacheRun r = make_run(c);
    r.table[1] = int32_t(r.cache_rows);  // a page past the cache
    expect_error(r, "block_table");
  }
  {
    CacheRun r = make_run(c);
    r.seqlens[2] = 7;  // 7 + 3 new > 9
    expect_error(r, "cache_seqlens[2]");
  }
  {
    CacheRun r = make_run(c);
    r.seqlens[0] = -1;
    expect_error(r, "cache_seqlens[0]");
  }
  {
    CacheRun r = make_run(c);
    r.table[r.pages_per_seq] = r.table[0];  // sequences 0 and 1 append to one page
    expect_error(r, "block_table");
  }
  {
    CacheRun r = make_run(c);
    r.cache.pages_per_seq = 2;  // 2 * 3 != capacity 9
    expect_error(r, "pages_per_seq");
  }
  {
    CacheRun r = make_run(c);
    r.cache.k.shape[1] = 4;  // not the page size
    expect_error(r, "k_cache.shape");
  }
  {
    CacheRun r = make_run(c);
    r.tv_new = TensorRef{};  // k_new without v_new
    expect_error(r, "v_new");
  }
  {
    CacheRun r = make_run(c);
    r.cache.k = r.cache.v;  // the same cache for k and v: two outputs overlap
    expect_error(r, "cache");
  }
}

TEST(KvCache, ForwardOnAKvCacheProblemPointsToTheCacheCall) {
  CacheRun r = make_run(Case{});
  try {
    forward(r.problem, r.tq, r.tq, r.tq, r.to, r.tlse);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward_with_kv_cache"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(HostBackends, KvCacheOn,
                         ::testing::Values(Backend::Cpu, Backend::CpuFlash),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param == Backend::Cpu ? "cpu" : "cpu_flash";
                         });

}  // namespace
}  // namespace gqattn::test
