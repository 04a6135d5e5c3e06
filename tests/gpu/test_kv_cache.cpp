// forward_with_kv_cache on every CUDA backend, through the public API, the
// GPU twin of tests/cpu/test_kv_cache.cpp: dense caches (with and without
// cache_batch_idx) and paged caches of page sizes 1, 3, 16 and 256, in bf16,
// f16 and f32, with and without new keys, with and without lse; long
// decoding steps (Tq = 1 over thousands of cached keys, GQA 32/8 and MQA),
// a chunked prefill (Tq = T_new = 70, causal, window 100, d 256) and the
// padded head dims 80 and 96 on pages of 3. Every device tensor sits
// between poisoned guard bytes (checked untouched). The in-place append is
// checked element by element on a copy of the cache brought back to the
// host (new keys where they belong, every other cache element untouched),
// the outputs against the f64 oracle over a cache gathered here
// independently (tolerance of check.hpp from the CPU mirror's error on the
// same inputs); the fused backends run every case with the default split
// of the keys and with Options::batch_invariant.
//
// Which backend must run what: cuda-unfused every case; cuda-flash and
// cuda-hopper (the fused paged split-KV path) every bf16/f16 case with d a
// multiple of 8 up to 256. Those may refuse only for the device or the
// build (no CUDA device, the wrong compute capability, no kernel image,
// not compiled in): any other refusal fails the test. f32 refusals of the
// fused backends are expected; a case that no backend ran is skipped with
// the reasons.
//
// Bits: a call run twice gives the same bits (long sequences, the keys split
// over thread blocks); with Options::batch_invariant (the fused backends;
// cuda-unfused is invariant anyway) a sequence gives the same o and lse
// bits alone (B = 1) and in a batch, also a 5000-key sequence in a batch of
// 9 mixed lengths, where a default plan would split it differently.
//
// Bad int32 vectors (block_table, cache_seqlens, cache_batch_idx):
//   checked (Options::check_offsets, the default): an Error naming the
//     argument, nothing written (every backend).
//   unchecked on cuda-unfused: still checked, it reads them on the host.
//   unchecked on the fused backends (GpuKvCache.Unchecked*, run under
//     compute-sanitizer memcheck by scripts/h200-cycle): pages past the
//     pool and negative, lengths negative and past the capacity, rows out of
//     range: no Error, no CUDA error, no byte written outside the cache, o
//     and lse, and q, k_new, v_new and the vectors unchanged; the numbers
//     may be anything.
#include "gpu_test_util.hpp"

#ifdef GQATTN_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
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
constexpr Backend kFusedBackends[] = {Backend::CudaFlash, Backend::CudaHopper};

constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();

bool is_fused(Backend backend) {
  return backend == Backend::CudaFlash || backend == Backend::CudaHopper;
}

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
  // Paged: the pool holds only the pages the sequences' keys use (and two
  // spare ones); the rest of each block_table row is -1, which the rules
  // allow (only used pages are checked) and no backend may follow.
  bool compact_pool = false;
  bool with_lse = true;  // false: lse absent (data == nullptr)
  DType dtype = DType::bf16;
  uint64_t seed = 1;
};

