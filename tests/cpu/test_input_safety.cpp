// Input safety: a window of Tk or more, aliasing and overlapping outputs,
// spans that overflow in bytes, and a CPU backend whose memory follows the
// kept pairs (a 1 GiB address-space limit, and nothing written when memory
// runs out). Outputs are NaN-poisoned before every call; inputs are fresh
// random values.
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cpu/cpu_test_util.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define GQATTN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GQATTN_TEST_ASAN 1
#endif
#endif

namespace gqattn::test {
namespace {

constexpr int64_t kMaxWindow = std::numeric_limits<int64_t>::max();

bool all_nan(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isnan(v); });
}

// ---- 1: a window of Tk or more is no window ---------------------------------

TEST(InputSafety, EffectiveWindow) {
  Problem p = make_problem(1, 8, 4, 1, 1, 8);
  for (int64_t w : {int64_t{0}, int64_t{4}, int64_t{5}, kMaxWindow, kMaxWindow - 1}) {
    p.window = w;
    EXPECT_EQ(p.effective_window(), 0) << w;
  }
  p.window = 3;
  EXPECT_EQ(p.effective_window(), 3);
  p.window = 1;
  EXPECT_EQ(p.effective_window(), 1);
}

// The command-line case: Tq > Tk, no causal mask, window INT64_MAX. Every
// row keeps every key: the same bits as no window, in the mirror and oracle.
TEST(InputSafety, HugeWindowIsNoWindow) {
  for (bool causal : {false, true}) {
    for (int64_t Tq : {8, 4, 3}) {
      SCOPED_TRACE("causal " + std::to_string(causal) + " Tq " + std::to_string(Tq));
      const Problem none = make_problem(2, Tq, 4, 2, 1, 8, causal, 0, causal ? 0.0f : 5.0f);
      const Inputs in = random_inputs(none, 7);
      const Outputs want = run_cpu(in);
      const Reference ref = run_oracle(in);
      for (int64_t w : {int64_t{4}, int64_t{5}, kMaxWindow / 2, kMaxWindow}) {
        Inputs windowed = in;
        windowed.problem.window = w;
        expect_same_bits(run_cpu(windowed), want);
        const Reference got = run_oracle(windowed);
        EXPECT_EQ(got.o, ref.o);
        EXPECT_EQ(got.lse, ref.lse);
        EXPECT_EQ(got.dq, ref.dq);
        EXPECT_EQ(windowed.problem.kept_pairs(), none.kept_pairs());
      }
      if (!causal) {
        for (float lse : want.lse) EXPECT_TRUE(std::isfinite(lse));
      }
    }
  }
}

// kept_pairs at the size limits: 128-bit sums, saturated, never wrapped.
TEST(InputSafety, KeptPairsNearTheLimits) {
  const int64_t big = int64_t{1} << 52;
  Problem p = make_problem(1, big, big, 1, 1, 1);
  EXPECT_EQ(p.kept_pairs(), std::numeric_limits<int64_t>::max());
  p.window = big - 1;
  EXPECT_EQ(p.kept_pairs(), std::numeric_limits<int64_t>::max());
  p.causal = true;
  p.window = 3;
  EXPECT_EQ(p.kept_pairs(), 3 * big - 3);
  p.window = kMaxWindow;
  EXPECT_EQ(p.kept_pairs(), std::numeric_limits<int64_t>::max());
  p = make_problem(1, 5, big, 1, 1, 1, false, kMaxWindow - 7);
  EXPECT_EQ(p.kept_pairs(), 5 * big);
}

// ---- 2: outputs may not alias or overlap ------------------------------------

