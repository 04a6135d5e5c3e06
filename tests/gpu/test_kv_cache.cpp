// forward_with_kv_cache on every CUDA backend, through the public API, the
// GPU twin of tests/cpu/test_kv_cache.cpp: dense caches (with and without
// cache_batch_idx) and paged caches of page sizes 1, 3, 16 and 256, in bf16,
// f16 and f32, with and without new keys. Every device tensor sits between
// poisoned guard bytes (checked untouched). The in-place append is checked
// element by element on a copy of the cache brought back to the host (new
// keys where they belong, every other cache element untouched), the
// outputs against the f64 oracle over a cache gathered here independently
// (tolerance of check.hpp from the CPU mirror's error on the same inputs),
// batch invariance (a sequence alone and in a batch give the same bits),
// and checked bad block_table / cache_seqlens rejected with the argument
// named and nothing written. A backend without a KV-cache path (explain()
// says "not supported") is skipped with its reason.
//
// Options::check_offsets = false: cuda-unfused reads the cache's vectors on
// the host for every call (needs_host_offsets), so they are always checked;
// no CUDA backend reads them on the device yet, so there is no unchecked
// path to test.
#include "gpu_test_util.hpp"

#ifdef GQATTN_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gqattn/check.hpp"
#include "gqattn/error.hpp"
#include "gqattn/oracle.hpp"
#include "varlen_harness.hpp"

namespace gqattn::test {
namespace {

using varlen::decode;
using varlen::encode;
using varlen::GuardedBuffer;
using varlen::rounded;

constexpr Backend kCudaBackends[] = {Backend::CudaUnfused, Backend::CudaFlash, Backend::CudaHopper};

// A cache problem: B sequences, `cached[b]` keys in the cache, t_new new
// ones; paged when page > 0 (pages shuffled), else dense with `rows` rows
// (cache_batch_idx when use_batch_idx).
struct Case {
  int64_t B = 3, Tq = 2, H = 4, Hkv = 2, d = 64;
  int64_t page = 0;  // 0: dense
  int64_t capacity = 20;
  std::vector<int32_t> cached = {5, 0, 12};
  int64_t t_new = 3;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0.0f;
  bool use_batch_idx = false;
  DType dtype = DType::bf16;
  uint64_t seed = 1;
};

// The host side of a run: the problem, the cache's vectors, and every
// tensor's values already rounded to the dtype.
struct Host {
  Problem problem;
  DType dtype = DType::bf16;
  int64_t cache_rows = 0, pages_per_seq = 0, slots = 0, t_new = 0;
  std::vector<int32_t> seqlens, table, batch_idx;
  std::vector<float> k_cache, v_cache, q, k_new, v_new;

  std::pair<int64_t, int64_t> slot(int64_t b, int64_t pos) const {
    if (problem.kv_page_size > 0)
      return {table[std::size_t(b * pages_per_seq + pos / problem.kv_page_size)],
              pos % problem.kv_page_size};
    return {batch_idx.empty() ? b : batch_idx[std::size_t(b)], pos};
  }
  int64_t cache_index(int64_t row, int64_t s, int64_t hk) const {
    return ((row * slots + s) * problem.Hkv + hk) * problem.d;
  }
};

std::vector<float> random_values(std::size_t n, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.5f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = rounded(dtype, normal(rng));
  return x;
}

Host make_host(const Case& c) {
  Host h;
  Problem& p = h.problem;
  p = make_problem(c.B, c.Tq, c.capacity, c.H, c.Hkv, c.d, c.causal, c.window, c.softcap);
  p.kv_cache = true;
  p.kv_page_size = c.page;
  h.dtype = c.dtype;
  h.t_new = c.t_new;
  std::mt19937 rng(unsigned(c.seed));
  if (c.page > 0) {
    h.pages_per_seq = c.capacity / c.page;
    h.cache_rows = c.B * h.pages_per_seq + 2;  // two spare pages nobody uses
    std::vector<int32_t> pages(std::size_t(h.cache_rows));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    h.table.assign(pages.begin(), pages.begin() + c.B * h.pages_per_seq);
  } else {
    h.cache_rows = c.B + (c.use_batch_idx ? 2 : 0);
    if (c.use_batch_idx) {
      std::vector<int32_t> rows(std::size_t(h.cache_rows));
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), rng);
      h.batch_idx.assign(rows.begin(), rows.begin() + c.B);
    }
  }
  h.slots = c.page > 0 ? c.page : c.capacity;
  const std::size_t cache_n = std::size_t(h.cache_rows * h.slots * c.Hkv * c.d);
  h.k_cache = random_values(cache_n, c.dtype, c.seed + 1);
  h.v_cache = random_values(cache_n, c.dtype, c.seed + 2);
  h.q = random_values(std::size_t(c.B * c.Tq * c.H * c.d), c.dtype, c.seed + 3);
  h.k_new = random_values(std::size_t(c.B * c.t_new * c.Hkv * c.d), c.dtype, c.seed + 4);
  h.v_new = random_values(std::size_t(c.B * c.t_new * c.Hkv * c.d), c.dtype, c.seed + 5);
  h.seqlens = c.cached;
  return h;
}