// The host side of a run: the problem, the cache's vectors, and every
// tensor's values already rounded to the dtype.
struct Host {
  Problem problem;
  DType dtype = DType::bf16;
  int64_t cache_rows = 0, pages_per_seq = 0, slots = 0, t_new = 0;
  bool with_lse = true;
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
  int64_t keys(int64_t b) const { return seqlens[std::size_t(b)] + t_new; }
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
  h.with_lse = c.with_lse;
  std::mt19937 rng(unsigned(c.seed));
  if (c.page > 0) {
    h.pages_per_seq = c.capacity / c.page;
    // The pages each sequence owns: its whole row, or (compact_pool) those
    // its keys use.
    std::vector<int64_t> owned(std::size_t(c.B), h.pages_per_seq);
    if (c.compact_pool)
      for (int64_t b = 0; b < c.B; ++b)
        owned[std::size_t(b)] = (c.cached[std::size_t(b)] + c.t_new + c.page - 1) / c.page;
    h.cache_rows = std::accumulate(owned.begin(), owned.end(), int64_t(0)) + 2;  // two spare
    std::vector<int32_t> pages(std::size_t(h.cache_rows));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    h.table.assign(std::size_t(c.B * h.pages_per_seq), -1);
    std::size_t next = 0;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t x = 0; x < owned[std::size_t(b)]; ++x)
        h.table[std::size_t(b * h.pages_per_seq + x)] = pages[next++];
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

// Sequence b of a paged batch alone: a batch of one with b's queries, new
// keys, length and block_table row, over the same pool (so that only the
// company of other sequences differs).
Host alone(const Host& batch, int64_t b) {
  const Problem& p = batch.problem;
  const int64_t qn = p.Tq * p.H * p.d, kn = batch.t_new * p.Hkv * p.d;
  Host one = batch;
  one.problem.B = 1;
  one.seqlens = {batch.seqlens[std::size_t(b)]};
  one.table.assign(batch.table.begin() + b * batch.pages_per_seq,
                   batch.table.begin() + (b + 1) * batch.pages_per_seq);
  one.q.assign(batch.q.begin() + b * qn, batch.q.begin() + (b + 1) * qn);
  one.k_new.assign(batch.k_new.begin() + b * kn, batch.k_new.begin() + (b + 1) * kn);
  one.v_new.assign(batch.v_new.begin() + b * kn, batch.v_new.begin() + (b + 1) * kn);
  return one;
}

// The Options fields a test sets beside the backend.
struct Flags {
  bool check_offsets = true;
  bool batch_invariant = false;
};

std::string flags_name(const Flags& f) {
  std::string s = f.check_offsets ? "checked" : "unchecked";
  if (f.batch_invariant) s += ", batch_invariant";
  return s;
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
        lse(Device::cuda, lse_bytes()),
        seqlens(to_device(host.seqlens)),
        table(to_device(host.table)),
        batch_idx(to_device(host.batch_idx)) {
    k_cache.upload(encode(h.dtype, h.k_cache));
    v_cache.upload(encode(h.dtype, h.v_cache));
    q.upload(encode(h.dtype, h.q));
    k_new.upload(encode(h.dtype, h.k_new));
    v_new.upload(encode(h.dtype, h.v_new));
  }

  std::size_t lse_count() const { return std::size_t(h.problem.B * h.problem.H * h.problem.Tq); }
  std::size_t lse_bytes() const { return lse_count() * 4; }

  static OffsetsRef ints(const DeviceBuffer& b, const std::vector<int32_t>& x) {
    OffsetsRef r;
    r.data = x.empty() ? nullptr : static_cast<const int32_t*>(b.get());
    r.device = Device::cuda;
    r.size = int64_t(x.size());
    return r;
  }

  // One call, then a device synchronisation (a CUDA error throws).
  void call(Backend backend, Flags flags = {}) {
    const Problem& p = h.problem;
    KvCache cache;
    cache.k = contiguous(k_cache.data(), h.dtype, Device::cuda, h.cache_rows, h.slots, p.Hkv, p.d);
    cache.v = contiguous(v_cache.data(), h.dtype, Device::cuda, h.cache_rows, h.slots, p.Hkv, p.d);
    cache.seqlens = ints(seqlens, h.seqlens);
    cache.block_table = ints(table, h.table);
    cache.pages_per_seq = h.pages_per_seq;
    cache.batch_idx = ints(batch_idx, h.batch_idx);
    TensorRef tk_new, tv_new, tlse;
    if (h.t_new > 0) {
      tk_new = contiguous(k_new.data(), h.dtype, Device::cuda, p.B, h.t_new, p.Hkv, p.d);
      tv_new = contiguous(v_new.data(), h.dtype, Device::cuda, p.B, h.t_new, p.Hkv, p.d);
    }
    if (h.with_lse) tlse = contiguous(lse.data(), DType::f32, Device::cuda, p.B, p.H, p.Tq);
    Options options;
    options.backend = backend;
    options.check_offsets = flags.check_offsets;
    options.batch_invariant = flags.batch_invariant;
    forward_with_kv_cache(
        p, cache, contiguous(q.data(), h.dtype, Device::cuda, p.B, p.Tq, p.H, p.d), tk_new, tv_new,
        contiguous(o.data(), h.dtype, Device::cuda, p.B, p.Tq, p.H, p.d), tlse, options);
    device_synchronize();
  }

  // o and lse poisoned again (before a second call).
  void poison_outputs() {
    o.upload(
        std::vector<unsigned char>(h.q.size() * elem, static_cast<unsigned char>(kPoisonByte)));
    lse.upload(std::vector<unsigned char>(lse_bytes(), static_cast<unsigned char>(kPoisonByte)));
  }

  // A tensor's values back on the host; fails the test when a guard changed.
  std::vector<float> read(GuardedBuffer& buffer, DType dtype, std::size_t count, const char* name) {
    const varlen::Output out = varlen::read_output(buffer, count * dtype_size(dtype));
    EXPECT_TRUE(out.guards_intact) << name << ": a guard byte was written";
    return decode(dtype, out.bytes.data(), count);
  }
  std::vector<float> o_values() { return read(o, h.dtype, h.q.size(), "o"); }
  std::vector<float> lse_values() { return read(lse, DType::f32, lse_count(), "lse"); }
  // lse's bits (f32 compared as floats would take -inf == -inf but NaN != NaN).
  std::vector<unsigned char> lse_bytes_back() {
    const varlen::Output out = varlen::read_output(lse, lse_bytes());
    EXPECT_TRUE(out.guards_intact) << "lse: a guard byte was written";
    return out.bytes;
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

// ---- which backend must run what ----------------------------------------------

// "" when `backend` runs the problem, else explain()'s reason.
std::string why_not(Backend backend, const Problem& p, DType dtype) {
  const Explanation e = explain(p, dtype, Device::cuda, backend);
  return e.supported ? "" : e.reason;
}

// Whether `backend` must run a KV-cache problem of `dtype` and head dim d
// where the device and the build let it: cuda-unfused every one; the fused
// backends (their paged split-KV path) bf16/f16 with d a multiple of 8 up
// to 256.
bool must_run(Backend backend, DType dtype, int64_t d) {
  if (!is_fused(backend)) return true;
  return (dtype == DType::bf16 || dtype == DType::f16) && d >= 8 && d <= 256 && d % 8 == 0;
}

// Whether a refusal is about the device or the build, not the problem:
// "needs a CUDA device", "needs sm_80 or newer, device is sm_75", "needs
// sm_90 (wgmma/TMA), device is sm_80", "this build has no kernel image for
// sm_..", "this build has no sm_90a code", "... the device allows N KB"
// (src/cuda/common/device_query.cpp, src/cuda/*/*_backend.cpp), "not
// compiled in: ..." (src/api/registry.cpp).
bool refused_for_device_or_build(const std::string& why) {
  for (const char* marker :
       {"device", "sm_", "compute capability", "not built", "not compiled", "kernel image"})
    if (why.find(marker) != std::string::npos) return true;
  return false;
}

// "" when `backend` runs the problem; else explain()'s reason, after failing
// the test when the backend must run it and refused for something other
// than the device or the build.
std::string refusal(Backend backend, const Problem& p, DType dtype) {
  const std::string why = why_not(backend, p, dtype);
  if (!why.empty() && must_run(backend, dtype, p.d) && !refused_for_device_or_build(why))
    ADD_FAILURE() << backend_name(backend) << " refused a " << dtype_name(dtype) << " d=" << p.d
                  << (p.kv_page_size > 0 ? " paged" : " dense")
                  << " KV-cache problem that it must run: " << why;
  return why;
}

// The Flags a backend runs a correctness case with: the default split, and
// on the fused backends the batch-invariant one too.
std::vector<Flags> flag_sets(Backend backend) {
  if (is_fused(backend)) return {Flags{}, Flags{true, true}};
  return {Flags{}};
}

// ---- against the oracle --------------------------------------------------------

// What a run of a host case must give, computed once per case and dtype:
// the cache after the append, and per sequence the oracle's o and lse with
// check.hpp's tolerances (from the f32 CPU mirror's error).
struct Expected {
  std::vector<float> k_cache, v_cache;
  std::vector<oracle::ForwardResult> ref;  // per sequence (empty for one without keys)
  std::vector<double> o_tol, lse_tol;
};

Expected expected_of(const Host& h) {
  const Problem& p = h.problem;
  Expected e;
  e.k_cache = h.k_cache;
  e.v_cache = h.v_cache;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t t = 0; t < h.t_new; ++t) {
      const auto [row, s] = h.slot(b, h.seqlens[std::size_t(b)] + t);
      for (int64_t hk = 0; hk < p.Hkv; ++hk)
        for (int64_t x = 0; x < p.d; ++x) {
          const std::size_t at = std::size_t(h.cache_index(row, s, hk) + x);
          const std::size_t from = std::size_t(((b * h.t_new + t) * p.Hkv + hk) * p.d + x);
          e.k_cache[at] = h.k_new[from];
          e.v_cache[at] = h.v_new[from];
        }
    }
  const MirrorRun mirror = run_mirror(h);
  const int64_t qn = p.Tq * p.H * p.d, ln = p.H * p.Tq;
  e.ref.resize(std::size_t(p.B));
  e.o_tol.assign(std::size_t(p.B), 0.0);
  e.lse_tol.assign(std::size_t(p.B), 0.0);
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t keys = h.keys(b);
    if (keys == 0) continue;
    std::vector<double> K, V, Q(h.q.begin() + b * qn, h.q.begin() + (b + 1) * qn);
    K.reserve(std::size_t(keys * p.Hkv * p.d));
    V.reserve(std::size_t(keys * p.Hkv * p.d));
    for (int64_t pos = 0; pos < keys; ++pos) {
      const auto [row, s] = h.slot(b, pos);
      const std::size_t first = std::size_t(h.cache_index(row, s, 0));
      const std::size_t n = std::size_t(p.Hkv * p.d);
      K.insert(K.end(), e.k_cache.begin() + first, e.k_cache.begin() + first + n);
      V.insert(V.end(), e.v_cache.begin() + first, e.v_cache.begin() + first + n);
    }
    Problem dense = p;
    dense.kv_cache = false;
    dense.kv_page_size = 0;
    dense.B = 1;
    dense.Tk = keys;
    e.ref[std::size_t(b)] = oracle::forward(dense, Q, K, V);
    const oracle::ForwardResult& ref = e.ref[std::size_t(b)];
    e.o_tol[std::size_t(b)] =
        check::tolerance(h.dtype, "o", rel_error(slice(mirror.o.begin(), b * qn, qn), ref.o));
    e.lse_tol[std::size_t(b)] =
        check::tolerance(h.dtype, "lse", rel_error(slice(mirror.lse.begin(), b * ln, ln), ref.lse));
  }
  return e;
}

// Runs the host case on `backend` and checks the append, the untouched
// cache and the outputs against `e`.
void check_run(Backend backend, const Host& h, const Expected& e, Flags flags) {
  const Problem& p = h.problem;
  DeviceRun run(h);
  run.call(backend, flags);

  // The append, element by element; every other cache element untouched.
  const std::vector<float> k_after = run.read(run.k_cache, h.dtype, h.k_cache.size(), "k_cache");
  const std::vector<float> v_after = run.read(run.v_cache, h.dtype, h.v_cache.size(), "v_cache");
  int64_t k_wrong = 0, v_wrong = 0;
  for (std::size_t x = 0; x < e.k_cache.size(); ++x) {
    k_wrong += k_after[x] != e.k_cache[x];
    v_wrong += v_after[x] != e.v_cache[x];
  }
  EXPECT_EQ(k_wrong, 0) << "k_cache elements not as appended / changed";
  EXPECT_EQ(v_wrong, 0) << "v_cache elements not as appended / changed";

  // Each sequence against the oracle over keys gathered here from the
  // expected cache; the tolerance from the mirror's error on the same inputs.
  const std::vector<float> o = run.o_values();
  std::vector<float> lse;
  if (h.with_lse) {
    lse = run.lse_values();
  } else {
    const std::vector<unsigned char> all = run.lse.all();
    EXPECT_TRUE(varlen::is_poison(all.data(), all.size())) << "lse absent, but its buffer written";
  }
  const int64_t qn = p.Tq * p.H * p.d, ln = p.H * p.Tq;
  for (int64_t b = 0; b < p.B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b) + " (" + std::to_string(h.keys(b)) + " keys)");
    if (h.keys(b) == 0) {  // no key: o = 0, lse = -inf
      for (int64_t x = 0; x < qn; ++x) EXPECT_EQ(o[std::size_t(b * qn + x)], 0.0f) << "o " << x;
      for (int64_t x = 0; h.with_lse && x < ln; ++x)
        EXPECT_EQ(lse[std::size_t(b * ln + x)], -INFINITY) << "lse " << x;
      continue;
    }
    const oracle::ForwardResult& ref = e.ref[std::size_t(b)];
    EXPECT_LE(rel_error(slice(o.begin(), b * qn, qn), ref.o), e.o_tol[std::size_t(b)]) << "o";
    if (h.with_lse) {
      EXPECT_LE(rel_error(slice(lse.begin(), b * ln, ln), ref.lse), e.lse_tol[std::size_t(b)])
          << "lse";
    }
  }
}

