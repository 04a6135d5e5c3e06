// Parts the mirror's forward and backward share: the kept range, the seed's
// dot product, the softmax row (attention_fwd's P) and tensor I/O. Checked
// bit-exact against a transliteration of the seed in
// tests/cpu/test_mirror_seed.cpp and against the oracle in
// tests/cpu/test_mirror_oracle.cpp.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <new>

#include "cpu/mirror.hpp"
#include "gqattn/dtype.hpp"

namespace gqattn::cpu {

KeptRange kept_range(const MirrorShape& shape, int64_t i) {
  // The seed's jmin/jmax with Tq == Tk generalised by the offset; signed so
  // that a query before every key (causal, Tq > Tk) gives an empty range.
  // |pos| <= 2^53 + Tq and window in [0, off + Tq - 1]: no overflow.
  const int64_t pos = i + shape.off;
  KeptRange r;
  r.last = shape.causal ? std::min(pos, shape.Tk - 1) : shape.Tk - 1;
  r.first = shape.window > 0 ? std::max<int64_t>(pos - shape.window + 1, 0) : 0;
  return r;
}

float fma_dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t x = 0; x < n; ++x) s = std::fmaf(a[x], b[x], s);
  return s;
}

RowSoftmax softmax_row(const MirrorShape& shape, int64_t i, const float* q, const float* K,
                       float* prow) {
  RowSoftmax row;
  row.kept = kept_range(shape, i);
  const int64_t first = row.kept.first;
  const int64_t n = row.kept.last - first + 1;
  if (row.kept.empty()) return row;

  float m = -FLT_MAX;
  for (int64_t x = 0; x < n; ++x) {
    float s = fma_dot(q, K + (first + x) * shape.d, shape.d);
    s *= shape.scale;
    if (shape.softcap > 0.0f) s = shape.softcap * std::tanh(s / shape.softcap);
    prow[x] = s;
    m = std::max(m, s);
  }
  float sum = 0.0f;
  for (int64_t x = 0; x < n; ++x) {
    const float e = std::exp(prow[x] - m);
    prow[x] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (int64_t x = 0; x < n; ++x) prow[x] *= inv;
  row.m = m;
  row.sum = sum;
  return row;
}

// A causal row keeps at most min(window, Tk) keys; a non-causal one all keys
// from max(pos - window + 1, 0) on, most in the first row (pos = off).
// window < off + Tq (effective_window), so no sum here overflows.
int64_t max_kept(const MirrorShape& shape) {
  if (shape.window == 0) return shape.Tk;
  if (shape.causal) return std::min(shape.window, shape.Tk);
  return shape.Tk - std::clamp<int64_t>(shape.off - shape.window + 1, 0, shape.Tk);
}

std::vector<float> scratch_floats(int64_t n) {
  if (n < 0 || static_cast<uint64_t>(n) > std::vector<float>().max_size()) throw std::bad_alloc();
  return std::vector<float>(static_cast<std::size_t>(n));
}

void load_floats(const TensorRef& t, int64_t offset, int64_t n, float* out) {
  if (t.dtype == DType::f32) {
    std::memcpy(out, static_cast<const float*>(t.data) + offset, sizeof(float) * n);
    return;
  }
  for (int64_t x = 0; x < n; ++x) out[x] = load_as_float(t.data, t.dtype, offset + x);
}

void store_floats(const TensorRef& t, int64_t offset, int64_t n, const float* in) {
  if (t.dtype == DType::f32) {
    std::memcpy(static_cast<float*>(t.data) + offset, in, sizeof(float) * n);
    return;
  }
  for (int64_t x = 0; x < n; ++x) store_from_float(t.data, t.dtype, offset + x, in[x]);
}

void load_head(const TensorRef& t, int64_t b, int64_t head, int64_t T, int64_t d, float* out) {
  for (int64_t j = 0; j < T; ++j) load_floats(t, element_offset(t, b, j, head), d, out + j * d);
}

}  // namespace gqattn::cpu
