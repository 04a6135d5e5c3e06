// cuda-flash: the BackendImpl of the fused mma.sync kernels (sm80 and up):
// what it supports (why_not, why_not_tensor), and the translation of
// validated TensorRefs into kernel parameters. Checked by
// tests/gpu/test_flash_*.cpp (every feature against the f64 oracle, the
// alignment and support messages).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "api/backend.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/common/workspace.hpp"
#include "cuda/flash/launchers.hpp"
#include "cuda/flash/params.hpp"
#include "cuda/flash/smem_support.hpp"
#include "cuda/flash/tile_sizes.hpp"
#include "cuda/fused/problem_args.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

namespace gqattn::flash {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

int64_t forward_blocks(int d, int64_t B, int64_t H, int64_t Tq) {
  const int bm = d == 64    ? ForwardTile<64>::kBlockM
                 : d == 128 ? ForwardTile<128>::kBlockM
                            : ForwardTile<256>::kBlockM;
  return ceil_div(Tq, bm) * B * H;
}
int64_t dkdv_blocks(int d, int64_t B, int64_t Hkv, int64_t Tk, DkdvTileSize tile) {
  return ceil_div(Tk, dkdv_key_tile(d, tile)) * B * Hkv;
}
int64_t dq_blocks(int d, int64_t B, int64_t H, int64_t Tq) {
  const int bm = d == 64    ? DqTile<64>::kBlockM
                 : d == 128 ? DqTile<128>::kBlockM
                            : DqTile<256>::kBlockM;
  return ceil_div(Tq, bm) * B * H;
}
int64_t preprocess_blocks(int64_t B, int64_t H, int64_t tq_padded) {
  return ceil_div(B * H * tq_padded, fused::kPreprocessRowsPerBlock);
}
int64_t dq_postprocess_blocks(int d, int64_t B, int64_t H, int64_t tq_padded) {
  return ceil_div(B * H * tq_padded * (d / kDqPostElemsPerThread), kDqPostThreads);
}

}  // namespace gqattn::flash

namespace gqattn::detail {
namespace {

using fused::ElemType;

constexpr int64_t kMaxGridX = std::numeric_limits<int>::max();
constexpr std::size_t kLoadBytes = 16;  // cp.async chunk

// "" when the device allows the shared memory per block that `pass` needs.
std::string why_too_little_smem(int64_t d, Pass pass) {
  return flash::why_too_little_smem(int(d), pass == Pass::backward,
                                    cuda::current_device_properties().max_shared_per_block_optin);
}

// The dK/dV tile the backward of d takes: the largest of d's tiles that
// fits the device's shared memory per block (flash::dkdv_tile_for_device).
// GQATTN_FLASH_DKDV_TILE=small or =smaller forces that size, or d's
// smallest where d has none that small (a testing switch, so that a device
// with enough shared memory runs them too); =default is the same as unset,
// and any other value throws.
flash::DkdvTileSize dkdv_tile(int64_t d) {
  constexpr const char* kVar = "GQATTN_FLASH_DKDV_TILE";
  const char* env = std::getenv(kVar);
  if (env != nullptr && std::strcmp(env, "small") == 0)
    return flash::clamp_dkdv_tile(int(d), flash::DkdvTileSize::kSmall);
  if (env != nullptr && std::strcmp(env, "smaller") == 0)
    return flash::clamp_dkdv_tile(int(d), flash::DkdvTileSize::kSmaller);
  if (env != nullptr && *env != '\0' && std::strcmp(env, "default") != 0)
    throw Error(std::string(kVar) + " = '" + env + "'",
                "must be default, small or smaller (or unset)");
  return flash::dkdv_tile_for_device(int(d),
                                     cuda::current_device_properties().max_shared_per_block_optin);
}

// "" when t's data pointer and the strides of every dimension that is
// walked are multiples of 16 bytes (cp.async and the 16-byte stores).
std::string why_misaligned(const TensorRef& t, const char* name) {
  const std::size_t elem = dtype_size(t.dtype);
  if (reinterpret_cast<std::uintptr_t>(t.data) % kLoadBytes != 0)
    return std::string(name) + ".data must be 16-byte aligned for 16-byte loads";
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] > 1 && (std::size_t(t.stride[i]) * elem) % kLoadBytes != 0)
      return std::string(name) + ".stride[" + std::to_string(i) + "]*" + std::to_string(elem) +
             " bytes must be a multiple of 16 for 16-byte loads (stride[" + std::to_string(i) +
             "] = " + std::to_string(t.stride[i]) + ")";
  }
  return "";
}