// Runs `c` with each dtype on every CUDA backend (the fused ones with each
// of flag_sets); a backend that must run a case and refuses it fails
// (refusal); skips (with the reasons) when no backend runs it.
void check_everywhere(Case c, std::vector<DType> dtypes = {DType::bf16, DType::f16, DType::f32}) {
  std::string skipped;
  int ran = 0;
  for (DType dtype : dtypes) {
    c.dtype = dtype;
    const Host h = make_host(c);
    std::optional<Expected> expected;  // computed once, when a backend runs the case
    for (Backend backend : kCudaBackends) {
      SCOPED_TRACE(std::string(backend_name(backend)) + " " + dtype_name(dtype));
      const std::string why = refusal(backend, h.problem, dtype);
      if (!why.empty()) {
        skipped +=
            std::string("\n  ") + backend_name(backend) + " " + dtype_name(dtype) + ": " + why;
        continue;
      }
      if (!expected) expected = expected_of(h);
      for (const Flags& flags : flag_sets(backend)) {
        SCOPED_TRACE(flags_name(flags));
        check_run(backend, h, *expected, flags);
      }
      ++ran;
    }
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

// lse is optional: o as with it, and lse's buffer untouched.
TEST(GpuKvCache, WithoutLse) {
  GQATTN_SKIP_WITHOUT_CUDA();
  Case c;
  c.page = 16;
  c.capacity = 64;
  c.cached = {40, 0, 61};
  c.with_lse = false;
  check_everywhere(c, {DType::bf16, DType::f16});
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

// Head dims the fused kernels pad (80 to 96 or 128, 96 to 128), on pages of
// 3 (a page boundary inside every key tile), one of them with a softcap;
// sequences of hundreds of keys, so that the keys are split.
TEST(GpuKvCache, PaddedHeadDimensionsOnPagesOf3) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (int64_t d : {80, 96}) {
    SCOPED_TRACE("d " + std::to_string(d));
    Case c;
    c.d = d;
    c.page = 3;
    c.capacity = 603;
    c.cached = {590, 0, 301};
    c.Tq = 3;
    c.t_new = 2;
    c.H = 8;
    c.Hkv = 2;
    c.softcap = d == 96 ? 20.0f : 0.0f;
    c.seed = 30 + uint64_t(d);
    check_everywhere(c, {DType::bf16});
  }
}

// A decoding step over long caches: Tq = 1, GQA 32/8, d 128, pages of 16,
// lengths of thousands beside short and empty ones; with one new key and
// without (then sequence 3 has no key: o = 0, lse = -inf beside split
// sequences).
TEST(GpuKvCache, LongDecodingStep) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (int64_t t_new : {1, 0}) {
    SCOPED_TRACE("t_new " + std::to_string(t_new));
    Case c;
    c.B = 4;
    c.Tq = 1;
    c.H = 32;
    c.Hkv = 8;
    c.d = 128;
    c.page = 16;
    c.capacity = 257 * 16;  // 4112 >= 4099 + 1
    c.cached = {4099, 17, 2500, 0};
    c.t_new = t_new;
    c.compact_pool = true;
    c.seed = 40 + uint64_t(t_new);
    check_everywhere(c, {DType::bf16, DType::f16});
  }
}

// MQA (one key/value head for 16 query heads), d 64, a long dense cache
// with cache_batch_idx: decoding (Tq = 1) and a short chunk (Tq = 4).
TEST(GpuKvCache, LongDecodingMqaDenseCache) {
  GQATTN_SKIP_WITHOUT_CUDA();
  for (int64_t tq : {1, 4}) {
    SCOPED_TRACE("Tq " + std::to_string(tq));
    Case c;
    c.B = 4;
    c.Tq = tq;
    c.H = 16;
    c.Hkv = 1;
    c.d = 64;
    c.capacity = 4010;
    c.cached = {3001, 1, 1234, 4000};
    c.t_new = tq;
    c.use_batch_idx = true;
    c.seed = 50 + uint64_t(tq);
    check_everywhere(c, {DType::bf16, DType::f16});
  }
}

// A chunked prefill: 70 new keys appended after ~1000 cached ones, then
// their 70 queries attend (causal, window 100) over the cache, d 256.
TEST(GpuKvCache, ChunkedPrefillWithWindow) {
  GQATTN_SKIP_WITHOUT_CUDA();
  Case c;
  c.B = 2;
  c.Tq = 70;
  c.t_new = 70;
  c.H = 4;
  c.Hkv = 2;
  c.d = 256;
  c.page = 16;
  c.capacity = 67 * 16;  // 1072 >= 1000 + 70
  c.cached = {1000, 931};
  c.window = 100;
  c.compact_pool = true;
  c.seed = 60;
  check_everywhere(c, {DType::bf16, DType::f16});
}

// ---- bits ----------------------------------------------------------------------

// o's and lse's bits of sequence b of a batch run equal those of a run of
// it alone.
void expect_same_bits_as_alone(DeviceRun& whole, DeviceRun& one, int64_t b) {
  const Problem& p = whole.h.problem;
  const int64_t qn = p.Tq * p.H * p.d, ln = p.H * p.Tq;
  const std::vector<float> o = whole.o_values(), one_o = one.o_values();
  const std::vector<unsigned char> lse = whole.lse_bytes_back(), one_lse = one.lse_bytes_back();
  EXPECT_EQ(0, std::memcmp(one_o.data(), o.data() + b * qn, std::size_t(qn) * sizeof(float)))
      << "o of sequence " << b;
  EXPECT_EQ(0, std::memcmp(one_lse.data(), lse.data() + b * ln * 4, std::size_t(ln) * 4))
      << "lse of sequence " << b;
}

// A sequence alone (B = 1, its own page-table row) gives the same bits as
// in the batch: o and lse (the fused backends with Options::batch_invariant;
// cuda-unfused never depends on the batch).
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
    if (!refusal(backend, batch.problem, c.dtype).empty()) continue;
    const Flags flags{true, is_fused(backend)};
    DeviceRun whole(batch);
    whole.call(backend, flags);
    for (int64_t b = 0; b < c.B; ++b) {
      const Host one_host = alone(batch, b);
      DeviceRun one(one_host);
      one.call(backend, flags);
      expect_same_bits_as_alone(whole, one, b);
    }
  }
}