// Device copies of a Host, each tensor between guards, outputs poisoned.
struct DeviceRun {
  const Host& h;
  std::size_t elem;
  GuardedBuffer k_cache, v_cache, q, k_new, v_new, o, lse;
  DeviceBuffer seqlens, table, batch_idx;

  explicit DeviceRun(const Host& host)
      : h(host),
        elem(dtype_size(host.dtype)),
        k_cache(Device::cuda, host.k_cache.size() * elem),
        v_cache(Device::cuda, host.v_cache.size() * elem),
        q(Device::cuda, host.q.size() * elem),
        k_new(Device::cuda, host.k_new.size() * elem),
        v_new(Device::cuda, host.v_new.size() * elem),
        o(Device::cuda, host.q.size() * elem),
        lse(Device::cuda, std::size_t(host.problem.B * host.problem.H * host.problem.Tq) * 4),
        seqlens(to_device(host.seqlens)),
        table(to_device(host.table)),
        batch_idx(to_device(host.batch_idx)) {
    k_cache.upload(encode(h.dtype, h.k_cache));
    v_cache.upload(encode(h.dtype, h.v_cache));
    q.upload(encode(h.dtype, h.q));
    k_new.upload(encode(h.dtype, h.k_new));
    v_new.upload(encode(h.dtype, h.v_new));
  }

  static OffsetsRef ints(const DeviceBuffer& b, const std::vector<int32_t>& x) {
    OffsetsRef r;
    r.data = x.empty() ? nullptr : static_cast<const int32_t*>(b.get());
    r.device = Device::cuda;
    r.size = int64_t(x.size());
    return r;
  }

  void call(Backend backend, bool check_offsets = true) {
    const Problem& p = h.problem;
    KvCache cache;
    cache.k = contiguous(k_cache.data(), h.dtype, Device::cuda, h.cache_rows, h.slots, p.Hkv, p.d);
    cache.v = contiguous(v_cache.data(), h.dtype, Device::cuda, h.cache_rows, h.slots, p.Hkv, p.d);
    cache.seqlens = ints(seqlens, h.seqlens);
    cache.block_table = ints(table, h.table);
    cache.pages_per_seq = h.pages_per_seq;
    cache.batch_idx = ints(batch_idx, h.batch_idx);
    TensorRef tk_new, tv_new;
    if (h.t_new > 0) {
      tk_new = contiguous(k_new.data(), h.dtype, Device::cuda, p.B, h.t_new, p.Hkv, p.d);
      tv_new = contiguous(v_new.data(), h.dtype, Device::cuda, p.B, h.t_new, p.Hkv, p.d);
    }
    Options options;
    options.backend = backend;
    options.check_offsets = check_offsets;
    forward_with_kv_cache(
        p, cache, contiguous(q.data(), h.dtype, Device::cuda, p.B, p.Tq, p.H, p.d), tk_new, tv_new,
        contiguous(o.data(), h.dtype, Device::cuda, p.B, p.Tq, p.H, p.d),
        contiguous(lse.data(), DType::f32, Device::cuda, p.B, p.H, p.Tq), options);
    device_synchronize();
  }