// One random problem's tensors, packed, in separate vectors (outputs NaN).
struct Call {
  Problem p;
  Inputs in;
  std::vector<float> o, lse, dq, dk, dv;
  TensorRef Q, K, V, O, L, dO, dQ, dK, dV;
  explicit Call(const Problem& problem = make_problem(2, 5, 7, 4, 2, 8, true, 3, 0.0f))
      : p(problem), in(random_inputs(problem, 3)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    o.assign(in.q.size(), nan);
    dq.assign(in.q.size(), nan);
    dk.assign(in.k.size(), nan);
    dv.assign(in.k.size(), nan);
    lse.assign(std::size_t(p.B * p.H * p.Tq), nan);
    Q = q4(in.q.data(), p.Tq, p.H);
    K = q4(in.k.data(), p.Tk, p.Hkv);
    V = q4(in.v.data(), p.Tk, p.Hkv);
    dO = q4(in.dout.data(), p.Tq, p.H);
    O = q4(o.data(), p.Tq, p.H);
    dQ = q4(dq.data(), p.Tq, p.H);
    dK = q4(dk.data(), p.Tk, p.Hkv);
    dV = q4(dv.data(), p.Tk, p.Hkv);
    L = contiguous(lse.data(), DType::f32, Device::cpu, p.B, p.H, p.Tq);
  }
  TensorRef q4(float* x, int64_t T, int64_t heads) const {
    return contiguous(x, DType::f32, Device::cpu, p.B, T, heads, p.d);
  }
  Options cpu() const {
    Options opt;
    opt.backend = Backend::Cpu;
    return opt;
  }
  void forward_ok() { gqattn::forward(p, Q, K, V, O, L, cpu()); }
  void backward_with(const TensorRef& dq_, const TensorRef& dk_, const TensorRef& dv_) {
    gqattn::backward(p, Q, K, V, O, L, dO, dq_, dk_, dv_, cpu());
  }
};

// `fn` throws gqattn::Error with this argument and a rule containing `rule`.
template <typename F>
void expect_error(F&& fn, const std::string& argument, const std::string& rule) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected " << argument << ": " << rule;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(e.rule().find(rule), std::string::npos) << e.what();
  }
}

TEST(InputSafety, BackwardOutputAliasingAnInputIsRefused) {
  Call c;
  c.forward_ok();
  std::vector<float> q_before = c.in.q, do_before = c.in.dout;
  expect_error([&] { c.backward_with(c.Q, c.dK, c.dV); }, "dq", "must not overlap q");
  expect_error([&] { c.backward_with(c.dO, c.dK, c.dV); }, "dq", "must not overlap do");
  // dk on k's storage, dv on v's, dk on dv's, dv on o's first bytes (a partial
  // overlap: different shape, same memory).
  expect_error([&] { c.backward_with(c.dQ, c.K, c.dV); }, "dk", "must not overlap k");
  expect_error([&] { c.backward_with(c.dQ, c.dK, c.dK); }, "dk", "must not overlap dv");
  TensorRef dv_on_o = c.dV;
  dv_on_o.data = c.o.data() + 3;
  expect_error([&] { c.backward_with(c.dQ, c.dK, dv_on_o); }, "dv", "must not overlap o");
  TensorRef dq_on_lse = c.dQ;
  std::vector<float> shared(c.dq.size() + c.lse.size(), std::nanf(""));
  dq_on_lse.data = shared.data();
  TensorRef L2 = c.L;
  L2.data = shared.data() + c.dq.size() - 1;  // the last element of dq is lse's first
  std::copy(c.lse.begin(), c.lse.end(), shared.begin() + std::ptrdiff_t(c.dq.size() - 1));
  expect_error(
      [&] { gqattn::backward(c.p, c.Q, c.K, c.V, c.O, L2, c.dO, dq_on_lse, c.dK, c.dV, c.cpu()); },
      "dq", "must not overlap lse");
  EXPECT_TRUE(all_nan(c.dq) && all_nan(c.dk) && all_nan(c.dv));
  EXPECT_EQ(c.in.q, q_before);
  EXPECT_EQ(c.in.dout, do_before);
  // Adjacent, disjoint buffers of one allocation are fine.
  std::vector<float> one(c.dq.size() + c.dk.size(), std::nanf(""));
  TensorRef dq_front = c.dQ, dk_back = c.dK;
  dq_front.data = one.data();
  dk_back.data = one.data() + c.dq.size();
  c.backward_with(dq_front, dk_back, c.dV);
  EXPECT_FALSE(has_nan(one));
}