// One long sequence (5000 cached keys) alone and in a batch of 9 of mixed
// lengths (two other long ones among them): the grid, and so a default
// plan's split of its keys, differs a lot; with Options::batch_invariant its
// o and lse bits must not. Decoding (Tq = 1) and a short chunk (Tq = 5), the
// new keys appended. Whether the default plan's bits differed is printed:
// if they never do, this test shows little.
TEST(GpuKvCache, ALongSequenceGivesTheSameBitsAloneAndInAMixedBatch) {
  GQATTN_SKIP_WITHOUT_CUDA();
  constexpr int64_t kLong = 4;  // the 5000-key sequence, in the middle of the batch
  int ran = 0;
  for (int64_t tq : {1, 5}) {
    SCOPED_TRACE("Tq " + std::to_string(tq));
    Case c;
    c.B = 9;
    c.Tq = tq;
    c.t_new = tq;
    c.H = 8;
    c.Hkv = 2;
    c.d = 128;
    c.page = 16;
    c.capacity = 313 * 16;  // 5008 >= 5000 + 5
    c.cached = {3, 700, 0, 1200, 5000, 64, 4990, 17, 250};
    c.compact_pool = true;
    c.seed = 70 + uint64_t(tq);
    const Host batch = make_host(c);
    const Host one_host = alone(batch, kLong);
    for (Backend backend : kCudaBackends) {
      SCOPED_TRACE(backend_name(backend));
      if (!refusal(backend, batch.problem, c.dtype).empty()) continue;
      ++ran;
      const Flags flags{true, is_fused(backend)};
      DeviceRun whole(batch), one(one_host);
      whole.call(backend, flags);
      one.call(backend, flags);
      expect_same_bits_as_alone(whole, one, kLong);
      if (!is_fused(backend)) continue;
      DeviceRun whole_default(batch), one_default(one_host);
      whole_default.call(backend);
      one_default.call(backend);
      const int64_t qn = tq * c.H * c.d;
      const std::vector<float> o = whole_default.o_values(), one_o = one_default.o_values();
      const bool differ =
          std::memcmp(one_o.data(), o.data() + kLong * qn, std::size_t(qn) * sizeof(float)) != 0;
      std::printf("%s Tq=%lld: the default plan gave %s bits alone and in the batch\n",
                  backend_name(backend), static_cast<long long>(tq),
                  differ ? "different" : "the same");
    }
  }
  if (ran == 0) GTEST_SKIP() << "no CUDA backend runs it";
}

