// gqattn_bench: times gqattn's forward and backward on one GPU and prints
// one JSON line per shape (TFLOP/s with FLOPs counted exactly from the mask,
// docs/performance.md: forward 4 * d * H * B * kept pairs, backward 2.5x that).
// Checked by running it (bench/side_by_side.py drives it); it verifies
// nothing about correctness — the tests do.
//
// Method: random normal inputs (mean 0.5, never zeros); several copies of
// every tensor, rotated between calls, so that together they exceed the L2
// cache; warm-up calls, then every call timed alone between two CUDA events
// on a private stream; the median is reported.
//
//   gqattn_bench [--standard] [--shape B,Tq,Tk,H,Hkv,d,causal,window,softcap]...
//                [--varlen LENS,H,Hkv,d,causal,window,softcap]...
//                [--kv-cache LENS,Tq,H,Hkv,d,page,causal,window,softcap]...
//                [--dtype bf16|f16] [--backend NAME] [--warmup N] [--repeats N]
//                [--no-backward] [--nondeterministic] [--batch-invariant] [--release-workspace]
//                [--idle-ms N] [--settle-ms N] [--spin-ahead-us N] [--back-to-back]
//                [--call-times] [--force SPEC]
//
// --varlen times a packed variable-length batch (docs/semantics.md,
// "Variable-length batches"): LENS is the sequences' lengths separated by
// '/', each either one length (Tq_b = Tk_b) or Tq_b:Tk_b, e.g.
// "4096/128/8192" or "1:4096/16:4096". The offsets live on the device and
// the calls pass Options::check_offsets = false, as a training step under
// torch.compile or a CUDA graph does (no host read per call). Its line
// gives "varlen": true, the lengths ("seqlens_q", "seqlens_k"), B as the
// number of sequences, Tq and Tk as the longest ones, and "kept_pairs"
// summed over the sequences (FLOPs 4 * d * H * that).
// --kv-cache times forward_with_kv_cache (docs/semantics.md, "KV cache"), a
// decoding step or a short chunk: LENS is the keys already cached per
// sequence, separated by '/' (as --varlen's, without the Nq:Nk form), and
// each sequence attends with Tq queries to its LENS[b] keys (no new keys).
// page 0 is a dense cache [B, capacity, Hkv, d] whose capacity is the
// longest length rounded up to kDenseCacheRound; page > 0 a paged cache of
// exactly the pages the sequences use, handed out in a shuffled (seeded)
// order, as a serving engine's pool is after a while, with a block table
// [B, pages_per_seq]. seqlens and the block table live on the device and
// the calls pass check_offsets = false (no host read per call, as under a
// CUDA graph; a backend that must read them on the host still does).
// Its line gives "kv_cache": true, the lengths ("seqlens_k"), B as the
// number of sequences, Tk as the capacity per sequence, "kept_pairs"
// summed over the sequences, and, decoding being bound by memory, "bytes":
// what a call must move, the K and V rows its queries keep (the cached
// keys, fewer under a window: "keys_read") plus q and o (lse, seqlens and
// the block table not counted), and "tbps", those bytes over the median
// time. Forward only. Up to kMaxKvSets sets rather than 16, so that the
// rotation exceeds the L2 even for a small cache. The caches hold a random
// block repeated (kPatternElems values, an odd count: rows of a
// power-of-two width repeat only that many rows apart), since drawing tens
// of GB of random numbers on the host would take minutes.
// bench/decode.py drives it.
// --batch-invariant passes Options::batch_invariant = true (KV-cache calls
// on the fused backends: a sequence's key split by its own length only);
// a --kv-cache line says which in "batch_invariant".
// Each line gives the plan the backend runs for the shape, as
// gqattn::explain describes it, in "fwd_plan" and "bwd_plan".
// --force SPEC forces a fused backend's plan for every call
// (api/plan_override.hpp, e.g. "dq=separate", "splits=3",
// "dkdv_group=0", "dkdv_tile=small", comma separated), to compare a path
// with the rule's; a forced path the backend cannot take is recorded as the
// shape's "error" (or "bwd_skipped"). Each line says which in "force" (""
// when nothing is forced).
// --nondeterministic passes Options::deterministic = false (cuda-flash's
// backward then adds dQ with atomics); each line says which in
// "deterministic".
// --release-workspace calls gqattn::release_workspace_memory() after every
// timed call's synchronisation (outside the timed window, and once after the
// warm-up), so every timed call maps its workspace afresh, as every call
// after a synchronisation did before the library kept a pool of its own:
// an A/B of the retained workspace in one run. Each line says which in
// "release_workspace".
// --idle-ms N drains the stream and sleeps N ms on the host before every
// timed call (outside the timed window), so the GPU idles between calls:
// if a kernel is slower back to back than after a pause (power or thermal
// limits), this shows it. bench/side_by_side.py --idle-ms passes it.
// Each line says which in "idle_ms".
// --spin-ahead-us N queues a GPU spin of N microseconds in front of every
// timed call (spin_ahead.hpp), so that the host has queued the call before
// its start event fires: the time is the GPU's alone, not the host's
// launch latency, which grows after an idle pause. Each pass's
// "fwd_enqueue_us" / "bwd_enqueue_us" is the median host time from before
// the start event to after the stop event was queued, and with a spin,
// "fwd_spin_short" / "bwd_spin_short" counts the timed calls whose queueing
// outlasted the spin (they include host time). Each line says which in
// "spin_ahead_us". bench/side_by_side.py --spin-ahead-us passes it.
// --back-to-back queues all timed calls of a pass at once, after the spin,
// with an event between each two and no synchronisation: the GPU runs them
// without a gap, as in training, and each call's time is the GPU's while
// the host keeps ahead. "*_enqueue_us" is then the median host time
// between two calls queued, and "*_spin_short" counts the calls the host
// may have queued only after the GPU was ready for them (it waited inside
// their window). Not with --idle-ms. Each line says which in
// "back_to_back"; bench/side_by_side.py --back-to-back passes it.
// --settle-ms N lets the GPU idle N ms (the stream drained, then a host
// sleep) once before each pass's warm-up, meant to start every pass from
// the same state of the power limiter whatever ran before it (a burst's
// speed depends on the previous measurement's heat). Measured at 500 ms
// (2026-12-04, H200): it narrowed both sides' spread in one run of two.
// bench/side_by_side.py --settle passes it and idles PyTorch's passes the
// same way. Each line says which in "settle_ms".
// --call-times adds every timed call's milliseconds, in call order, as
// "fwd_call_ms" / "bwd_call_ms": whether the median hides a change within
// the calls, such as the power limiter's onset (bench/call_series.py).
// Each line also gives the wall-clock span of each pass's timed calls,
// "fwd_wall_s" / "bwd_wall_s": [start, end] in seconds since the epoch, so
// a clock sampler running beside the bench (side_by_side.py's) can tell
// the SM clock and power during them.
// Where NVML's energy counter answers (nvml_energy.hpp), each pass also
// gives "fwd_nvml_joules" / "bwd_nvml_joules", the counter's difference over
// its timed calls (idle gaps included: host syncs, --idle-ms), and
// "fwd_nvml_pj_per_flop" / "bwd_nvml_pj_per_flop", those joules over the
// FLOPs of all the timed calls (side_by_side.py's own "fwd_pj_per_flop" is
// the rougher estimate from nvidia-smi's power samples).
// Under the H200's power cap a kernel runs as fast as its energy per FLOP
// allows (2026-12-01, H200; docs/performance.md). The counter is coarse:
// read it over a second or more of calls (--repeats).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/plan_override.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"
#include "nvml_energy.hpp"
#include "spin_ahead.hpp"

