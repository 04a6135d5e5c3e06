// cpu-flash's tile I/O: rows of a [B, T, heads, d] tensor (any dtype, any
// strides, last dimension contiguous) to and from zero-padded f32 tiles, and
// the score transform shared by forward and backward (scale, softcap, mask).
// Checked through tests/cpu/test_cpu_flash.cpp (strided layouts, bf16/f16,
// softcap, windows).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/mirror.hpp"
#include "cpu_flash/plan.hpp"

namespace gqattn::cpu_flash {

// rows x d elements of t (batch b, head, rows from row0) into tile[rows][ld]
// as f32; columns d..ld and rows past `valid` are zero.
inline void load_tile(const TensorRef& t, int64_t b, int64_t head, int64_t row0, int64_t rows,
                      int64_t valid, int64_t d, float* tile, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = tile + r * ld;
    if (r < valid && t.dtype == DType::bf16) {
      // bf16 is the high half of an f32: a shift the compiler vectorizes
      // (the generic per-element conversion cost more than the tile GEMMs).
      const uint16_t* src =
          static_cast<const uint16_t*>(t.data) + cpu::element_offset(t, b, row0 + r, head);
      for (int64_t x = 0; x < d; ++x) {
        const uint32_t bits = uint32_t(src[x]) << 16;
        std::memcpy(dst + x, &bits, 4);
      }
    } else if (r < valid) {
      cpu::load_floats(t, cpu::element_offset(t, b, row0 + r, head), d, dst);
    } else {
      std::memset(dst, 0, sizeof(float) * d);
    }
    std::memset(dst + d, 0, sizeof(float) * (ld - d));
  }
}

// rows x d elements of a bf16 tensor t (batch b, head, rows from row0) into
// tile[rows][ld] as they are (16-bit words); columns d..ld and rows past
// `valid` are zero. The bf16 tile path's load (bf16_kernels.hpp).
inline void load_tile_bf16(const TensorRef& t, int64_t b, int64_t head, int64_t row0, int64_t rows,
                           int64_t valid, int64_t d, uint16_t* tile, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* dst = tile + r * ld;
    if (r < valid) {
      const uint16_t* src =
          static_cast<const uint16_t*>(t.data) + cpu::element_offset(t, b, row0 + r, head);
      std::memcpy(dst, src, sizeof(uint16_t) * d);
      std::memset(dst + d, 0, sizeof(uint16_t) * (ld - d));
    } else {
      std::memset(dst, 0, sizeof(uint16_t) * ld);
    }
  }
}

// The first `valid` rows of tile[.][ld] (d columns) to t, rounded to its dtype.
inline void store_tile(const TensorRef& t, int64_t b, int64_t head, int64_t row0, int64_t valid,
                       int64_t d, float* tile, int64_t ld) {
  for (int64_t r = 0; r < valid; ++r)
    cpu::store_floats(t, cpu::element_offset(t, b, row0 + r, head), d, tile + r * ld);
}

// Scores of one tile row in place: s = dot * scale, softcapped when on (the
// tanh kept in `t` for the backward's derivative when t != nullptr), and
// -inf outside the kept columns [lo, hi].
inline void transform_row(const Shape& s, float* row, int64_t n, int64_t lo, int64_t hi, float* t) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < n; ++c) row[c] *= s.scale;
  if (s.softcap > 0.0f) {
    for (int64_t c = 0; c < n; ++c) {
      const float th = std::tanh(row[c] / s.softcap);  // the mirror's rounding
      if (t != nullptr) t[c] = th;
      row[c] = s.softcap * th;
    }
  }
  for (int64_t c = 0; c < lo && c < n; ++c) row[c] = neg_inf;
  for (int64_t c = hi + 1; c < n; ++c) row[c] = neg_inf;
}

// The tile columns [lo, hi] that query i keeps among keys j0 .. j0 + nk - 1
// (lo > hi: none, also for padding rows i >= Tq).
inline Range kept_columns(const Shape& s, int64_t i, int64_t j0, int64_t nk) {
  if (i >= s.Tq) return Range{};
  const Range r = kept_keys(s, i);
  return Range{std::max<int64_t>(r.first - j0, 0), std::min<int64_t>(r.last - j0, nk - 1)};
}

}  // namespace gqattn::cpu_flash