// The same call twice gives the same bits (default options): long
// sequences, so that the fused backends split their keys over thread
// blocks and combine the parts. The second call appends the same keys to
// the same slots, so its inputs are the first's.
TEST(GpuKvCache, TheSameCallTwiceGivesTheSameBits) {
  GQATTN_SKIP_WITHOUT_CUDA();
  int ran = 0;
  for (int64_t tq : {1, 4}) {
    SCOPED_TRACE("Tq " + std::to_string(tq));
    Case c;
    c.B = 3;
    c.Tq = tq;
    c.t_new = 1;
    c.H = 8;
    c.Hkv = 2;
    c.d = 128;
    c.page = 16;
    c.capacity = 256 * 16;  // 4096 >= 4090 + 1
    c.cached = {3000, 2500, 4090};
    c.compact_pool = true;
    c.seed = 80 + uint64_t(tq);
    for (DType dtype : {DType::bf16, DType::f16}) {
      c.dtype = dtype;
      const Host h = make_host(c);
      for (Backend backend : kCudaBackends) {
        SCOPED_TRACE(std::string(backend_name(backend)) + " " + dtype_name(dtype));
        if (!refusal(backend, h.problem, dtype).empty()) continue;
        ++ran;
        DeviceRun run(h);
        run.call(backend);
        const std::vector<float> o = run.o_values();
        const std::vector<unsigned char> lse = run.lse_bytes_back();
        run.poison_outputs();
        run.call(backend);
        const std::vector<float> o2 = run.o_values();
        EXPECT_EQ(0, std::memcmp(o.data(), o2.data(), o.size() * sizeof(float))) << "o";
        EXPECT_EQ(lse, run.lse_bytes_back()) << "lse";
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no CUDA backend runs it";
}

// ---- bad int32 vectors ----------------------------------------------------------

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
    if (!refusal(backend, good.problem, c.dtype).empty()) continue;
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
      if (!refusal(backend, h.problem, dense.dtype).empty()) continue;
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
    run.call(Backend::CudaUnfused, Flags{/*check_offsets=*/false, /*batch_invariant=*/false});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.argument().find("block_table"), std::string::npos) << e.what();
  }
}