  // A tensor's values back on the host; fails the test when a guard changed.
  std::vector<float> read(GuardedBuffer& buffer, DType dtype, std::size_t count, const char* name) {
    const varlen::Output out = varlen::read_output(buffer, count * dtype_size(dtype));
    EXPECT_TRUE(out.guards_intact) << name << ": a guard byte was written";
    return decode(dtype, out.bytes.data(), count);
  }
  std::vector<float> o_values() { return read(o, h.dtype, h.q.size(), "o"); }
  std::vector<float> lse_values() {
    return read(lse, DType::f32, std::size_t(h.problem.B * h.problem.H * h.problem.Tq), "lse");
  }
};

// The f32 CPU mirror (the cpu backend) on host copies of the same values
// (already rounded to the dtype, so exact in f32): the yardstick of
// check.hpp's tolerances.
struct MirrorRun {
  std::vector<float> k_cache, v_cache, o, lse;
};
MirrorRun run_mirror(const Host& h) {
  const Problem& p = h.problem;
  const DType f32 = DType::f32;
  MirrorRun m;
  m.k_cache = h.k_cache;
  m.v_cache = h.v_cache;
  std::vector<float> q = h.q, k_new = h.k_new, v_new = h.v_new;
  m.o.assign(q.size(), 0.0f);
  m.lse.assign(std::size_t(p.B * p.H * p.Tq), 0.0f);
  auto host_ints = [](const std::vector<int32_t>& x) {
    OffsetsRef r;
    r.data = x.empty() ? nullptr : x.data();
    r.size = int64_t(x.size());
    return r;
  };
  KvCache cache;
  cache.k = contiguous(m.k_cache.data(), f32, Device::cpu, h.cache_rows, h.slots, p.Hkv, p.d);
  cache.v = contiguous(m.v_cache.data(), f32, Device::cpu, h.cache_rows, h.slots, p.Hkv, p.d);
  cache.seqlens = host_ints(h.seqlens);
  cache.block_table = host_ints(h.table);
  cache.pages_per_seq = h.pages_per_seq;
  cache.batch_idx = host_ints(h.batch_idx);
  TensorRef tk_new, tv_new;
  if (h.t_new > 0) {
    tk_new = contiguous(k_new.data(), f32, Device::cpu, p.B, h.t_new, p.Hkv, p.d);
    tv_new = contiguous(v_new.data(), f32, Device::cpu, p.B, h.t_new, p.Hkv, p.d);
  }
  Options options;
  options.backend = Backend::Cpu;
  forward_with_kv_cache(p, cache, contiguous(q.data(), f32, Device::cpu, p.B, p.Tq, p.H, p.d),
                        tk_new, tv_new,
                        contiguous(m.o.data(), f32, Device::cpu, p.B, p.Tq, p.H, p.d),
                        contiguous(m.lse.data(), DType::f32, Device::cpu, p.B, p.H, p.Tq), options);
  return m;
}

