// Parts the mirror's forward and backward share: the kept range, the seed's
// dot product, the softmax row (attention_fwd's P) and tensor I/O. Checked
// bit-exact against a transliteration of the seed in
// tests/cpu/test_mirror_seed.cpp and against the oracle in
// tests/cpu/test_mirror_oracle.cpp.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "cpu/mirror.hpp"
#include "gqattn/dtype.hpp"

namespace gqattn::cpu {

MirrorShape mirror_shape(const Problem& problem) {
  MirrorShape s;
  s.B = problem.B;
  s.Tq = problem.Tq;
  s.Tk = problem.Tk;
  s.H = problem.H;
  s.Hkv = problem.Hkv;
  s.d = problem.d;
  s.rep = problem.H / problem.Hkv;
  s.off = problem.Tk - problem.Tq;
  s.window = problem.window;
  s.causal = problem.causal;
  // Dispatch resolves the scale before calling a backend; effective_scale()
  // returns that same value and keeps direct callers working too.
  s.scale = problem.effective_scale();
  s.softcap = problem.softcap;
  return s;
}

KeptRange kept_range(const MirrorShape& shape, int64_t i) {
  // The seed's jmin/jmax with Tq == Tk generalised by the offset; signed so
  // that a query before every key (causal, Tq > Tk) gives an empty range.
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
  const int64_t last = row.kept.last;
  if (row.kept.empty()) {
    std::fill(prow, prow + shape.Tk, 0.0f);
    return row;
  }

  float m = -FLT_MAX;
  for (int64_t j = first; j <= last; ++j) {
    float s = fma_dot(q, K + j * shape.d, shape.d);
    s *= shape.scale;
    if (shape.softcap > 0.0f) s = shape.softcap * std::tanh(s / shape.softcap);
    prow[j] = s;
    m = std::max(m, s);
  }
  float sum = 0.0f;
  for (int64_t j = first; j <= last; ++j) {
    const float e = std::exp(prow[j] - m);
    prow[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < first; ++j) prow[j] = 0.0f;
  for (int64_t j = first; j <= last; ++j) prow[j] *= inv;
  for (int64_t j = last + 1; j < shape.Tk; ++j) prow[j] = 0.0f;
  row.m = m;
  row.sum = sum;
  return row;
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
