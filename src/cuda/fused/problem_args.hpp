// The shared fused layer, host side: the fused kernels' plain-data arguments
// (params.hpp) made from validated arguments, and the rules both fused
// backends (cuda-flash, cuda-hopper) apply to a problem and its tensors.
// Checked through both backends' GPU tests and tests/cpu/test_*_plan.cpp.
#pragma once

#include <cfloat>
#include <cmath>

#include <cstdint>
#include <limits>
#include <string>

#include "api/backend.hpp"
#include "cuda/fused/params.hpp"
#include "cuda/fused/sequence.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/types.hpp"

namespace gqattn::fused {

// Sequence lengths, packed totals and |q_start| stay below this so that
// every index the fused kernels form (i + off, j - off + window with the
// window below off + Tq, tile offsets, TMA coordinates) fits in an int.
constexpr int64_t kMaxSequence = int64_t{1} << 30;

// The batch's mask, normalised (Problem::effective_window): a dense
// batch's, or the bounds of a varlen batch's, whose sequences
// (sequence_of) take their own lengths, offset and window from it. A
// varlen window is normalised per sequence, so here it is only capped (a
// window of INT_MAX or more keeps every key on the left of every position
// the fused backends accept, all below 2^31 - 1).
inline MaskArgs mask_args(const Problem& p) {
  MaskArgs m;
  m.tq = int(p.Tq);
  m.tk = int(p.Tk);
  m.off = int(p.query_start());
  m.causal = p.causal;
  m.window = p.varlen ? int(p.window < std::numeric_limits<int>::max() ? p.window : 0)
                      : int(p.effective_window());
  return m;
}

// The device view of a varlen batch's offsets; all null for a dense batch.
inline SequenceArgs sequence_args(const Problem& p, const VarlenOffsets& o, const TensorRef& q,
                                  const TensorRef& k) {
  SequenceArgs s;
  if (!p.varlen) return s;
  s.cu_seqlens_q = o.cu_seqlens_q.data;
  s.cu_seqlens_k = o.cu_seqlens_k.data;
  s.seqused_k = o.seqused_k.data;
  s.total_q = int(q.shape[1]);  // batch-of-one views (api/backend.hpp)
  s.total_k = int(k.shape[1]);
  s.q_start_given = p.q_start.has_value();
  return s;
}

// Softcap folds the scale into tanh's argument and the cap into the
// exponent's multiplier; without it the scale goes into the multiplier.
inline ScoreArgs score_args(const Problem& p) {
  ScoreArgs s;
  s.scale = p.effective_scale();
  s.softcap = p.softcap > 0.0f;
  if (s.softcap) {
    s.pre = s.scale / p.softcap;
    if (!std::isfinite(s.pre)) s.pre = FLT_MAX;  // a denormal cap: tanh saturates, never 0 * inf
    s.mult = p.softcap * kLog2e;
    // For the FLT_MAX pre the bound is subnormal: only s = 0 passes, whose
    // polynomial tanh is 0, as it should be.
    s.poly_bound = kSoftcapPolyMaxY / s.pre;
    for (int i = 0; i < kSoftcapPolyTerms; ++i) s.poly_exponent[i] = kSoftcapPolyCoef[i] * s.mult;
  } else {
    s.mult = s.scale * kLog2e;
  }
  return s;
}

// Padded head dims: cuda-hopper runs every d <= 256 that is a multiple of 8
// on the kernel of kernel_head_dim(d), the next instantiated one, whose
// loads fill the columns past d with zeros (they add nothing to q.k, and
// P V gives 0 there) and whose stores skip them (BackwardParams::head_dim,
// hopper's ForwardParams::head_dim); cuda-flash takes only d ==
// kernel_head_dim(d).
inline bool head_dim_supported(int64_t d) { return d >= 8 && d <= 256 && d % 8 == 0; }
inline int kernel_head_dim(int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

// The rules the fused backends share (device, dtype, head dim, sequence
// length): "" when `backend` passes them, else the reason.
inline std::string why_not_fused_problem(const char* backend, const Problem& p, DType dtype,
                                         Device device) {
  if (device != Device::cuda) return "runs on CUDA devices only (got device cpu)";
  const bool dtype_ok = dtype == DType::bf16 || dtype == DType::f16;
  const bool d_ok = head_dim_supported(p.d);
  if (!dtype_ok || !d_ok) {
    std::string got;
    if (!d_ok) got = "d=" + std::to_string(p.d);
    if (!dtype_ok) got += std::string(got.empty() ? "" : ", ") + "dtype " + dtype_name(dtype);
    return std::string("not supported: ") + backend +
           " supports d <= 256, a multiple of 8, and dtypes bf16/f16 (got " + got + ")";
  }
  if (p.Tq >= kMaxSequence || p.Tk >= kMaxSequence)
    return std::string("not supported: ") + backend +
           " needs Tq, Tk < 2^30 (got Tq=" + std::to_string(p.Tq) + ", Tk=" + std::to_string(p.Tk) +
           ")";
  const int64_t q_start = p.query_start();
  if (q_start >= kMaxSequence || q_start <= -kMaxSequence)
    return std::string("not supported: ") + backend + " needs |q_start| < 2^30 (got " +
           std::to_string(q_start) + ")";
  return "";
}

// A 1-D grid has at most this many thread blocks.
constexpr int64_t kMaxGridX = std::numeric_limits<int>::max();

// "" when t's data pointer and the strides of every dimension longer than 1
// are multiples of `bytes` (what `use`, e.g. "16-byte loads", needs); else
// which one is not.
inline std::string why_misaligned(const TensorRef& t, const char* name, std::size_t bytes,
                                  const char* use) {
  const std::size_t elem = dtype_size(t.dtype);
  if (reinterpret_cast<std::uintptr_t>(t.data) % bytes != 0)
    return std::string(name) + ".data must be " + std::to_string(bytes) + "-byte aligned for " +
           use;
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.shape[i] > 1 && (std::size_t(t.stride[i]) * elem) % bytes != 0)
      return std::string(name) + ".stride[" + std::to_string(i) + "]*" + std::to_string(elem) +
             " bytes must be a multiple of " + std::to_string(bytes) + " for " + use + " (stride[" +
             std::to_string(i) + "] = " + std::to_string(t.stride[i]) + ")";
  return "";
}

// Strides of a [B, T, heads, d] tensor (the d stride is 1).
inline RowStrides row_strides(const TensorRef& t) {
  return {t.stride[0], t.stride[1], t.stride[2]};
}

// Rows of the backward's per-(b, h) f32 workspaces (lse2, D, ...): Tq rounded
// up so that every (b, h) block starts aligned for wide and bulk copies.
inline int64_t tq_padded(int64_t tq) {
  return (tq + kWorkspaceRowAlign - 1) / kWorkspaceRowAlign * kWorkspaceRowAlign;
}

// Everything of BackwardParams but the workspaces (lse2, dsum, and the
// fused-dQ buffers), which the caller allocates on its stream.
inline BackwardParams backward_params(const detail::BackwardArgs& a) {
  BackwardParams p;
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.o.data;
  p.lse = static_cast<const float*>(a.lse.data);
  p.dout = a.dout.data;
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  p.q_stride = row_strides(a.q);
  p.k_stride = row_strides(a.k);
  p.v_stride = row_strides(a.v);
  p.o_stride = row_strides(a.o);
  p.do_stride = row_strides(a.dout);
  p.dq_stride = row_strides(a.dq);
  p.dk_stride = row_strides(a.dk);
  p.dv_stride = row_strides(a.dv);
  p.lse_batch_stride = a.lse.stride[0];
  p.lse_head_stride = a.lse.stride[1];
  p.B = int(a.problem.B);
  p.H = int(a.problem.H);
  p.Hkv = int(a.problem.Hkv);
  p.head_dim = int(a.problem.d);
  p.mask = mask_args(a.problem);
  p.score = score_args(a.problem);
  p.tq_padded = int(tq_padded(a.problem.Tq));
  p.seq = sequence_args(a.problem, a.offsets, a.q, a.k);
  if (p.seq.varlen()) p.varlen_head_rows = varlen_workspace_rows(p.seq.total_q, p.B);
  return p;
}

}  // namespace gqattn::fused
