// The README's C++ example: causal GQA attention with a sliding window and
// softcap, forward and backward on the CPU backend. Built and run as the test
// `example_basic`, so the README cannot drift from the API.
#include <gqattn/gqattn.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  gqattn::Problem p;
  p.B = 2;
  p.Tq = p.Tk = 128;
  p.H = 8;    // query heads
  p.Hkv = 2;  // key/value heads: 4 query heads share each
  p.d = 64;
  p.causal = true;
  p.window = 32;      // each query sees itself and the 31 keys before it
  p.softcap = 30.0f;  // s = 30 * tanh(s / 30)

  // Packed [B, T, H, d] buffers (the layout [B, T, H*d] of most models).
  const std::size_t q_size = std::size_t(p.B * p.Tq * p.H * p.d);
  const std::size_t kv_size = std::size_t(p.B * p.Tk * p.Hkv * p.d);
  std::vector<float> q(q_size), k(kv_size), v(kv_size), o(q_size), dout(q_size);
  std::vector<float> lse(std::size_t(p.B * p.H * p.Tq)), dq(q_size), dk(kv_size), dv(kv_size);
  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto* x : {&q, &k, &v, &dout})
    for (float& e : *x) e = normal(rng);

  using gqattn::contiguous;
  const auto f32 = gqattn::DType::f32;
  const auto cpu = gqattn::Device::cpu;
  const auto Q = contiguous(q.data(), f32, cpu, p.B, p.Tq, p.H, p.d);
  const auto K = contiguous(k.data(), f32, cpu, p.B, p.Tk, p.Hkv, p.d);
  const auto V = contiguous(v.data(), f32, cpu, p.B, p.Tk, p.Hkv, p.d);
  const auto O = contiguous(o.data(), f32, cpu, p.B, p.Tq, p.H, p.d);
  const auto LSE = contiguous(lse.data(), f32, cpu, p.B, p.H, p.Tq);
  const auto dO = contiguous(dout.data(), f32, cpu, p.B, p.Tq, p.H, p.d);
  const auto dQ = contiguous(dq.data(), f32, cpu, p.B, p.Tq, p.H, p.d);
  const auto dK = contiguous(dk.data(), f32, cpu, p.B, p.Tk, p.Hkv, p.d);
  const auto dV = contiguous(dv.data(), f32, cpu, p.B, p.Tk, p.Hkv, p.d);

  gqattn::Options options;
  options.backend = gqattn::Backend::Cpu;  // or Auto, CudaFlash, ... for device tensors
  try {
    gqattn::forward(p, Q, K, V, O, LSE, options);
    gqattn::backward(p, Q, K, V, O, LSE, dO, dQ, dK, dV, options);
  } catch (const gqattn::Error& e) {  // names the argument and the rule it broke
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  // Query 0 sees only key 0, so its output is v_0 of its kv head.
  const bool row0_is_v0 = std::fabs(o[0] - v[0]) < 1e-6f;
  std::printf("o[0,0,0,0] = %f (v = %f), lse[0] = %f, dk[0] = %f\n", double(o[0]), double(v[0]),
              double(lse[0]), double(dk[0]));
  return row0_is_v0 ? 0 : 1;
}