TEST(InputSafety, ForwardOutputAliasingAnInputIsRefused) {
  Call c;
  expect_error([&] { gqattn::forward(c.p, c.Q, c.K, c.V, c.Q, c.L, c.cpu()); }, "o",
               "must not overlap q");
  TensorRef lse_in_o = c.L;
  lse_in_o.data = c.o.data() + 8;
  expect_error([&] { gqattn::forward(c.p, c.Q, c.K, c.V, c.O, lse_in_o, c.cpu()); }, "o",
               "must not overlap lse");
  TensorRef o_on_v = c.O;
  o_on_v.data = c.in.v.data();
  const std::vector<float> v_before = c.in.v;
  expect_error([&] { gqattn::forward(c.p, c.Q, c.K, c.V, o_on_v, TensorRef{}, c.cpu()); }, "o",
               "must not overlap v");
  EXPECT_EQ(c.in.v, v_before);
  EXPECT_TRUE(all_nan(c.o) && all_nan(c.lse));
}

// o.stride[2] = 1 with d = 8: head h's row starts one element after head
// h - 1's, so two threads (or two rows) would write the same memory.
TEST(InputSafety, OutputOverlappingItselfIsRefused) {
  Call c;
  TensorRef o = c.O;
  o.stride[2] = 1;
  expect_error([&] { gqattn::forward(c.p, c.Q, c.K, c.V, o, c.L, c.cpu()); },
               "o.stride = [160, 32, 1, 1]", "must not overlap each other");
  TensorRef dk = c.dK;
  dk.stride[0] = 8;  // batch 1 starts inside batch 0's rows
  c.forward_ok();
  expect_error([&] { c.backward_with(c.dQ, dk, c.dV); }, "dk.stride = [8, 16, 8, 1]",
               "must not overlap each other");
  TensorRef lse = c.L;
  lse.stride[1] = 2;  // Tq = 5 rows of head h run into head h + 1's
  lse.stride[0] = 100;
  expect_error([&] { gqattn::forward(c.p, c.Q, c.K, c.V, c.O, lse, c.cpu()); },
               "lse.stride = [100, 2, 1]", "must not overlap each other");
  EXPECT_TRUE(all_nan(c.dq) && all_nan(c.dk) && all_nan(c.dv));
  // Inputs may overlap themselves (a broadcast or a view): allowed.
  TensorRef q = c.Q;
  q.stride[2] = 1;
  std::vector<float> o2(c.o.size(), std::nanf(""));
  TensorRef O2 = c.O;
  O2.data = o2.data();
  gqattn::forward(c.p, q, c.K, c.V, O2, TensorRef{}, c.cpu());
  EXPECT_FALSE(has_nan(o2));
}

// dq, dk, dv as interleaved slices of one packed gradient [B, Tq, H + 2 Hkv,
// d + 1] (Tq == Tk): their byte ranges meet but they share no byte, so they
// are accepted; shifted by one element into the neighbouring head they share
// bytes and are refused.
TEST(InputSafety, InterleavedOutputsThatShareNoByteAreAccepted) {
  Call c(make_problem(2, 6, 6, 4, 2, 8, true, 3, 0.0f));
  c.forward_ok();
  const int64_t B = c.p.B, T = c.p.Tq, H = c.p.H, Hkv = c.p.Hkv, d = c.p.d;
  const int64_t heads = H + 2 * Hkv, row = d + 1;
  std::vector<float> grads(std::size_t(B * T * heads * row), std::nanf(""));
  auto slice = [&](int64_t head0, int64_t n, int64_t shift) {
    TensorRef t =
        contiguous(grads.data() + head0 * row + shift, DType::f32, Device::cpu, B, T, n, d);
    t.stride[2] = row;
    t.stride[1] = heads * row;
    t.stride[0] = T * heads * row;
    return t;
  };
  c.backward_with(slice(0, H, 0), slice(H, Hkv, 0), slice(H + Hkv, Hkv, 0));
  Call ref(c.p);
  ref.forward_ok();
  ref.backward_with(ref.dQ, ref.dK, ref.dV);
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t x = 0; x < d; ++x) {
        const float got = grads[std::size_t((n * heads + h) * row + x)];
        const float want = h < H         ? ref.dq[std::size_t((n * H + h) * d + x)]
                           : h < H + Hkv ? ref.dk[std::size_t((n * Hkv + h - H) * d + x)]
                                         : ref.dv[std::size_t((n * Hkv + h - H - Hkv) * d + x)];
        ASSERT_EQ(got, want) << n << " " << h << " " << x;
      }
  std::fill(grads.begin(), grads.end(), std::nanf(""));
  // dk two elements early (past the padding): its first element is the last
  // of dq's head H - 1.
  expect_error([&] { c.backward_with(slice(0, H, 0), slice(H, Hkv, -2), slice(H + Hkv, Hkv, 0)); },
               "dq", "must not overlap dk");
  EXPECT_TRUE(all_nan(grads));
}