// One unchecked call with bad vectors on a fused backend: no Error, no CUDA
// error; no guard byte written, q, k_new, v_new and the vectors unchanged.
// Returns false when the device is left unusable (stop there).
bool expect_unchecked_call_stays_inside(Backend backend, const Host& bad, Flags flags) {
  DeviceRun run(bad);
  try {
    run.call(backend, flags);  // synchronises: a CUDA error throws
  } catch (const Error& e) {
    ADD_FAILURE() << "unchecked bad vectors threw: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "CUDA error after the call: " << e.what();
    return false;
  }
  const cudaError_t last = cudaGetLastError();
  EXPECT_EQ(last, cudaSuccess) << "cudaGetLastError: " << cudaGetErrorString(last);
  if (last != cudaSuccess) return false;
  auto guards = [](GuardedBuffer& buffer, std::size_t bytes, const char* name) {
    EXPECT_TRUE(varlen::read_output(buffer, bytes).guards_intact)
        << name << ": a byte outside it was written";
  };
  guards(run.k_cache, bad.k_cache.size() * run.elem, "k_cache");
  guards(run.v_cache, bad.v_cache.size() * run.elem, "v_cache");
  guards(run.o, bad.q.size() * run.elem, "o");
  guards(run.lse, run.lse_bytes(), "lse");
  auto unchanged = [](GuardedBuffer& buffer, const std::vector<unsigned char>& bytes,
                      const char* name) {
    const varlen::Output out = varlen::read_output(buffer, bytes.size());
    EXPECT_TRUE(out.guards_intact && out.bytes == bytes) << name << " (an input) was written";
  };
  unchanged(run.q, encode(bad.dtype, bad.q), "q");
  unchanged(run.k_new, encode(bad.dtype, bad.k_new), "k_new");
  unchanged(run.v_new, encode(bad.dtype, bad.v_new), "v_new");
  if (!bad.seqlens.empty()) {
    EXPECT_EQ(run.seqlens.download<int32_t>(), bad.seqlens) << "cache_seqlens written";
  }
  if (!bad.table.empty()) {
    EXPECT_EQ(run.table.download<int32_t>(), bad.table) << "block_table written";
  }
  if (!bad.batch_idx.empty()) {
    EXPECT_EQ(run.batch_idx.download<int32_t>(), bad.batch_idx) << "cache_batch_idx written";
  }
  return true;
}