std::string why_not_resident(const TensorRef& t, const char* name) {
  return cuda::why_not_device_pointer(t.data, name);
}

// The dQ strategy of this call. GQATTN_FLASH_DQ=ordered|separate|atomic
// when set (lets tests and benchmarks compare them); else, with
// Options::deterministic (the default) the faster deterministic one for
// this problem and dK/dV tile (flash::default_dq_strategy), without it the
// fastest, atomic.
// Atomic is never run for a call that asked for deterministic results:
// GQATTN_FLASH_DQ=atomic then throws, as does an unknown value (a typo must
// not silently measure something else), and so does separate with a dK/dV
// tile that has no separate dQ kernel (d256's kSmaller).
flash::DqStrategy dq_strategy(const Problem& problem, bool deterministic,
                              flash::DkdvTileSize tile) {
  constexpr const char* kVar = "GQATTN_FLASH_DQ";
  const char* env = std::getenv(kVar);
  if (env == nullptr || *env == '\0')
    return deterministic
               ? flash::default_dq_strategy(int(problem.d), problem.causal, problem.Tk, tile)
               : flash::DqStrategy::kAtomic;
  if (std::strcmp(env, "ordered") == 0) return flash::DqStrategy::kOrdered;
  if (std::strcmp(env, "separate") == 0) {
    if (flash::dkdv_fused_dq_only(int(problem.d), tile)) {
      const std::size_t small_tile_kb = flash::kb_rounded_up(
          flash::dkdv_max_smem_bytes(int(problem.d), flash::DkdvTileSize::kSmall));
      throw Error(std::string(kVar) + " = separate",
                  "not supported: cuda-flash's backward at d=" + std::to_string(problem.d) +
                      " on devices with less than " + std::to_string(small_tile_kb) +
                      " KB of shared memory per block (and with GQATTN_FLASH_DKDV_TILE = "
                      "smaller) runs only the fused dQ paths, ordered and atomic");
    }
    return flash::DqStrategy::kSeparate;
  }
  if (std::strcmp(env, "atomic") == 0) {
    if (deterministic)
      throw Error(std::string(kVar) + " = atomic",
                  "cuda-flash's atomic dQ is not deterministic: it needs "
                  "Options::deterministic = false, and this call has deterministic = true");
    return flash::DqStrategy::kAtomic;
  }
  throw Error(std::string(kVar) + " = '" + env + "'",
              "must be ordered, separate or atomic (or unset)");
}

fused::ElemType elem_type(DType dtype) {
  return dtype == DType::bf16 ? fused::ElemType::bf16 : fused::ElemType::f16;
}

class CudaFlashBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::CudaFlash; }

  // The forward: its own grid and shared memory, so a forward runs on a
  // device too small for the backward's kernels.
  std::string why_not(const Problem& p, DType dtype, Device device) const override {
    const std::string shared = fused::why_not_fused_problem("cuda-flash", p, dtype, device);
    if (!shared.empty()) return shared;
    const int64_t grid = flash::forward_blocks(int(p.d), p.B, p.H, p.Tq);
    if (grid > kMaxGridX)
      return "not supported: cuda-flash needs at most 2^31-1 thread blocks (B*H*Tq too large: " +
             std::to_string(grid) + " blocks)";
    const std::string device_reason = cuda::why_no_device(8, 0);
    if (!device_reason.empty()) return device_reason;
    return why_too_little_smem(p.d, Pass::forward);
  }

  // The backward: the forward's conditions, then its own kernels' grids and
  // shared memory.
  std::string why_not_backward(const Problem& p, DType dtype, Device device) const override {
    const std::string forward_reason = why_not(p, dtype, device);
    if (!forward_reason.empty()) return forward_reason;
    const int d = int(p.d);
    // Every dK/dV tile's grid: which one runs is decided per call (the
    // device, GQATTN_FLASH_DKDV_TILE).
    using S = flash::DkdvTileSize;
    const int64_t grid = std::max(
        {flash::dkdv_blocks(d, p.B, p.Hkv, p.Tk, S::kDefault),
         flash::dkdv_blocks(d, p.B, p.Hkv, p.Tk, S::kSmall),
         flash::dkdv_blocks(d, p.B, p.Hkv, p.Tk, S::kSmaller), flash::dq_blocks(d, p.B, p.H, p.Tq),
         flash::preprocess_blocks(p.B, p.H, fused::tq_padded(p.Tq)),
         flash::dq_postprocess_blocks(d, p.B, p.H, fused::tq_padded(p.Tq))});
    if (grid > kMaxGridX)
      return "not supported: cuda-flash's backward needs at most 2^31-1 thread blocks "
             "(B*H*Tq too large: " +
             std::to_string(grid) + " blocks)";
    return why_too_little_smem(p.d, Pass::backward);
  }

  std::string why_not_tensor(const TensorRef& t, const char* name, Pass) const override {
    std::string r = why_not_resident(t, name);
    // lse is f32 and read or written one element at a time.
    if (r.empty() && t.rank == 4) r = why_misaligned(t, name);
    return r;
  }

  void forward(const ForwardArgs& a) const override {
    flash::ForwardParams p;
    p.q = a.q.data;
    p.k = a.k.data;
    p.v = a.v.data;
    p.o = a.o.data;
    p.lse = static_cast<float*>(a.lse.data);
    p.q_stride = fused::row_strides(a.q);
    p.k_stride = fused::row_strides(a.k);
    p.v_stride = fused::row_strides(a.v);
    p.o_stride = fused::row_strides(a.o);
    p.lse_batch_stride = a.lse.stride[0];
    p.lse_head_stride = a.lse.stride[1];
    p.B = int(a.problem.B);
    p.H = int(a.problem.H);
    p.Hkv = int(a.problem.Hkv);
    p.mask = fused::mask_args(a.problem);
    p.score = fused::score_args(a.problem);
    const fused::ElemType elem = elem_type(a.q.dtype);
    switch (a.problem.d) {
      case 64: flash::launch_forward<64>(p, elem, a.options.stream); break;
      case 128: flash::launch_forward<128>(p, elem, a.options.stream); break;
      default: flash::launch_forward<256>(p, elem, a.options.stream); break;
    }
  }

  void backward(const BackwardArgs& a) const override {
    fused::BackwardParams p = fused::backward_params(a);
    const int64_t padded = p.tq_padded;

    // Before anything is allocated or written: may throw (see dkdv_tile and
    // dq_strategy).
    const flash::DkdvTileSize tile = dkdv_tile(a.problem.d);
    const flash::DqStrategy strategy = dq_strategy(a.problem, a.options.deterministic, tile);
    const bool ordered = strategy == flash::DqStrategy::kOrdered;
    const bool fused = ordered || strategy == flash::DqStrategy::kAtomic;

    // Workspace: lse2 and D, [B*H, tq_padded] f32 each, on the caller's
    // stream; for fused (ordered or atomic) dQ also the f32 dQ accumulator
    // [B*H, tq_padded, d], and for ordered the dQ counters (one int per row:
    // at least one per (b, h, query tile)) - linear in Tq. From the
    // library's pool (cuda/common/workspace.hpp), freed on the stream when
    // `workspace` goes out of scope, also when a launch throws.
    const auto stream = static_cast<cudaStream_t>(a.options.stream);
    const std::size_t rows = std::size_t(a.problem.B * a.problem.H * padded);
    const std::size_t accum = fused ? rows * std::size_t(a.problem.d) : 0;
    const std::size_t counters = ordered ? rows : 0;
    const cuda::StreamWorkspace workspace(
        (2 * rows + accum) * sizeof(float) + counters * sizeof(int), stream);
    p.lse2 = workspace.floats();
    p.dsum = p.lse2 + rows;
    if (fused) p.dq_accum = p.dsum + rows;
    if (ordered) p.dq_counters = reinterpret_cast<int*>(p.dq_accum + accum);
    const fused::ElemType elem = elem_type(a.q.dtype);
    switch (a.problem.d) {
      case 64: flash::launch_backward<64>(p, elem, tile, a.options.stream); break;
      case 128: flash::launch_backward<128>(p, elem, tile, a.options.stream); break;
      default: flash::launch_backward<256>(p, elem, tile, a.options.stream); break;
    }
  }
};

}  // namespace

const BackendImpl* cuda_flash_backend(std::string* /*reason*/) {
  static const CudaFlashBackend backend;
  return &backend;
}

}  // namespace gqattn::detail