// ---- 6: a span that fits in elements but not in bytes -----------------------

TEST(InputSafety, StrideOverflowingInBytesIsRefused) {
  Call c;
  TensorRef q = c.Q;
  q.stride[0] = std::numeric_limits<int64_t>::max() / 2;  // B = 2: fits as elements
  expect_error([&] { gqattn::forward(c.p, q, c.K, c.V, c.O, c.L, c.cpu()); },
               "q.stride = [4611686018427387903, 32, 8, 1]", "overflow int64");
  TensorRef k = c.K;
  k.stride[1] = std::numeric_limits<int64_t>::max() / 8;
  expect_error([&] { gqattn::forward(c.p, c.Q, k, c.V, c.O, c.L, c.cpu()); },
               "k.stride = [112, 1152921504606846975, 8, 1]", "overflow int64");
  EXPECT_TRUE(all_nan(c.o) && all_nan(c.lse));
}

// ---- 5 and 6: memory that follows the kept pairs ----------------------------

// Runs `body` in a child process (gtest's threadsafe death-test style: a
// fresh process, so the pool's threads and the parent's memory do not
// count) and expects exit code 0.
#define EXPECT_CHILD_EXITS_0(body)                       \
  do {                                                   \
    GTEST_FLAG_SET(death_test_style, "threadsafe");      \
    EXPECT_EXIT(body, ::testing::ExitedWithCode(0), ""); \
  } while (0)

// The address space in use now (bytes), from /proc/self/status.
int64_t vm_size_bytes(const char* key = "VmSize:") {
  std::ifstream status("/proc/self/status");
  std::string word;
  while (status >> word)
    if (word == key) {
      int64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
  return -1;
}

// Sets the soft limit; lift_address_space_limit() lifts it again.
void limit_address_space(int64_t bytes) {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0) std::exit(90);
  limit.rlim_cur = static_cast<rlim_t>(bytes);
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::exit(91);
}
void lift_address_space_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0) std::exit(92);
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::exit(93);
}

// T = 131072, H = 1, d = 8, causal window 64, under a 1 GiB address-space
// limit. The seed's P alone would be 64 GiB. The long run's last rows (and
// the keys whose every query lies among them) must equal, bit for bit, those
// of a short problem holding the same window over the same tail, and that
// short problem must agree with the f64 oracle.
void long_window_under_1gib() {
  limit_address_space(int64_t{1} << 30);
  const int64_t T = 131072, S = 512, w = 64, d = 8;
  const Problem p = make_problem(1, T, T, 1, 1, d, true, w);
  const Inputs in = random_inputs(p, 11);
  const auto start = std::chrono::steady_clock::now();
  const Outputs out = run_cpu(in);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "T=%lld window %lld: %.2f s, peak %.0f MiB\n", (long long)T, (long long)w,
               seconds, double(vm_size_bytes("VmPeak:")) / 1048576.0);
  if (::testing::Test::HasFailure()) std::exit(1);

  Inputs tail{make_problem(1, S, S, 1, 1, d, true, w), {}, {}, {}, {}};
  auto last = [&](const std::vector<float>& x) {
    return std::vector<float>(x.end() - S * d, x.end());
  };
  tail.q = last(in.q);
  tail.k = last(in.k);
  tail.v = last(in.v);
  tail.dout = last(in.dout);
  const Outputs short_run = run_cpu(tail);
  const Reference ref = run_oracle(tail);
  // Query rows with a full window in the tail (i >= w - 1), keys whose w
  // queries are all such rows (w - 1 <= j <= S - w).
  auto rows = [&](const std::vector<float>& x, int64_t from, int64_t to, int64_t base) {
    return std::vector<float>(x.begin() + (base + from) * d, x.begin() + (base + to) * d);
  };
  const int64_t base = T - S;
  if (!same_bits(rows(out.o, w - 1, S, base), rows(short_run.o, w - 1, S, 0))) std::exit(2);
  if (!same_bits(rows(out.dq, w - 1, S, base), rows(short_run.dq, w - 1, S, 0))) std::exit(3);
  if (!same_bits(rows(out.dk, w - 1, S - w + 1, base), rows(short_run.dk, w - 1, S - w + 1, 0)))
    std::exit(4);
  if (!same_bits(rows(out.dv, w - 1, S - w + 1, base), rows(short_run.dv, w - 1, S - w + 1, 0)))
    std::exit(5);
  for (int64_t i = w - 1; i < S; ++i)
    if (out.lse[std::size_t(base + i)] != short_run.lse[std::size_t(i)]) std::exit(6);
  if (max_rel_error(short_run.o, ref.o) > 1e-5 || max_rel_error(short_run.dq, ref.dq) > 1e-5 ||
      max_rel_error(short_run.dk, ref.dk) > 1e-5 || max_rel_error(short_run.dv, ref.dv) > 1e-5)
    std::exit(7);
  std::exit(0);
}

