// The package test's consumer: one small causal GQA forward on the CPU
// backend through the installed (or subproject) gqattn, checked against a
// naive softmax(q k^T * scale) v in double, and the version header against
// build_info(). Exit 0 when both agree.
#include <gqattn/gqattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

int main() {
  gqattn::Problem p;
  p.B = 1;
  p.Tq = p.Tk = 5;
  p.H = 4;
  p.Hkv = 2;
  p.d = 8;
  p.causal = true;
  const int rep = int(p.H / p.Hkv);

  std::vector<float> q(std::size_t(p.B * p.Tq * p.H * p.d));
  std::vector<float> k(std::size_t(p.B * p.Tk * p.Hkv * p.d)), v(k.size()), o(q.size());
  std::vector<float> lse(std::size_t(p.B * p.H * p.Tq));
  // Deterministic inputs in [-1, 1] without <random>'s distributions.
  unsigned state = 12345u;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return float(state >> 8) / float(1u << 24) * 2.0f - 1.0f;
  };
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = next();

  using gqattn::contiguous;
  const auto f32 = gqattn::DType::f32;
  const auto cpu = gqattn::Device::cpu;
  gqattn::Options options;
  options.backend = gqattn::Backend::Cpu;
  try {
    gqattn::forward(p, contiguous(q.data(), f32, cpu, p.B, p.Tq, p.H, p.d),
                    contiguous(k.data(), f32, cpu, p.B, p.Tk, p.Hkv, p.d),
                    contiguous(v.data(), f32, cpu, p.B, p.Tk, p.Hkv, p.d),
                    contiguous(o.data(), f32, cpu, p.B, p.Tq, p.H, p.d),
                    contiguous(lse.data(), f32, cpu, p.B, p.H, p.Tq), options);
  } catch (const gqattn::Error& e) {
    std::fprintf(stderr, "forward failed: %s\n", e.what());
    return 1;
  }

  // Packed [B, T, heads, d], B = 1.
  const double scale = 1.0 / std::sqrt(double(p.d));
  double worst = 0.0;
  for (int t = 0; t < int(p.Tq); ++t) {
    for (int h = 0; h < int(p.H); ++h) {
      const int g = h / rep;
      std::vector<double> s(std::size_t(t + 1));  // causal, Tq == Tk: keys 0..t
      for (int j = 0; j <= t; ++j) {
        double dot = 0.0;
        for (int c = 0; c < int(p.d); ++c)
          dot += double(q[std::size_t((t * p.H + h) * p.d + c)]) *
                 double(k[std::size_t((j * p.Hkv + g) * p.d + c)]);
        s[std::size_t(j)] = dot * scale;
      }
      const double top = *std::max_element(s.begin(), s.end());
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - top));
      for (int c = 0; c < int(p.d); ++c) {
        double want = 0.0;
        for (int j = 0; j <= t; ++j)
          want += s[std::size_t(j)] / sum * double(v[std::size_t((j * p.Hkv + g) * p.d + c)]);
        const double got = double(o[std::size_t((t * p.H + h) * p.d + c)]);
        worst = std::max(worst, std::fabs(got - want));
      }
      const double want_lse = top + std::log(sum);
      worst = std::max(worst, std::fabs(double(lse[std::size_t(h * p.Tq + t)]) - want_lse));
    }
  }

  const std::string version = gqattn::build_info().version;
  std::printf("gqattn %s (header %d.%d.%d): max |o - naive|, |lse - naive| = %.3g\n",
              version.c_str(), GQATTN_VERSION_MAJOR, GQATTN_VERSION_MINOR, GQATTN_VERSION_PATCH,
              worst);
  if (version != GQATTN_VERSION_STRING) {
    std::fprintf(stderr, "build_info().version %s != GQATTN_VERSION_STRING %s\n", version.c_str(),
                 GQATTN_VERSION_STRING);
    return 1;
  }
  return worst < 1e-5 ? 0 : 1;
}
