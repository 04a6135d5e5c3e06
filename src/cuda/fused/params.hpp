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

// The mask of one sequence, already normalised: query i sits at position
// i + off (Problem::q_start), window == 0 means none, and a window that
// keeps every key on the left (window >= off + tq) is passed as 0. In a
// varlen batch, the kernels make each sequence's from the batch's
// (sequence.hpp).
struct MaskArgs {
  int tq = 0;
  int tk = 0;
  int off = 0;
  int window = 0;
  bool causal = false;

  // Every query sees every key (neither mask): all rows, hence all work
  // tiles, are equally long.
  GQATTN_HD bool keeps_all_pairs() const { return !causal && window == 0; }
};

// A varlen batch's sequence offsets in device memory (all null for a dense
// batch), read by sequence.hpp, which clamps every value it derives from
// them into the tensors: offsets the library did not check can give wrong
// numbers, never an access outside the tensors.
struct SequenceArgs {
  const int* cu_seqlens_q = nullptr;  // [B + 1]
  const int* cu_seqlens_k = nullptr;  // [B + 1]
  const int* seqused_k = nullptr;     // [B] or null
  int total_q = 0;                    // rows of the packed q, o (and lse columns)
  int total_k = 0;                    // rows of the packed k, v
  // Problem::q_start was given: every sequence's queries start there
  // (MaskArgs::off of the batch); else at its own Tk_b - Tq_b.
  bool q_start_given = false;

  GQATTN_HD bool varlen() const { return cu_seqlens_q != nullptr; }
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
  // The tensors' head dim: the kernel's own, or less where a backend pads
  // (problem_args.hpp kernel_head_dim): columns from head_dim on are never
  // read from or written to the tensors.
  int head_dim = 0;
  MaskArgs mask;
  ScoreArgs score;
  // Workspace [B*H, tq_padded] f32, written by the preprocessing kernel:
  // lse2 = lse * log2(e) (+inf for a row with no kept key or past Tq, so that
  // every P of that row is 0) and dsum = D = rowsum(do * o) (0 past Tq).
  // Varlen: one block of varlen_workspace_rows(total_q, B) rows per head
  // instead (sequence.hpp); workspace_row() gives a (b, h) block's first row.
  float* lse2 = nullptr;
  float* dsum = nullptr;
  int tq_padded = 0;
  SequenceArgs seq;              // varlen offsets (null: dense)
  int64_t varlen_head_rows = 0;  // varlen_workspace_rows(total_q, B) when varlen
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

// The first workspace row of sequence b, head h; ws_row0 is
// sequence_of(...).ws_row0 (sequence.hpp), used by varlen batches only.
GQATTN_HD int64_t workspace_row(const BackwardParams& p, int b, int h, int ws_row0) {
  return p.seq.varlen() ? int64_t(h) * p.varlen_head_rows + ws_row0
                        : (int64_t(b) * p.H + h) * p.tq_padded;
}

// The preprocessing kernel: kPreprocessLanesPerRow lanes share one row's
// dot product do . o.
constexpr int kPreprocessThreads = 128;
constexpr int kPreprocessLanesPerRow = 8;
constexpr int kPreprocessRowsPerBlock = kPreprocessThreads / kPreprocessLanesPerRow;

// The workspace rows of the backward are padded to this many queries (a
// multiple of every kBlockM, so whole query tiles load without bounds checks).
constexpr int kWorkspaceRowAlign = 128;

}  // namespace gqattn::fused
