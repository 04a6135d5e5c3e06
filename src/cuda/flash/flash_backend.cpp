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
#include "api/plan_override.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/common/workspace.hpp"
#include "cuda/flash/launchers.hpp"
#include "cuda/flash/params.hpp"
#include "cuda/flash/plan.hpp"
#include "cuda/flash/smem_support.hpp"
#include "cuda/flash/tile_sizes.hpp"
#include "cuda/fused/problem_args.hpp"
#include "cuda/kv_cache/kv_cache_path.hpp"
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

using fused::kMaxGridX;
constexpr std::size_t kLoadBytes = 16;  // cp.async chunk

// "" when the device allows the shared memory per block that `pass` needs
// at head dim d (its kernels', fused::kernel_head_dim(d)).
std::string why_too_little_smem(int64_t d, Pass pass) {
  const int kernel_d = fused::kernel_head_dim(d);
  std::string reason =
      flash::why_too_little_smem(kernel_d, pass == Pass::backward,
                                 cuda::current_device_properties().max_shared_per_block_optin);
  if (!reason.empty() && kernel_d != d)
    reason +=
        " (d=" + std::to_string(d) + " runs on the d=" + std::to_string(kernel_d) + " kernels)";
  return reason;
}

std::string why_not_resident(const TensorRef& t, const char* name) {
  return cuda::why_not_device_pointer(t.data, name);
}

class CudaFlashBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::CudaFlash; }

  // The forward: its own grid and shared memory, so a forward runs on a
  // device too small for the backward's kernels.
  std::string why_not(const Problem& p, DType dtype, Device device) const override {
    if (p.kv_cache) return kv_cache::why_not("cuda-flash", p, dtype, device);
    const std::string shared = fused::why_not_fused_problem("cuda-flash", p, dtype, device);
    if (!shared.empty()) return shared;
    // Every d the shared rule takes (d <= 256, a multiple of 8): a d between
    // the kernels' (64, 128, 256) runs the next one's padded instances
    // (fused::kernel_head_dim; docs/decisions/flash-padded-head-dims.md).
    const int kernel_d = fused::kernel_head_dim(p.d);
    const int64_t grid = flash::forward_blocks(kernel_d, p.B, p.H, p.Tq);
    if (grid > kMaxGridX)
      return "not supported: cuda-flash needs at most 2^31-1 thread blocks (B*H*Tq too large: " +
             std::to_string(grid) + " blocks)";
    std::string device_reason = cuda::why_no_device(8, 0);
    if (device_reason.empty())
      device_reason = cuda::why_no_kernel_image(flash::any_forward_kernel());
    if (!device_reason.empty()) return device_reason;
    return why_too_little_smem(p.d, Pass::forward);
  }

  // The backward: the forward's conditions, then its own kernels' grids and
  // shared memory.
  std::string why_not_backward(const Problem& p, DType dtype, Device device) const override {
    const std::string forward_reason = why_not(p, dtype, device);
    if (!forward_reason.empty()) return forward_reason;
    const int d = fused::kernel_head_dim(p.d);  // the kernels'
    // Every dK/dV tile's grid, so that the verdict does not depend on the
    // tile the plan takes.
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
    // A forced path the plan cannot take (whether the call allows the
    // atomic dQ is known only at the call).
    const std::string forced =
        flash::plan_backward(p, dtype, cuda::current_device_limits(8, 0),
                             /*deterministic=*/false, detail::plan_override())
            .forced;
    if (!forced.empty()) return forced;
    return why_too_little_smem(p.d, Pass::backward);
  }

  // Rank 4: a dense q, k, v, o, do, dq, dk, dv; rank 3: dense lse or a
  // varlen batch's packed [total, heads, d] (lse: [H, total_q], rank 2).
  std::string why_not_tensor(const TensorRef& t, const char* name, Pass) const override {
    std::string r = why_not_resident(t, name);
    if (!r.empty()) return r;
    const bool lse = std::strcmp(name, "lse") == 0;
    // Packed rows index as int in the kernels (fused::kMaxSequence).
    const bool packed = lse ? t.rank == 2 : t.rank == 3;
    const int64_t total = !packed ? 0 : lse ? t.shape[1] : t.shape[0];
    if (total >= fused::kMaxSequence)
      return std::string("not supported: cuda-flash needs packed varlen totals < 2^30 (") + name +
             " has " + std::to_string(total) + " rows)";
    // lse is f32 and read or written one element at a time.
    if (!lse && t.rank >= 3) r = fused::why_misaligned(t, name, kLoadBytes, "16-byte loads");
    return r;
  }

  void forward_kv_cache(const KvCacheArgs& args) const override { kv_cache::forward(args); }

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
    p.seq = fused::sequence_args(a.problem, a.offsets, a.q, a.k);
    const flash::ForwardPlan plan = flash::plan_forward(a.problem, a.q.dtype);
    p.head_dim = plan.head_dim;
    switch (plan.d) {
      case 64: flash::launch_forward<64>(plan, p, a.options.stream); break;
      case 128: flash::launch_forward<128>(plan, p, a.options.stream); break;
      default: flash::launch_forward<256>(plan, p, a.options.stream); break;
    }
  }

  void backward(const BackwardArgs& a) const override {
    // Before anything is allocated or written.
    const flash::BackwardPlan plan =
        backward_plan(a.problem, a.q.dtype, a.options, a.problem.varlen ? a.q.shape[1] : -1);
    if (!plan.forced.empty()) throw Error("backend", "cuda-flash: " + plan.forced);
    fused::BackwardParams p = fused::backward_params(a);
    p.head_dim = plan.head_dim;  // the problem's (backward_params's too): the padded kernels' bound
    // The plan's workspace on the caller's stream, from the library's pool
    // (cuda/common/workspace.hpp), freed on the stream when `workspace`
    // goes out of scope, also when a launch throws.
    const auto stream = static_cast<cudaStream_t>(a.options.stream);
    const cuda::StreamWorkspace workspace(plan.workspace_bytes, stream);
    p.lse2 = workspace.floats();
    p.dsum = p.lse2 + plan.rows;
    if (plan.accum_floats > 0) p.dq_accum = p.dsum + plan.rows;
    if (plan.counters > 0) p.dq_counters = reinterpret_cast<int*>(p.dq_accum + plan.accum_floats);
    switch (plan.d) {
      case 64: flash::launch_backward<64>(plan, p, a.options.stream); break;
      case 128: flash::launch_backward<128>(plan, p, a.options.stream); break;
      default: flash::launch_backward<256>(plan, p, a.options.stream); break;
    }
  }

  std::string describe_plan(const Problem& p, DType dtype, Pass pass,
                            const Options& options) const override {
    if (p.kv_cache) return kv_cache::describe_plan(p, options);
    if (pass == Pass::forward) return flash::describe(flash::plan_forward(p, dtype));
    return flash::describe(backward_plan(p, dtype, options));
  }

 private:
  // total_q: a varlen batch's packed query rows (batch-of-one q: shape[1]),
  // -1 where no tensor is known (describe_plan).
  static flash::BackwardPlan backward_plan(const Problem& p, DType dtype, const Options& options,
                                           int64_t total_q = -1) {
    return flash::plan_backward(p, dtype, cuda::current_device_limits(8, 0), options.deterministic,
                                detail::plan_override(), total_q);
  }
};

}  // namespace

const BackendImpl* cuda_flash_backend(std::string* /*reason*/) {
  static const CudaFlashBackend backend;
  return &backend;
}

}  // namespace gqattn::detail
