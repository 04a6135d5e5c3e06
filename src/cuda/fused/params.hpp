// The shared fused layer: the plain-data kernel arguments both fused
// backends (cuda-flash, cuda-hopper) read: element type, strides, the
// normalised mask, the score transform, and the backward's common
// arguments and workspace rows. No CUDA types here, so host code that fills
// them compiles with the host compiler. Filled on the host by
// problem_args.hpp; checked through both backends' GPU tests.
#pragma once

#include <cstdint>

#include "cuda/fused/host_device.hpp"
#include "cuda/fused/softcap_poly.hpp"

namespace gqattn::fused {

constexpr float kLog2e = 1.4426950408889634f;

constexpr int kChunkBytes = 16;    // one 16-byte access: cp.async, ldmatrix row, wide store
constexpr int kElemsPerChunk = 8;  // 16-bit elements per chunk

enum class ElemType { bf16, f16 };

// Strides in elements of a [B, T, heads, d] tensor (the d stride is 1).
struct RowStrides {
  int64_t batch = 0;
  int64_t row = 0;
  int64_t head = 0;
};

// The mask, already normalised: window == 0 means none, and a window that
// covers every key (window >= Tk) is passed as 0.
struct MaskArgs {
  int tq = 0;
  int tk = 0;
  int window = 0;
  bool causal = false;

  // Every query sees every key (neither mask): all rows, hence all work
  // tiles, are equally long.
  GQATTN_HD bool keeps_all_pairs() const { return !causal && window == 0; }
};

// How a raw dot product q.k becomes the exponent of exp2:
//   no softcap: v = q.k,                     exponent = v * mult, mult = scale * log2(e)
//   softcap:    v = tanh(q.k * scale / cap), exponent = v * mult, mult = cap * log2(e)
struct ScoreArgs {
  bool softcap = false;
  float pre = 0.0f;    // scale / cap (softcap only)
  float mult = 0.0f;   // see above
  float scale = 0.0f;  // the softmax scale (dq, dk get it in backward)
  // Softcap only (softcap_poly.hpp): raw scores |q.k| <= poly_bound have
  // |y| <= kSoftcapPolyMaxY, where tanh is a polynomial; poly_exponent is
  // its coefficients times mult (the no-offset forward's exponents).
  float poly_bound = 0.0f;
  float poly_exponent[kSoftcapPolyTerms] = {};
};

// The backward arguments both fused backends share (cuda-hopper embeds them).
struct BackwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const float* lse = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  RowStrides q_stride, k_stride, v_stride, o_stride, do_stride, dq_stride, dk_stride, dv_stride;
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;
  int B = 0, H = 0, Hkv = 0;
  MaskArgs mask;
  ScoreArgs score;
  // Workspace [B*H, tq_padded] f32, written by the preprocessing kernel:
  // lse2 = lse * log2(e) (+inf for a row with no kept key or past Tq, so that
  // every P of that row is 0) and dsum = D = rowsum(do * o) (0 past Tq).
  float* lse2 = nullptr;
  float* dsum = nullptr;
  int tq_padded = 0;
  // Subtracted from every finite lse2 by the preprocessing kernel. 0 for
  // cuda-flash; cuda-hopper's softcap backward stores lse2 - mult, so that
  // its P = 2^(mult (1 - 2r) - lse2) is one FMA of r (hopper/
  // backward_common.cuh, p_and_ds_factor).
  float lse2_shift = 0.0f;
  // Fused dQ (DqStrategy::kOrdered or kAtomic in tile_sizes.hpp) when
  // dq_accum is non-null: dq_accum [B*H, tq_padded, d] f32 (fragment-major,
  // dq_accum_layout.hpp). Ordered when dq_counters is non-null too: dq_counters [B*H, tq_padded /
  // DkdvTile::kBlockM] int, zero before the dK/dV kernel (0: no key tile has
  // reached the query tile; n + 1: key tile n has added, the last so far:
  // the adds go in ascending key-tile order), and dq_accum is never zeroed
  // (the first key tile to reach a query tile, the lowest, stores; later
  // ones add). Atomic (not deterministic) when dq_counters is null: dq_accum
  // is zeroed and every key tile adds.
  float* dq_accum = nullptr;
  int* dq_counters = nullptr;
};

// The preprocessing kernel: kPreprocessLanesPerRow lanes share one row's
// dot product do . o.
constexpr int kPreprocessThreads = 128;
constexpr int kPreprocessLanesPerRow = 8;
constexpr int kPreprocessRowsPerBlock = kPreprocessThreads / kPreprocessLanesPerRow;

// The workspace rows of the backward are padded to this many queries (a
// multiple of every kBlockM, so whole query tiles load without bounds checks).
constexpr int kWorkspaceRowAlign = 128;

}  // namespace gqattn::fused
