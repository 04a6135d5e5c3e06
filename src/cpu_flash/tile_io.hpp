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
#include <vector>

#include "cpu/mirror.hpp"
#include "cpu_flash/avx512_kernels.hpp"
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

// A tile of f32 rows, `ld` floats apart: in the tensor itself or in scratch.
struct TileView {
  const float* data = nullptr;
  int64_t ld = 0;
};

// rows x d elements of t (batch b, head, rows from row0) as an f32 tile of
// ld_pad-float rows: read where they lie when nothing needs converting or
// padding (f32, d == ld_pad, every row valid), else loaded into `scratch`
// by load_tile. Saves a copy per tile where the same rows are read by many
// tiles (the backward's query side, every key block's K and V).
inline TileView f32_tile(const TensorRef& t, int64_t b, int64_t head, int64_t row0, int64_t rows,
                         int64_t valid, int64_t d, int64_t ld_pad, float* scratch) {
  if (t.dtype == DType::f32 && d == ld_pad && valid == rows)
    return TileView{static_cast<const float*>(t.data) + cpu::element_offset(t, b, row0, head),
                    t.stride[1]};
  load_tile(t, b, head, row0, rows, valid, d, scratch, ld_pad);
  return TileView{scratch, ld_pad};
}

// rows x d elements of a bf16 tensor t (batch b, head, rows from row0) into
// tile[rows][ld] as they are (16-bit words); columns d..ld and rows past
// `valid` are zero. The bf16 tile path's load (avx512_kernels.hpp).
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

// Each row's kept columns of a score tile, in the form the vector softmax
// steps take (ScoreRows).
class KeptColumns {
 public:
  explicit KeptColumns(int64_t rows) : lo_(std::size_t(rows)), hi_(std::size_t(rows)) {}
  // Rows 0 .. rows - 1 of a tile of keys j0 .. j0 + nk - 1, row r being query
  // q0 + r % period (the forward stacks a group's heads, period block_q).
  ScoreRows of(const Shape& s, int64_t q0, int64_t rows, int64_t period, int64_t j0, int64_t nk) {
    for (int64_t r = 0; r < rows; ++r) {
      const Range cols = kept_columns(s, q0 + r % period, j0, nk);
      lo_[std::size_t(r)] = cols.first;
      hi_[std::size_t(r)] = cols.last;
    }
    return ScoreRows{lo_.data(), hi_.data(), s.scale, s.softcap};
  }

 private:
  std::vector<int64_t> lo_, hi_;
};

}  // namespace gqattn::cpu_flash