namespace {

constexpr std::size_t kRotateBytes = std::size_t(256) << 20;  // > 4x the L2 of an H100/H200
constexpr int kMaxSets = 16;
// --kv-cache: a decoding step moves a few MB; 16 sets of it would sit in L2.
constexpr int kMaxKvSets = 256;
constexpr int64_t kDenseCacheRound = 256;  // a dense cache's capacity: a multiple of this
constexpr std::size_t kPatternElems = (1 << 20) + 1;  // --kv-cache: the random block repeated
constexpr float kInputMean = 0.5f;
constexpr unsigned kSeed = 20261201;
constexpr double kFlopsPerPairPerDim = 4.0;  // QK^T and PV, 2 FLOPs per multiply-add
constexpr double kBackwardFlopFactor = 2.5;
constexpr int kDefaultWarmup = 5;
constexpr int kDefaultRepeats = 30;
constexpr int kPciBusIdChars = 32;  // "0000:00:00.0" and room; cudaDeviceGetPCIBusId needs >= 13

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "gqattn_bench: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(2);
  }
}

// printf into a string: each JSON line is printed whole, or not at all.
void append(std::string& out, const char* format, ...) {
  constexpr int kLineBytes = 1024;
  char buffer[kLineBytes];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  out += buffer;
}

// The standard benchmark shapes (bf16, GQA 32/8 unless noted; docs/performance.md).
std::vector<gqattn::Problem> standard_shapes() {
  return {
      gqattn::make_problem(16, 1024, 1024, 32, 8, 128, true, 0, 0.0f),
      gqattn::make_problem(4, 4096, 4096, 32, 8, 128, true, 0, 0.0f),
      gqattn::make_problem(1, 16384, 16384, 32, 8, 128, true, 0, 0.0f),
      gqattn::make_problem(4, 4096, 4096, 32, 8, 128, false, 0, 0.0f),
      gqattn::make_problem(4, 4096, 4096, 32, 8, 64, true, 0, 0.0f),
      gqattn::make_problem(4, 4096, 4096, 16, 8, 256, true, 0, 0.0f),
      gqattn::make_problem(2, 8192, 8192, 16, 8, 256, true, 4096, 50.0f),
      gqattn::make_problem(4, 4096, 4096, 32, 8, 128, true, 1024, 0.0f),
      gqattn::make_problem(4, 4096, 4096, 32, 8, 128, true, 0, 30.0f),
  };
}

// A problem to time: dense, a varlen batch with its sequences' lengths, or
// a KV-cache call with its sequences' cached keys (lens_k).
struct Case {
  gqattn::Problem p;
  std::vector<int32_t> lens_q, lens_k;  // varlen; lens_k also a KV cache's
};

gqattn::Problem parse_shape(const std::string& text) {
  std::vector<double> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atof(item.c_str()));
  if (v.size() != 9) {
    std::fprintf(stderr, "gqattn_bench: --shape wants B,Tq,Tk,H,Hkv,d,causal,window,softcap\n");
    std::exit(2);
  }
  return gqattn::make_problem(int64_t(v[0]), int64_t(v[1]), int64_t(v[2]), int64_t(v[3]),
                              int64_t(v[4]), int64_t(v[5]), v[6] != 0.0, int64_t(v[7]),
                              float(v[8]));
}

