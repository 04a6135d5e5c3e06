// A small timing driver for bench/cpu_side_by_side.py: one shape through the
// public API on host tensors (B, T, H, Hkv, d, causal, dtype, backend,
// threads, and optionally a window and a softcap), forward and forward +
// backward, median of at least `reps` runs (and of at least a second of
// runs) after one warm-up, printed as one JSON object. Built by the script against a
// library build (c++ -O2 -Iinclude ... libgqattn.a -lpthread).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/dtype.hpp"

using namespace gqattn;

int main(int argc, char** argv) {
  if (argc != 11 && argc != 13) {
    std::fprintf(
        stderr,
        "usage: B T H Hkv d causal dtype(f32|bf16) backend threads reps [window softcap]\n");
    return 2;
  }
  const int64_t B = std::atoll(argv[1]), T = std::atoll(argv[2]), H = std::atoll(argv[3]),
                Hkv = std::atoll(argv[4]), d = std::atoll(argv[5]);
  const bool causal = std::atoi(argv[6]) != 0;
  const DType dtype = std::string(argv[7]) == "bf16" ? DType::bf16 : DType::f32;
  const Backend backend = parse_backend(argv[8]);
  const int threads = std::atoi(argv[9]), reps = std::atoi(argv[10]);
  const int64_t window = argc == 13 ? std::atoll(argv[11]) : 0;
  const float softcap = argc == 13 ? float(std::atof(argv[12])) : 0.0f;
  const Problem p = make_problem(B, T, T, H, Hkv, d, causal, window, softcap);
  const int64_t nq = B * T * H * d, nk = B * T * Hkv * d, es = dtype == DType::f32 ? 4 : 2;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto buffer = [&](int64_t n, bool fill) {
    std::vector<char> x(n * es);
    if (fill)
      for (int64_t i = 0; i < n; ++i) store_from_float(x.data(), dtype, i, normal(rng));
    return x;
  };
  auto q = buffer(nq, true), k = buffer(nk, true), v = buffer(nk, true), dout = buffer(nq, true);
  auto o = buffer(nq, false), dq = buffer(nq, false), dk = buffer(nk, false),
       dv = buffer(nk, false);
  std::vector<float> lse(B * H * T);
  const auto t4 = [&](std::vector<char>& x, int64_t heads) {
    return contiguous(x.data(), dtype, Device::cpu, B, T, heads, d);
  };
  const TensorRef l = contiguous(lse.data(), DType::f32, Device::cpu, B, H, T);
  Options options;
  options.backend = backend;
  options.num_threads = threads;
  const auto fwd = [&] { forward(p, t4(q, H), t4(k, Hkv), t4(v, Hkv), t4(o, H), l, options); };
  const auto bwd = [&] {
    backward(p, t4(q, H), t4(k, Hkv), t4(v, Hkv), t4(o, H), l, t4(dout, H), t4(dq, H), t4(dk, Hkv),
             t4(dv, Hkv), options);
  };
  const auto median_ms = [&](auto&& body) {
    body();  // warm-up: threads started, pages touched
    // At least `reps` calls and, for short ones, at least a second of them.
    std::vector<double> ms;
    double total = 0.0;
    while (int(ms.size()) < reps || (total < 1000.0 && ms.size() < 100)) {
      const auto t0 = std::chrono::steady_clock::now();
      body();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      total += ms.back();
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const double f = median_ms(fwd);
  const double fb = median_ms([&] {
    fwd();
    bwd();
  });
  std::printf("{\"forward_ms\": %.3f, \"forward_backward_ms\": %.3f}\n", f, fb);
  return 0;
}