TEST(InputSafety, LongWindowBackwardUnderOneGiB) {
#ifdef GQATTN_TEST_ASAN
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: no RLIMIT_AS here";
#else
  EXPECT_CHILD_EXITS_0(long_window_under_1gib());
#endif
}

// Backward with many query heads per kv head, Tk = 1 and d = 4096, run with
// 64 MiB of address space to spare beyond its tensors: either it runs, or it
// throws std::bad_alloc with every output untouched (allocate, then write).
void out_of_memory_writes_nothing() {
  const Problem p = make_problem(1, 64, 1, 64, 1, 4096);
  const Inputs in = random_inputs(p, 5);
  const int64_t qs[4] = {p.B, p.Tq, p.H, p.d}, ks[4] = {p.B, p.Tk, p.Hkv, p.d};
  const int64_t ls[4] = {p.B, p.H, p.Tq, 1};
  HostTensor q(DType::f32, Layout::packed, 4, qs), k(DType::f32, Layout::packed, 4, ks),
      v(DType::f32, Layout::packed, 4, ks), o(DType::f32, Layout::packed, 4, qs),
      dout(DType::f32, Layout::packed, 4, qs), dq(DType::f32, Layout::packed, 4, qs),
      dk(DType::f32, Layout::packed, 4, ks), dv(DType::f32, Layout::packed, 4, ks),
      lse(DType::f32, Layout::packed, 3, ls);
  q.fill(in.q);
  k.fill(in.k);
  v.fill(in.v);
  dout.fill(in.dout);
  Options options;
  options.backend = Backend::Cpu;
  options.num_threads = 2;
  gqattn::forward(p, q.ref(), k.ref(), v.ref(), o.ref(), lse.ref(), options);
  limit_address_space(vm_size_bytes() + (int64_t{64} << 20));
  try {
    gqattn::backward(p, q.ref(), k.ref(), v.ref(), o.ref(), lse.ref(), dout.ref(), dq.ref(),
                     dk.ref(), dv.ref(), options);
  } catch (const std::bad_alloc&) {
    lift_address_space_limit();
    std::fprintf(stderr, "backward: std::bad_alloc\n");
    std::exit(all_nan(dq.read()) && all_nan(dk.read()) && all_nan(dv.read()) ? 0 : 2);
  }
  lift_address_space_limit();
  std::fprintf(stderr, "backward: ran\n");
  std::exit(has_nan(dq.read()) || has_nan(dk.read()) || has_nan(dv.read()) ? 3 : 0);
}

TEST(InputSafety, OutOfMemoryWritesNothing) {
#ifdef GQATTN_TEST_ASAN
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: no RLIMIT_AS here";
#else
  EXPECT_CHILD_EXITS_0(out_of_memory_writes_nothing());
#endif
}

}  // namespace
}  // namespace gqattn::test