// --varlen LENS,H,Hkv,d,causal,window,softcap (LENS: "a/b:c/...").
Case parse_varlen(const std::string& text) {
  const auto fail = [] {
    std::fprintf(stderr,
                 "gqattn_bench: --varlen wants LENS,H,Hkv,d,causal,window,softcap with LENS "
                 "lengths separated by '/', each N or Nq:Nk (N >= 0)\n");
    std::exit(2);
  };
  const std::size_t comma = text.find(',');
  if (comma == std::string::npos) fail();
  Case c;
  std::stringstream lens(text.substr(0, comma));
  std::string item;
  while (std::getline(lens, item, '/')) {
    const std::size_t colon = item.find(':');
    const long q = std::atol(item.substr(0, colon).c_str());
    const long k = colon == std::string::npos ? q : std::atol(item.substr(colon + 1).c_str());
    if (item.empty() || q < 0 || k < 0) fail();
    c.lens_q.push_back(int32_t(q));
    c.lens_k.push_back(int32_t(k));
  }
  if (c.lens_q.empty()) fail();
  std::vector<double> v;
  std::stringstream rest(text.substr(comma + 1));
  while (std::getline(rest, item, ',')) v.push_back(std::atof(item.c_str()));
  if (v.size() != 6) fail();
  const int64_t max_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
  const int64_t max_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
  c.p = gqattn::make_problem(int64_t(c.lens_q.size()), std::max<int64_t>(max_q, 1),
                             std::max<int64_t>(max_k, 1), int64_t(v[0]), int64_t(v[1]),
                             int64_t(v[2]), v[3] != 0.0, int64_t(v[4]), float(v[5]));
  c.p.varlen = true;
  return c;
}

// --kv-cache LENS,Tq,H,Hkv,d,page,causal,window,softcap (LENS: "a/b/...").
Case parse_kv_cache(const std::string& text) {
  const auto fail = [] {
    std::fprintf(stderr,
                 "gqattn_bench: --kv-cache wants LENS,Tq,H,Hkv,d,page,causal,window,softcap "
                 "with LENS the cached keys per sequence separated by '/' (N >= 0), Tq >= 1, "
                 "page >= 0 (0: a dense cache)\n");
    std::exit(2);
  };
  const std::size_t comma = text.find(',');
  if (comma == std::string::npos) fail();
  Case c;
  std::stringstream lens(text.substr(0, comma));
  std::string item;
  while (std::getline(lens, item, '/')) {
    const long k = std::atol(item.c_str());
    if (item.empty() || item.find(':') != std::string::npos || k < 0) fail();
    c.lens_k.push_back(int32_t(k));
  }
  if (c.lens_k.empty()) fail();
  std::vector<double> v;
  std::stringstream rest(text.substr(comma + 1));
  while (std::getline(rest, item, ',')) v.push_back(std::atof(item.c_str()));
  if (v.size() != 8 || v[0] < 1 || v[4] < 0) fail();
  const int64_t page = int64_t(v[4]);
  const int64_t longest = std::max<int64_t>(1, *std::max_element(c.lens_k.begin(), c.lens_k.end()));
  // The capacity per sequence: whole pages, or a dense row rounded up.
  const int64_t round = page > 0 ? page : kDenseCacheRound;
  const int64_t capacity = (longest + round - 1) / round * round;
  c.p = gqattn::make_problem(int64_t(c.lens_k.size()), int64_t(v[0]), capacity, int64_t(v[1]),
                             int64_t(v[2]), int64_t(v[3]), v[5] != 0.0, int64_t(v[6]), float(v[7]));
  c.p.kv_cache = true;
  c.p.kv_page_size = page;
  return c;
}

// Sequence b alone, as a dense problem: Tq_b queries over Tk_b keys (a KV
// cache's: Tq over its cached keys, the queries at the end).
gqattn::Problem sequence_problem(const Case& c, std::size_t b) {
  gqattn::Problem one = c.p;
  one.varlen = false;
  one.kv_cache = false;
  one.kv_page_size = 0;
  one.B = 1;
  one.Tq = c.p.kv_cache ? c.p.Tq : c.lens_q[b];
  one.Tk = c.lens_k[b];
  return one;
}

// (query, key) pairs kept in one head, over the whole batch.
double batch_kept_pairs(const Case& c) {
  if (!c.p.varlen && !c.p.kv_cache) return double(c.p.B) * double(c.p.kept_pairs());
  double pairs = 0.0;
  for (std::size_t b = 0; b < c.lens_k.size(); ++b)
    pairs += double(sequence_problem(c, b).kept_pairs());
  return pairs;
}

// --kv-cache: the cached keys some query keeps, over the batch: all of a
// sequence's keys but those left of the first query's window (a causal mask
// drops none: the last query sees every cached key).
double kv_keys_read(const Case& c) {
  double keys = 0.0;
  for (std::size_t b = 0; b < c.lens_k.size(); ++b) {
    const gqattn::Problem one = sequence_problem(c, b);
    const int64_t w = one.effective_window();
    const int64_t first = w > 0 ? std::max<int64_t>(0, one.query_start() - w + 1) : 0;
    keys += double(std::max<int64_t>(0, one.Tk - first));
  }
  return keys;
}

// A KV cache's layout: a paged cache's pool and block table (dense: none).
struct KvLayout {
  int64_t pages_per_seq = 0;
  int64_t num_pages = 0;
  std::vector<int32_t> block_table;  // [B, pages_per_seq]
};