// max |x - ref| / max |ref| over the finite reference values; infinity when
// an infinite reference value is not matched exactly or x holds a NaN.
double rel_error(const std::vector<float>& x, const std::vector<double>& ref) {
  if (x.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double err = 0.0, scale = 0.0;
  for (std::size_t n = 0; n < x.size(); ++n) {
    if (std::isinf(ref[n])) {
      if (double(x[n]) != ref[n]) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(x[n])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(double(x[n]) - ref[n]));
    scale = std::max(scale, std::fabs(ref[n]));
  }
  return scale > 0.0 ? err / scale : err;
}

template <class It>
std::vector<float> slice(It begin, int64_t first, int64_t count) {
  return std::vector<float>(begin + first, begin + first + count);
}

// "" when `backend` runs the case's problem, else explain()'s reason.
std::string why_not(Backend backend, const Problem& p, DType dtype) {
  const Explanation e = explain(p, dtype, Device::cuda, backend);
  return e.supported ? "" : e.reason;
}

// Runs the case on `backend` and checks the append, the untouched cache and
// the outputs. Returns explain()'s reason when the backend refuses.
std::string check_case(Backend backend, const Case& c) {
  const Host h = make_host(c);
  const Problem& p = h.problem;
  const std::string why = why_not(backend, p, c.dtype);
  if (!why.empty()) return why;
  DeviceRun run(h);
  run.call(backend);

  // The append, element by element; every other cache element untouched.
  const std::vector<float> k_after = run.read(run.k_cache, h.dtype, h.k_cache.size(), "k_cache");
  const std::vector<float> v_after = run.read(run.v_cache, h.dtype, h.v_cache.size(), "v_cache");
  std::vector<float> k_expect = h.k_cache, v_expect = h.v_cache;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t t = 0; t < c.t_new; ++t) {
      const auto [row, s] = h.slot(b, h.seqlens[std::size_t(b)] + t);
      for (int64_t hk = 0; hk < p.Hkv; ++hk)
        for (int64_t x = 0; x < p.d; ++x) {
          const std::size_t at = std::size_t(h.cache_index(row, s, hk) + x);
          const std::size_t from = std::size_t(((b * c.t_new + t) * p.Hkv + hk) * p.d + x);
          k_expect[at] = h.k_new[from];
          v_expect[at] = h.v_new[from];
        }
    }
  int64_t k_wrong = 0, v_wrong = 0;
  for (std::size_t x = 0; x < k_expect.size(); ++x) {
    k_wrong += k_after[x] != k_expect[x];
    v_wrong += v_after[x] != v_expect[x];
  }
  EXPECT_EQ(k_wrong, 0) << "k_cache elements not as appended / changed";
  EXPECT_EQ(v_wrong, 0) << "v_cache elements not as appended / changed";

  // Each sequence against the oracle over keys gathered here from the
  // expected cache; the tolerance from the mirror's error on the same inputs.
  const std::vector<float> o = run.o_values(), lse = run.lse_values();
  const MirrorRun mirror = run_mirror(h);
  const std::vector<float>& mirror_o = mirror.o;
  const int64_t qn = p.Tq * p.H * p.d, ln = p.H * p.Tq;
  for (int64_t b = 0; b < p.B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const int64_t keys = h.seqlens[std::size_t(b)] + c.t_new;
    if (keys == 0) {  // no key: o = 0, lse = -inf
      for (int64_t x = 0; x < qn; ++x) EXPECT_EQ(o[std::size_t(b * qn + x)], 0.0f) << "o " << x;
      for (int64_t x = 0; x < ln; ++x)
        EXPECT_EQ(lse[std::size_t(b * ln + x)], -INFINITY) << "lse " << x;
      continue;
    }
    std::vector<double> K, V, Q(h.q.begin() + b * qn, h.q.begin() + (b + 1) * qn);
    for (int64_t pos = 0; pos < keys; ++pos) {
      const auto [row, s] = h.slot(b, pos);
      for (int64_t hk = 0; hk < p.Hkv; ++hk)
        for (int64_t x = 0; x < p.d; ++x) {
          K.push_back(k_expect[std::size_t(h.cache_index(row, s, hk) + x)]);
          V.push_back(v_expect[std::size_t(h.cache_index(row, s, hk) + x)]);
        }
    }
    Problem dense = p;
    dense.kv_cache = false;
    dense.kv_page_size = 0;
    dense.B = 1;
    dense.Tk = keys;
    const oracle::ForwardResult ref = oracle::forward(dense, Q, K, V);
    const double o_err = rel_error(slice(o.begin(), b * qn, qn), ref.o);
    const double lse_err = rel_error(slice(lse.begin(), b * ln, ln), ref.lse);
    const double o_tol =
        check::tolerance(h.dtype, "o", rel_error(slice(mirror_o.begin(), b * qn, qn), ref.o));
    const double lse_tol =
        check::tolerance(h.dtype, "lse", rel_error(slice(mirror.lse.begin(), b * ln, ln), ref.lse));
    EXPECT_LE(o_err, o_tol) << "o";
    EXPECT_LE(lse_err, lse_tol) << "lse";
  }
  return "";
}

