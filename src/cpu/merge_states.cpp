// merge_attention_states on host tensors (api/merge_states.hpp): one row
// (b, i, h) at a time, in f32. Checked by tests/cpu/test_merge_states.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "api/merge_states.hpp"
#include "cpu/mirror.hpp"
#include "gqattn/dtype.hpp"

namespace gqattn::detail {

void merge_states_cpu(const MergeArgs& a) {
  const int64_t B = a.o.shape[0], Tq = a.o.shape[1], H = a.o.shape[2], d = a.o.shape[3];
  std::vector<float> x(static_cast<std::size_t>(d)), y(x.size());
  auto lse_at = [](const TensorRef& t, int64_t b, int64_t h, int64_t i) {
    return b * t.stride[0] + h * t.stride[1] + i * t.stride[2];
  };
  const float* lse_a = static_cast<const float*>(a.lse_a.data);
  const float* lse_b = static_cast<const float*>(a.lse_b.data);
  float* lse = static_cast<float*>(a.lse.data);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float la = lse_a[lse_at(a.lse_a, b, h, i)], lb = lse_b[lse_at(a.lse_b, b, h, i)];
        const float m = std::max(la, lb);
        float merged = -std::numeric_limits<float>::infinity();
        if (m == -std::numeric_limits<float>::infinity()) {
          std::fill(x.begin(), x.end(), 0.0f);
        } else {
          const float wa = std::exp(la - m), wb = std::exp(lb - m);
          const float inv = 1.0f / (wa + wb);
          cpu::load_floats(a.o_a, cpu::element_offset(a.o_a, b, i, h), d, x.data());
          cpu::load_floats(a.o_b, cpu::element_offset(a.o_b, b, i, h), d, y.data());
          for (int64_t c = 0; c < d; ++c) x[c] = (wa * x[c] + wb * y[c]) * inv;
          merged = m + std::log(wa + wb);
        }
        cpu::store_floats(a.o, cpu::element_offset(a.o, b, i, h), d, x.data());
        lse[lse_at(a.lse, b, h, i)] = merged;
      }
}

}  // namespace gqattn::detail