// Exactly the pages the sequences use, in a shuffled (seeded) order;
// entries past a sequence's pages point at page 0 (never read).
KvLayout kv_layout(const Case& c) {
  KvLayout out;
  const int64_t page = c.p.kv_page_size;
  if (page <= 0) return out;
  out.pages_per_seq = c.p.Tk / page;
  int64_t used = 0;
  for (const int32_t n : c.lens_k) used += (int64_t(n) + page - 1) / page;
  out.num_pages = std::max<int64_t>(1, used);
  std::vector<int32_t> order(std::size_t(out.num_pages));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::mt19937 rng(kSeed + 1);
  std::shuffle(order.begin(), order.end(), rng);
  out.block_table.assign(std::size_t(c.p.B * out.pages_per_seq), 0);
  std::size_t next = 0;
  for (std::size_t b = 0; b < c.lens_k.size(); ++b)
    for (int64_t x = 0; x < (int64_t(c.lens_k[b]) + page - 1) / page; ++x)
      out.block_table[b * std::size_t(out.pages_per_seq) + std::size_t(x)] = order[next++];
  return out;
}

std::vector<int32_t> prefix_sums(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu(1, 0);
  for (const int32_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

struct DeviceTensor {
  void* data = nullptr;
  std::size_t bytes = 0;
};

DeviceTensor device_alloc(std::size_t bytes) {
  DeviceTensor t;
  t.bytes = bytes;
  check(cudaMalloc(&t.data, bytes), "cudaMalloc");
  return t;
}

std::vector<uint16_t> random_16bit(std::size_t n, gqattn::DType dtype, std::mt19937& rng) {
  std::normal_distribution<float> normal(kInputMean, 1.0f);
  std::vector<uint16_t> out(n);
  for (auto& x : out)
    x = dtype == gqattn::DType::bf16 ? gqattn::float_to_bf16(normal(rng))
                                     : gqattn::float_to_f16(normal(rng));
  return out;
}

// Fills t's first `elems` 16-bit values with `values` repeated: uploads
// them once, then doubles the filled part on the device.
void upload_repeated(const DeviceTensor& t, const std::vector<uint16_t>& values, std::size_t elems,
                     const char* what) {
  const std::size_t elem = sizeof(uint16_t);
  auto* base = static_cast<unsigned char*>(t.data);
  std::size_t done = std::min(elems, values.size());
  check(cudaMemcpy(base, values.data(), done * elem, cudaMemcpyHostToDevice), what);
  while (done < elems) {
    const std::size_t n = std::min(done, elems - done);
    check(cudaMemcpy(base + done * elem, base, n * elem, cudaMemcpyDeviceToDevice), what);
    done += n;
  }
}

// One copy of every tensor a forward and backward touch (a KV-cache call:
// q, k and v as the caches, o, lse).
struct Set {
  DeviceTensor q, k, v, o, lse, dout, dq, dk, dv;
};

double median(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : double(x[x.size() / 2]);
}

struct Settings {
  gqattn::DType dtype = gqattn::DType::bf16;
  gqattn::Backend backend = gqattn::Backend::CudaFlash;
  int warmup = kDefaultWarmup;
  int repeats = kDefaultRepeats;
  bool backward = true;
  bool deterministic = true;           // Options::deterministic
  bool batch_invariant = false;        // Options::batch_invariant
  bool release_workspace = false;      // release_workspace_memory() after each timed call
  int idle_ms = 0;                     // host sleep before each timed call
  int settle_ms = 0;                   // host sleep before each pass's warm-up
  int spin_ahead_us = 0;               // GPU spin queued in front of each timed call
  bool back_to_back = false;           // timed calls queued at once, no synchronisation between
  bool call_times = false;             // every timed call's ms in the line
  gqattn::detail::PlanOverride force;  // --force: the plan forced on every call
};

// ', "<key>": "<text>"', whatever the text's length; its quotes become
// single quotes, its backslashes slashes (errors and plans hold neither
// escapes nor control characters).
void append_text(std::string& out, const char* key, std::string text) {
  std::replace(text.begin(), text.end(), '"', '\'');
  std::replace(text.begin(), text.end(), '\\', '/');
  out += std::string(", \"") + key + "\": \"" + text + "\"";
}

void run_shape(const Case& c, const Settings& s, cudaStream_t stream,
               const gqattn_bench::EnergyCounter& energy) {
  const gqattn::Problem& p = c.p;
  // Every call of this shape (and explain's plans) under --force.
  const gqattn::detail::ScopedPlanOverride force(s.force);
  // Exact (docs/semantics.md): per (batch, head) for a dense problem, over
  // the whole batch for a varlen or KV-cache one.
  const double pairs = p.varlen || p.kv_cache ? batch_kept_pairs(c) : double(p.kept_pairs());
  const double fwd_flops = kFlopsPerPairPerDim * double(p.d) * double(p.H) * batch_kept_pairs(c);
  std::string line;
  append(line,
         "{\"backend\": \"%s\", \"deterministic\": %s, \"release_workspace\": %s, "
         "\"idle_ms\": %d, \"settle_ms\": %d, \"spin_ahead_us\": %d, \"back_to_back\": %s, "
         "\"force\": \"%s\", \"dtype\": \"%s\", "
         "\"B\": %lld, \"Tq\": %lld, \"Tk\": %lld, \"H\": %lld, \"Hkv\": %lld, \"d\": %lld, "
         "\"causal\": %d, \"window\": %lld, \"softcap\": %g, \"kept_pairs\": %.0f",
         gqattn::backend_name(s.backend), s.deterministic ? "true" : "false",
         s.release_workspace ? "true" : "false", s.idle_ms, s.settle_ms, s.spin_ahead_us,
         s.back_to_back ? "true" : "false", gqattn::detail::to_string(s.force).c_str(),
         gqattn::dtype_name(s.dtype), (long long)p.B, (long long)p.Tq, (long long)p.Tk,
         (long long)p.H, (long long)p.Hkv, (long long)p.d, int(p.causal), (long long)p.window,
         double(p.softcap), pairs);
  const std::vector<int32_t> cu_q = prefix_sums(c.lens_q), cu_k = prefix_sums(c.lens_k);
  const int64_t rows_q = p.varlen ? cu_q.back() : p.B * p.Tq;
  const KvLayout layout = kv_layout(c);  // --kv-cache, paged
  const bool paged = p.kv_cache && p.kv_page_size > 0;
  // A KV cache's rows: its pages' slots, or B rows of its capacity.
  const int64_t rows_k = p.varlen ? cu_k.back()
                         : paged  ? layout.num_pages * p.kv_page_size
                                  : p.B * p.Tk;
  if (p.varlen) {
    const auto append_list = [&](const char* key, const std::vector<int32_t>& lens) {
      append(line, ", \"%s\": [", key);
      for (std::size_t b = 0; b < lens.size(); ++b) append(line, "%s%d", b ? ", " : "", lens[b]);
      append(line, "]");
    };
    append(line, ", \"varlen\": true");
    append_list("seqlens_q", c.lens_q);
    append_list("seqlens_k", c.lens_k);
  }
  // --kv-cache: the bytes a call must move (the K and V rows some query
  // keeps, q, o), for "tbps".
  const double kv_bytes =
      p.kv_cache ? 2.0 * kv_keys_read(c) * double(p.Hkv * p.d) * double(gqattn::dtype_size(s.dtype))
                 : 0.0;
  const double moved_bytes =
      kv_bytes + 2.0 * double(p.B * p.Tq * p.H * p.d) * double(gqattn::dtype_size(s.dtype));
  if (p.kv_cache) {
    append(line, ", \"kv_cache\": true, \"page_size\": %lld", (long long)p.kv_page_size);
    if (paged)
      append(line, ", \"pages_per_seq\": %lld, \"num_pages\": %lld",
             (long long)layout.pages_per_seq, (long long)layout.num_pages);
    append(line, ", \"batch_invariant\": %s, \"check_offsets\": false",
           s.batch_invariant ? "true" : "false");
    append(line, ", \"seqlens_k\": [");
    for (std::size_t b = 0; b < c.lens_k.size(); ++b)
      append(line, "%s%d", b ? ", " : "", c.lens_k[b]);
    append(line, "], \"keys_read\": %.0f, \"kv_bytes\": %.0f, \"bytes\": %.0f", kv_keys_read(c),
           kv_bytes, moved_bytes);
  }

  const std::size_t elem = gqattn::dtype_size(s.dtype);
  const std::size_t q_elems = std::size_t(rows_q * p.H * p.d);
  const std::size_t kv_elems = std::size_t(rows_k * p.Hkv * p.d);
  const std::size_t lse_bytes = std::size_t(p.H * rows_q) * sizeof(float);
  // A KV-cache call is forward only: q, the caches, o and lse.
  const std::size_t set_bytes = p.kv_cache ? (2 * q_elems + 2 * kv_elems) * elem + lse_bytes
                                           : (4 * q_elems + 2 * kv_elems) * elem + lse_bytes +
                                                 (q_elems + 2 * kv_elems) * elem;
  const int sets = int(std::clamp<std::size_t>((kRotateBytes + set_bytes - 1) / set_bytes, 1,
                                               p.kv_cache ? kMaxKvSets : kMaxSets));

  // --kv-cache: a random block, repeated (kPatternElems says why).
  const auto random_count = [&](std::size_t elems) {
    return p.kv_cache ? std::min(elems, kPatternElems) : elems;
  };
  std::mt19937 rng(kSeed);
  const std::vector<uint16_t> hq = random_16bit(random_count(q_elems), s.dtype, rng);
  const std::vector<uint16_t> hk = random_16bit(random_count(kv_elems), s.dtype, rng);
  const std::vector<uint16_t> hv = random_16bit(random_count(kv_elems), s.dtype, rng);
  const std::vector<uint16_t> hdo = random_16bit(p.kv_cache ? 0 : q_elems, s.dtype, rng);
  std::vector<Set> all(static_cast<std::size_t>(sets));
  for (Set& set : all) {
    set.q = device_alloc(q_elems * elem);
    set.k = device_alloc(kv_elems * elem);
    set.v = device_alloc(kv_elems * elem);
    set.o = device_alloc(q_elems * elem);
    set.lse = device_alloc(lse_bytes);
    upload_repeated(set.q, hq, q_elems, "upload q");
    upload_repeated(set.k, hk, kv_elems, "upload k");
    upload_repeated(set.v, hv, kv_elems, "upload v");
    if (p.kv_cache) continue;
    set.dout = device_alloc(q_elems * elem);
    set.dq = device_alloc(q_elems * elem);
    set.dk = device_alloc(kv_elems * elem);
    set.dv = device_alloc(kv_elems * elem);
    upload_repeated(set.dout, hdo, q_elems, "upload do");
  }

  const auto cuda = gqattn::Device::cuda;
  auto ref_q = [&](void* data) {
    return p.varlen ? gqattn::contiguous(data, s.dtype, cuda, rows_q, p.H, p.d)
                    : gqattn::contiguous(data, s.dtype, cuda, p.B, p.Tq, p.H, p.d);
  };
  auto ref_kv = [&](void* data) {
    return p.varlen ? gqattn::contiguous(data, s.dtype, cuda, rows_k, p.Hkv, p.d)
                    : gqattn::contiguous(data, s.dtype, cuda, p.B, p.Tk, p.Hkv, p.d);
  };
  auto ref_lse = [&](void* data) {
    return p.varlen ? gqattn::contiguous(data, gqattn::DType::f32, cuda, p.H, rows_q)
                    : gqattn::contiguous(data, gqattn::DType::f32, cuda, p.B, p.H, p.Tq);
  };
  // The varlen offsets, on the device, shared by every set.
  DeviceTensor cu_q_dev, cu_k_dev;
  gqattn::VarlenOffsets offsets;
  if (p.varlen) {
    cu_q_dev = device_alloc(cu_q.size() * sizeof(int32_t));
    cu_k_dev = device_alloc(cu_k.size() * sizeof(int32_t));
    check(cudaMemcpy(cu_q_dev.data, cu_q.data(), cu_q_dev.bytes, cudaMemcpyHostToDevice),
          "upload cu_seqlens_q");
    check(cudaMemcpy(cu_k_dev.data, cu_k.data(), cu_k_dev.bytes, cudaMemcpyHostToDevice),
          "upload cu_seqlens_k");
    offsets.cu_seqlens_q = {static_cast<const int32_t*>(cu_q_dev.data), cuda, int64_t(cu_q.size())};
    offsets.cu_seqlens_k = {static_cast<const int32_t*>(cu_k_dev.data), cuda, int64_t(cu_k.size())};
  }
  // The KV cache's int32 vectors, on the device, shared by every set.
  DeviceTensor seqlens_dev, table_dev;
  gqattn::KvCache cache_of_set;  // k and v filled in per set
  if (p.kv_cache) {
    seqlens_dev = device_alloc(c.lens_k.size() * sizeof(int32_t));
    check(cudaMemcpy(seqlens_dev.data, c.lens_k.data(), seqlens_dev.bytes, cudaMemcpyHostToDevice),
          "upload cache_seqlens");
    cache_of_set.seqlens = {static_cast<const int32_t*>(seqlens_dev.data), cuda, p.B};
    if (paged) {
      table_dev = device_alloc(layout.block_table.size() * sizeof(int32_t));
      check(cudaMemcpy(table_dev.data, layout.block_table.data(), table_dev.bytes,
                       cudaMemcpyHostToDevice),
            "upload block_table");
      cache_of_set.block_table = {static_cast<const int32_t*>(table_dev.data), cuda,
                                  int64_t(layout.block_table.size())};
      cache_of_set.pages_per_seq = layout.pages_per_seq;
    }
  }
  auto ref_cache = [&](void* data) {
    return paged ? gqattn::contiguous(data, s.dtype, cuda, layout.num_pages, p.kv_page_size, p.Hkv,
                                      p.d)
                 : gqattn::contiguous(data, s.dtype, cuda, p.B, p.Tk, p.Hkv, p.d);
  };
  gqattn::Options options;
  options.backend = s.backend;
  options.stream = stream;
  options.deterministic = s.deterministic;
  options.batch_invariant = s.batch_invariant;
  options.check_offsets = false;  // --varlen, --kv-cache: no host read per call
  const gqattn::Explanation forward_plan =
      gqattn::explain(p, s.dtype, gqattn::Device::cuda, s.backend, gqattn::Pass::forward, options);
  if (forward_plan.supported) append_text(line, "fwd_plan", forward_plan.plan);
  auto forward = [&](const Set& x) {
    if (p.kv_cache) {
      gqattn::KvCache cache = cache_of_set;
      cache.k = ref_cache(x.k.data);
      cache.v = ref_cache(x.v.data);
      gqattn::forward_with_kv_cache(p, cache, ref_q(x.q.data), gqattn::TensorRef{},
                                    gqattn::TensorRef{}, ref_q(x.o.data), ref_lse(x.lse.data),
                                    options);
    } else if (p.varlen)
      gqattn::forward(p, offsets, ref_q(x.q.data), ref_kv(x.k.data), ref_kv(x.v.data),
                      ref_q(x.o.data), ref_lse(x.lse.data), options);
    else
      gqattn::forward(p, ref_q(x.q.data), ref_kv(x.k.data), ref_kv(x.v.data), ref_q(x.o.data),
                      ref_lse(x.lse.data), options);
  };
  auto backward = [&](const Set& x) {
    if (p.varlen)
      gqattn::backward(p, offsets, ref_q(x.q.data), ref_kv(x.k.data), ref_kv(x.v.data),
                       ref_q(x.o.data), ref_lse(x.lse.data), ref_q(x.dout.data), ref_q(x.dq.data),
                       ref_kv(x.dk.data), ref_kv(x.dv.data), options);
    else
      gqattn::backward(p, ref_q(x.q.data), ref_kv(x.k.data), ref_kv(x.v.data), ref_q(x.o.data),
                       ref_lse(x.lse.data), ref_q(x.dout.data), ref_q(x.dq.data), ref_kv(x.dk.data),
                       ref_kv(x.dv.data), options);
  };

  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<cudaEvent_t> marks;  // --back-to-back: one before each timed call, one after all
  if (s.back_to_back) {
    marks.resize(std::size_t(s.repeats) + 1);
    for (cudaEvent_t& mark : marks) check(cudaEventCreate(&mark), "event");
  }
  const auto wall_s = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  double wall_start = 0.0, wall_end = 0.0;  // of the last time_calls' timed calls
  // The energy counter over the last time_calls' timed calls (mJ); both
  // reads must succeed for it to count.
  std::uint64_t mj_start = 0, mj_end = 0;
  bool energy_read = false;
  std::vector<float> call_ms;  // of the last time_calls, in call order
  double enqueue_us = 0.0;     // of the last time_calls: median host time to queue a call
  int spin_short = 0;          // of the last time_calls: calls queued slower than the spin
  const auto append_call_times = [&](const char* pass) {
    if (!s.call_times) return;
    append(line, ", \"%s_call_ms\": [", pass);
    for (std::size_t i = 0; i < call_ms.size(); ++i)
      append(line, "%s%.4f", i == 0 ? "" : ", ", double(call_ms[i]));
    append(line, "]");
  };
  // The GPU idles `ms` from here on (the stream drained, then a host
  // sleep): --settle-ms before each pass, --idle-ms before each timed call.
  const auto idle_gpu = [&](int ms) {
    if (ms <= 0) return;
    check(cudaStreamSynchronize(stream), "sync");
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  };
  auto time_calls = [&](auto&& call) {
    idle_gpu(s.settle_ms);
    for (int i = 0; i < s.warmup; ++i) call(all[std::size_t(i % sets)]);
    if (s.release_workspace) {
      // The pool releases only frees the host has seen complete.
      check(cudaStreamSynchronize(stream), "sync");
      gqattn::release_workspace_memory();
    }
    std::vector<float> ms, queue_us;
    if (energy.available()) check(cudaStreamSynchronize(stream), "sync");  // warm-up's energy out
    energy_read = energy.read_mj(mj_start);
    wall_start = wall_s();
    if (s.back_to_back) {
      // All timed calls queued at once, an event between each two. The
      // GPU can start call i once the spin and calls 0..i-1 are done; if
      // the host had not queued call i by then, the GPU may have waited
      // for it inside the call's window, and the call counts as short.
      check(gqattn_bench::spin_ahead(stream, s.spin_ahead_us), "spin ahead");
      std::vector<double> queued_at_us;  // since the first mark, call i fully queued
      const auto queue_start = std::chrono::steady_clock::now();
      check(cudaEventRecord(marks[0], stream), "record");
      for (int i = 0; i < s.repeats; ++i) {
        call(all[std::size_t(i % sets)]);
        check(cudaEventRecord(marks[std::size_t(i) + 1], stream), "record");
        queued_at_us.push_back(std::chrono::duration<double, std::micro>(
                                   std::chrono::steady_clock::now() - queue_start)
                                   .count());
      }
      check(cudaEventSynchronize(marks[std::size_t(s.repeats)]), "sync");
      spin_short = 0;
      double gpu_ready_us = double(s.spin_ahead_us);
      for (std::size_t i = 0; i < std::size_t(s.repeats); ++i) {
        float t = 0.0f;
        check(cudaEventElapsedTime(&t, marks[i], marks[i + 1]), "elapsed");
        ms.push_back(t);
        queue_us.push_back(float(queued_at_us[i] - (i == 0 ? 0.0 : queued_at_us[i - 1])));
        if (queued_at_us[i] > gpu_ready_us) ++spin_short;
        gpu_ready_us += double(t) * 1e3;
      }
      if (s.release_workspace) gqattn::release_workspace_memory();
    } else {
      for (int i = 0; i < s.repeats; ++i) {
        idle_gpu(s.idle_ms);  // the warm-up drained too, before the first
        check(gqattn_bench::spin_ahead(stream, s.spin_ahead_us), "spin ahead");
        const auto queue_start = std::chrono::steady_clock::now();
        check(cudaEventRecord(start, stream), "record");
        call(all[std::size_t(i % sets)]);
        check(cudaEventRecord(stop, stream), "record");
        queue_us.push_back(float(std::chrono::duration<double, std::micro>(
                                     std::chrono::steady_clock::now() - queue_start)
                                     .count()));
        check(cudaEventSynchronize(stop), "sync");
        if (s.release_workspace) gqattn::release_workspace_memory();
        float t = 0.0f;
        check(cudaEventElapsedTime(&t, start, stop), "elapsed");
        ms.push_back(t);
      }
      const auto outlasted_spin = [&](float us) { return us >= float(s.spin_ahead_us); };
      spin_short = s.spin_ahead_us <= 0
                       ? 0
                       : int(std::count_if(queue_us.begin(), queue_us.end(), outlasted_spin));
    }
    wall_end = wall_s();
    energy_read = energy_read && energy.read_mj(mj_end) && mj_end >= mj_start;
    call_ms = ms;
    enqueue_us = median(queue_us);
    return median(ms);
  };

  // ', "<pass>_enqueue_us": us[, "<pass>_spin_short": n]' for the last
  // time_calls.
  const auto append_queueing = [&](const char* pass) {
    append(line, ", \"%s_enqueue_us\": %.1f", pass, enqueue_us);
    if (s.spin_ahead_us > 0 || s.back_to_back)
      append(line, ", \"%s_spin_short\": %d", pass, spin_short);
  };

  // ', "<pass>_nvml_joules": J, "<pass>_nvml_pj_per_flop": pJ' for the last
  // time_calls, where the counter answered.
  const auto append_energy = [&](const char* pass, double flops_per_call) {
    if (!energy_read) return;
    const double joules = double(mj_end - mj_start) * 1e-3;
    append(line, ", \"%s_nvml_joules\": %.3f, \"%s_nvml_pj_per_flop\": %.4f", pass, joules, pass,
           joules / (flops_per_call * double(s.repeats)) * 1e12);
  };

  try {
    for (const Set& x : all) forward(x);  // every set's o and lse, for the backward
    check(cudaStreamSynchronize(stream), "sync");
    const double fwd_ms = time_calls(forward);
    append(line,
           ", \"sets\": %d, \"fwd_ms\": %.4f, \"fwd_tflops\": %.1f, "
           "\"fwd_wall_s\": [%.3f, %.3f]",
           sets, fwd_ms, fwd_flops / (fwd_ms * 1e-3) / 1e12, wall_start, wall_end);
    if (p.kv_cache) append(line, ", \"tbps\": %.4g", moved_bytes / (fwd_ms * 1e-3) / 1e12);
    append_queueing("fwd");
    append_energy("fwd", fwd_flops);
    append_call_times("fwd");
    gqattn::Explanation backward_support;
    if (p.kv_cache)
      backward_support.reason = "a KV-cache call is forward only";
    else
      backward_support = gqattn::explain(p, s.dtype, gqattn::Device::cuda, s.backend,
                                         gqattn::Pass::backward, options);
    if (s.backward && !backward_support.supported) {
      append_text(line, "bwd_skipped", backward_support.reason);
    } else if (s.backward) {
      append_text(line, "bwd_plan", backward_support.plan);
      const double bwd_ms = time_calls(backward);
      append(line, ", \"bwd_ms\": %.4f, \"bwd_tflops\": %.1f, \"bwd_wall_s\": [%.3f, %.3f]", bwd_ms,
             kBackwardFlopFactor * fwd_flops / (bwd_ms * 1e-3) / 1e12, wall_start, wall_end);
      append_queueing("bwd");
      append_energy("bwd", kBackwardFlopFactor * fwd_flops);
      append_call_times("bwd");
    }
  } catch (const gqattn::Error& e) {
    append_text(line, "error", e.what());
  }
  std::printf("%s}\n", line.c_str());
  std::fflush(stdout);
  check(cudaStreamSynchronize(stream), "sync");
  check(cudaEventDestroy(start), "event");
  check(cudaEventDestroy(stop), "event");
  for (cudaEvent_t mark : marks) check(cudaEventDestroy(mark), "event");
  for (Set& set : all)
    for (DeviceTensor* t :
         {&set.q, &set.k, &set.v, &set.o, &set.lse, &set.dout, &set.dq, &set.dk, &set.dv})
      check(cudaFree(t->data), "cudaFree");
  for (DeviceTensor* t : {&cu_q_dev, &cu_k_dev, &seqlens_dev, &table_dev})
    if (t->data) check(cudaFree(t->data), "cudaFree");
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  std::vector<Case> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gqattn_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--standard") {
      for (const auto& p : standard_shapes()) shapes.push_back({p, {}, {}});
    } else if (arg == "--shape") {
      shapes.push_back({parse_shape(value()), {}, {}});
    } else if (arg == "--varlen") {
      shapes.push_back(parse_varlen(value()));
    } else if (arg == "--kv-cache") {
      shapes.push_back(parse_kv_cache(value()));
    } else if (arg == "--dtype") {
      const std::string v = value();
      settings.dtype = v == "f16" ? gqattn::DType::f16 : gqattn::DType::bf16;
    } else if (arg == "--backend") {
      try {
        settings.backend = gqattn::parse_backend(value());
      } catch (const gqattn::Error& e) {
        std::fprintf(stderr, "gqattn_bench: %s\n", e.what());
        return 2;
      }
    } else if (arg == "--warmup") {
      settings.warmup = std::atoi(value().c_str());
    } else if (arg == "--repeats") {
      settings.repeats = std::max(1, std::atoi(value().c_str()));
    } else if (arg == "--no-backward") {
      settings.backward = false;
    } else if (arg == "--nondeterministic") {
      settings.deterministic = false;
    } else if (arg == "--batch-invariant") {
      settings.batch_invariant = true;
    } else if (arg == "--release-workspace") {
      settings.release_workspace = true;
    } else if (arg == "--idle-ms") {
      settings.idle_ms = std::max(0, std::atoi(value().c_str()));
    } else if (arg == "--settle-ms") {
      settings.settle_ms = std::max(0, std::atoi(value().c_str()));
    } else if (arg == "--spin-ahead-us") {
      settings.spin_ahead_us = std::max(0, std::atoi(value().c_str()));
    } else if (arg == "--back-to-back") {
      settings.back_to_back = true;
    } else if (arg == "--call-times") {
      settings.call_times = true;
    } else if (arg == "--force") {
      try {
        settings.force = gqattn::detail::parse_plan_override(value());
      } catch (const gqattn::Error& e) {
        std::fprintf(stderr, "gqattn_bench: --force: %s\n", e.what());
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: gqattn_bench [--standard] [--shape B,Tq,Tk,H,Hkv,d,causal,window,"
                   "softcap]... [--varlen LENS,H,Hkv,d,causal,window,softcap]... "
                   "[--kv-cache LENS,Tq,H,Hkv,d,page,causal,window,softcap]... [--dtype "
                   "bf16|f16] [--backend NAME] [--warmup N] [--repeats N] "
                   "[--no-backward] [--nondeterministic] [--batch-invariant] "
                   "[--release-workspace] [--idle-ms N] "
                   "[--settle-ms N] [--spin-ahead-us N] [--back-to-back] [--call-times] "
                   "[--force SPEC]\n");
      return 2;
    }
  }
  if (settings.back_to_back && settings.idle_ms > 0) {
    std::fprintf(stderr,
                 "gqattn_bench: --back-to-back queues the timed calls without a pause; "
                 "it excludes --idle-ms\n");
    return 2;
  }
  if (shapes.empty())
    for (const auto& p : standard_shapes()) shapes.push_back({p, {}, {}});
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  int device = 0;
  check(cudaGetDevice(&device), "device");
  char bus_id[kPciBusIdChars] = {};
  check(cudaDeviceGetPCIBusId(bus_id, kPciBusIdChars, device), "PCI bus id");
  const gqattn_bench::EnergyCounter energy(bus_id);
  for (const Case& c : shapes) run_shape(c, settings, stream, energy);
  check(cudaStreamDestroy(stream), "stream");
  return 0;
}