// Runs `c` with each dtype on every CUDA backend; skips (with the reasons)
// when no backend runs it.
void check_everywhere(Case c, std::vector<DType> dtypes = {DType::bf16, DType::f16, DType::f32}) {
  std::string skipped;
  int ran = 0;
  for (Backend backend : kCudaBackends)
    for (DType dtype : dtypes) {
      SCOPED_TRACE(std::string(backend_name(backend)) + " " + dtype_name(dtype));
      c.dtype = dtype;
      const std::string why = check_case(backend, c);
      if (why.empty()) {
        ++ran;
        continue;
      }
      // cuda-unfused has a KV-cache path for every problem here; the fused
      // backends say "not supported" until theirs exist.
      EXPECT_NE(backend, Backend::CudaUnfused) << "cuda-unfused refused: " << why;
      skipped += std::string("\n  ") + backend_name(backend) + " " + dtype_name(dtype) + ": " + why;
    }
  if (!skipped.empty()) {
    if (ran == 0) GTEST_SKIP() << "no CUDA backend ran it:" << skipped;
    std::printf("skipped:%s\n", skipped.c_str());
  }
}

TEST(GpuKvCache, DenseCacheAppendAndAttend) {
  GQATTN_SKIP_WITHOUT_CUDA();
  check_everywhere(Case{});
}

TEST(GpuKvCache, DenseCacheWithBatchIdx) {
  GQATTN_SKIP_WITHOUT_CUDA();
  Case c;
  c.use_batch_idx = true;
  c.window = 4;
  c.softcap = 5.0f;
  check_everywhere(c);
}

TEST(GpuKvCache, PagedCachesOfEveryPageSize) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (int64_t page : {1, 3, 16, 256}) {
    SCOPED_TRACE("page " + std::to_string(page));
    Case c;
    c.page = page;
    c.capacity = page * (page >= 16 ? 2 : 9);
    c.cached = {int32_t(c.capacity - 3), 0, int32_t(c.capacity / 2)};
    c.seed = 10 + uint64_t(page);
    check_everywhere(c);
  }
}

TEST(GpuKvCache, WithoutNewKeysAndDecoding) {
  GQATTN_SKIP_WITHOUT_CUDA();
  Case c;
  c.page = 3;
  c.capacity = 21;
  c.t_new = 0;
  c.Tq = 1;
  c.cached = {7, 0, 21};  // sequence 1 has no key: o = 0, lse = -inf
  c.causal = false;
  check_everywhere(c);
}

TEST(GpuKvCache, HeadDimensionsOfTheFusedBackends) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (int64_t d : {128, 256}) {
    SCOPED_TRACE("d " + std::to_string(d));
    Case c;
    c.d = d;
    c.page = 16;
    c.capacity = 64;
    c.cached = {40, 1, 61};
    check_everywhere(c, {DType::bf16});
  }
}

// A sequence alone (B = 1, its own page-table row) gives the same bits as
// in the batch: o, lse, and the cache rows it appends.
TEST(GpuKvCache, ASequenceGivesTheSameBitsAloneAndInABatch) {
  GQATTN_SKIP_WITHOUT_CUDA();
  Case c;
  c.page = 16;
  c.capacity = 48;
  c.cached = {30, 7, 44};
  c.t_new = 2;
  const Host batch = make_host(c);
  for (Backend backend : kCudaBackends) {
    SCOPED_TRACE(backend_name(backend));
    if (!why_not(backend, batch.problem, c.dtype).empty()) continue;
    DeviceRun whole(batch);
    whole.call(backend);
    const std::vector<float> o = whole.o_values(), lse = whole.lse_values();
    const int64_t qn = c.Tq * c.H * c.d, ln = c.H * c.Tq, kn = c.t_new * c.Hkv * c.d;
    for (int64_t b = 0; b < c.B; ++b) {
      Host alone = batch;
      alone.problem.B = 1;
      alone.seqlens = {batch.seqlens[std::size_t(b)]};
      alone.table.assign(batch.table.begin() + b * batch.pages_per_seq,
                         batch.table.begin() + (b + 1) * batch.pages_per_seq);
      alone.q.assign(batch.q.begin() + b * qn, batch.q.begin() + (b + 1) * qn);
      alone.k_new.assign(batch.k_new.begin() + b * kn, batch.k_new.begin() + (b + 1) * kn);
      alone.v_new.assign(batch.v_new.begin() + b * kn, batch.v_new.begin() + (b + 1) * kn);
      DeviceRun one(alone);
      one.call(backend);
      EXPECT_EQ(one.o_values(), slice(o.begin(), b * qn, qn)) << "o of sequence " << b;
      const std::vector<float> one_lse = one.lse_values();
      EXPECT_EQ(0, std::memcmp(one_lse.data(), lse.data() + b * ln, std::size_t(ln) * 4))
          << "lse of sequence " << b;
    }
  }
}