// Bad int32 vectors without the check (Options::check_offsets = false) on
// the fused backends, which read them on the device and clamp every index:
// the numbers may be anything, but the call returns without an Error or a
// CUDA error and writes nothing outside the cache, o and lse (guard bytes),
// and no input. Decoding (Tq = 1) and a chunk (Tq = 4), the default split
// and the batch-invariant one. Meant to run under compute-sanitizer
// memcheck too (--gtest_filter='*GpuKvCache.Unchecked*').
TEST(GpuKvCache, UncheckedBadVectorsStayInsideTheTensors) {
  GQATTN_SKIP_WITHOUT_CUDA();
  struct Bad {
    std::string what;
    std::function<void(Host&)> spoil;
  };
  Case paged;
  paged.page = 16;
  paged.capacity = 64 * 16;  // 1024
  paged.cached = {1000, 7, 600};
  paged.t_new = 2;
  paged.Hkv = 2;
  paged.H = 8;
  const int64_t pps = paged.capacity / paged.page;
  const std::vector<Bad> paged_bad = {
      {"block_table past the pool",
       [](Host& h) {
         h.table[1] = int32_t(h.cache_rows);
         h.table[std::size_t(h.pages_per_seq)] = int32_t(h.cache_rows + 1000);
         h.table[std::size_t(2 * h.pages_per_seq + 37)] = kInt32Max;
       }},
      {"block_table negative",
       [](Host& h) {
         h.table[0] = -1;
         h.table[std::size_t(h.pages_per_seq)] = -1000;
         h.table[std::size_t(2 * h.pages_per_seq + 37)] = kInt32Min;
       }},
      {"block_table: two sequences append to one page",
       [pps](Host& h) { h.table[std::size_t(pps)] = h.table[std::size_t(1000 / 16)]; }},
      {"cache_seqlens negative",
       [](Host& h) {
         h.seqlens = {-1, -1000, kInt32Min};
       }},
      {"cache_seqlens past the capacity",
       [](Host& h) {
         const int32_t tk = int32_t(h.problem.Tk);
         h.seqlens = {tk - 1, tk + 5000, kInt32Max};
       }},
      {"everything",
       [](Host& h) {
         h.table[0] = kInt32Min;
         h.table[5] = int32_t(h.cache_rows);
         h.table[std::size_t(h.pages_per_seq + 1)] = -7;
         h.table.back() = kInt32Max;
         h.seqlens = {kInt32Max, -3, int32_t(h.problem.Tk)};
       }},
  };
  Case dense;
  dense.capacity = 300;
  dense.cached = {290, 0, 150};
  dense.t_new = 2;
  dense.use_batch_idx = true;
  dense.Hkv = 2;
  dense.H = 8;
  const std::vector<Bad> dense_bad = {
      {"cache_batch_idx past the rows",
       [](Host& h) {
         h.batch_idx[1] = int32_t(h.cache_rows);
         h.batch_idx[2] = kInt32Max;
       }},
      {"cache_batch_idx negative",
       [](Host& h) {
         h.batch_idx[0] = -1;
         h.batch_idx[2] = kInt32Min;
       }},
      {"cache_batch_idx: two sequences append to one row",
       [](Host& h) { h.batch_idx[1] = h.batch_idx[0]; }},
      {"dense cache_seqlens out of range",
       [](Host& h) {
         h.seqlens = {kInt32Min, int32_t(h.problem.Tk) - 1, kInt32Max};
       }},
      {"dense everything",
       [](Host& h) {
         h.batch_idx = {kInt32Max, -2, int32_t(h.cache_rows)};
         h.seqlens = {-5, kInt32Max, int32_t(h.problem.Tk) + 1};
       }},
  };
  Case dense_no_idx = dense;
  dense_no_idx.use_batch_idx = false;
  const std::vector<Bad> no_idx_bad = {
      {"dense cache_seqlens out of range (no cache_batch_idx)",
       [](Host& h) {
         h.seqlens = {kInt32Min, int32_t(h.problem.Tk) + 1, kInt32Max};
       }},
  };

  std::string skipped;
  int ran = 0;
  for (Backend backend : kFusedBackends) {
    SCOPED_TRACE(backend_name(backend));
    for (int64_t tq : {1, 4}) {
      for (auto [base, bads] :
           {std::make_pair(paged, &paged_bad), std::make_pair(dense, &dense_bad),
            std::make_pair(dense_no_idx, &no_idx_bad)}) {
        base.Tq = tq;
        const Host good = make_host(base);
        const std::string why = refusal(backend, good.problem, base.dtype);
        if (!why.empty()) {
          const std::string line = std::string("\n  ") + backend_name(backend) + ": " + why;
          if (skipped.find(line) == std::string::npos) skipped += line;
          continue;
        }
        ++ran;
        for (const Bad& bad : *bads)
          for (const Flags& flags : {Flags{false, false}, Flags{false, true}}) {
            SCOPED_TRACE(bad.what + ", Tq " + std::to_string(tq) + ", " + flags_name(flags));
            Host h = good;
            bad.spoil(h);
            if (!expect_unchecked_call_stays_inside(backend, h, flags)) return;
          }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no fused backend ran it:" << skipped;
  if (!skipped.empty()) std::printf("skipped:%s\n", skipped.c_str());
}

}  // namespace
}  // namespace gqattn::test

#endif  // GQATTN_WITH_CUDA