// A checked error: the argument named, the outputs and the cache untouched.
void expect_error(Backend backend, const Host& h, const std::string& argument) {
  DeviceRun run(h);
  try {
    run.call(backend);
    ADD_FAILURE() << "no error; expected one naming " << argument;
  } catch (const Error& e) {
    EXPECT_NE(e.argument().find(argument), std::string::npos) << e.what();
  }
  device_synchronize();
  const varlen::Output o = varlen::read_output(run.o, h.q.size() * run.elem);
  EXPECT_TRUE(varlen::is_poison(o.bytes.data(), o.bytes.size())) << "o written";
  EXPECT_EQ(run.read(run.k_cache, h.dtype, h.k_cache.size(), "k_cache"), h.k_cache);
  EXPECT_EQ(run.read(run.v_cache, h.dtype, h.v_cache.size(), "v_cache"), h.v_cache);
}

TEST(GpuKvCache, BadTablesAndLengthsNameTheArgumentAndWriteNothing) {
  GQATTN_SKIP_WITHOUT_CUDA();
  Case c;
  c.page = 3;
  c.capacity = 9;
  c.cached = {2, 0, 5};
  const Host good = make_host(c);
  for (Backend backend : kCudaBackends) {
    SCOPED_TRACE(backend_name(backend));
    if (!why_not(backend, good.problem, c.dtype).empty()) continue;
    {
      Host h = good;
      h.table[1] = int32_t(h.cache_rows);  // a page past the cache
      expect_error(backend, h, "block_table");
    }
    {
      Host h = good;
      h.table[0] = -1;
      expect_error(backend, h, "block_table");
    }
    {
      Host h = good;
      h.table[std::size_t(h.pages_per_seq)] = h.table[0];  // sequences 0 and 1 append to one page
      expect_error(backend, h, "block_table");
    }
    {
      Host h = good;
      h.seqlens[2] = 7;  // 7 + 3 new > 9
      expect_error(backend, h, "cache_seqlens[2]");
    }
    {
      Host h = good;
      h.seqlens[0] = -1;
      expect_error(backend, h, "cache_seqlens[0]");
    }
  }
  {
    Case dense;
    dense.use_batch_idx = true;
    Host h = make_host(dense);
    for (Backend backend : kCudaBackends) {
      SCOPED_TRACE(backend_name(backend));
      if (!why_not(backend, h.problem, dense.dtype).empty()) continue;
      Host bad = h;
      bad.batch_idx[1] = int32_t(bad.cache_rows);
      expect_error(backend, bad, "cache_batch_idx[1]");
      bad = h;
      bad.batch_idx[1] = bad.batch_idx[0];  // two sequences append to one row
      expect_error(backend, bad, "cache_batch_idx[1]");
    }
  }
}

// check_offsets = false changes nothing on a backend that reads the cache's
// vectors on the host (cuda-unfused): bad values are still rejected.
TEST(GpuKvCache, UncheckedOffsetsStillCheckedWhereReadOnTheHost) {
  GQATTN_SKIP_WITHOUT_CUDA();
  Case c;
  c.page = 3;
  c.capacity = 9;
  c.cached = {2, 0, 5};
  Host h = make_host(c);
  if (!why_not(Backend::CudaUnfused, h.problem, c.dtype).empty())
    GTEST_SKIP() << why_not(Backend::CudaUnfused, h.problem, c.dtype);
  h.table[1] = int32_t(h.cache_rows);
  DeviceRun run(h);
  try {
    run.call(Backend::CudaUnfused, /*check_offsets=*/false);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.argument().find("block_table"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gqattn::test

#endif  // GQATTN_WITH_CUDA
