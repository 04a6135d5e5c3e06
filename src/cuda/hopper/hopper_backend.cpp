// cuda-hopper: the BackendImpl of the sm_90a kernels (wgmma, TMA, warp
// specialisation): what it supports (why_not, why_not_tensor), and the
// translation of validated TensorRefs and the call's plan (plan.hpp) into
// kernel parameters, TMA maps and the workspace. Checked by
// tests/cpu/test_hopper_plan.cpp (the plans), tests/gpu/test_hopper_forward.cpp
// and tests/gpu/test_hopper_backward.cpp (every feature against the f64
// oracle, the refusal messages).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "api/backend.hpp"
#include "api/plan_override.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/common/workspace.hpp"
#include "cuda/fused/problem_args.hpp"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/launchers.hpp"
#include "cuda/hopper/plan.hpp"
#include "cuda/hopper/tma_desc.hpp"
#include "cuda/kv_cache/kv_cache_path.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

namespace gqattn::detail {
namespace {

// sm_90a code runs on compute capability 9.0 only.
constexpr int kNeedMajor = 9;
constexpr int kNeedMinor = 0;

// The backward's extra alignment needs: o is read in 16-byte chunks (the
// preprocessing kernel), dq, dk, dv are written two elements per 32-bit
// store.
constexpr std::size_t kChunkBytes = 16;
constexpr std::size_t kPairBytes = 4;

cuda::DeviceLimits device_limits() { return cuda::current_device_limits(kNeedMajor, kNeedMinor); }

// Why the current device cannot run sm_90a code; "" when it can.
std::string why_no_sm90() {
#ifndef GQATTN_HOPPER_SM90A
  return "not supported: this build has no sm_90a code (GQATTN_CUDA_ARCHS=" GQATTN_CUDA_ARCHS
         " lacks 90a)";
#else
  const std::string no_device = cuda::why_no_device(kNeedMajor, kNeedMinor);
  if (!no_device.empty() && no_device.rfind("needs a CUDA device", 0) == 0) return no_device;
  const cuda::DeviceProperties& props = cuda::current_device_properties();
  if (props.cc_major != kNeedMajor || props.cc_minor != kNeedMinor)
    return "needs sm_90 (wgmma/TMA), device is sm_" + std::to_string(props.cc_major) +
           std::to_string(props.cc_minor);
  return cuda::why_no_kernel_image(hopper::any_forward_kernel());
#endif
}

class CudaHopperBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::CudaHopper; }

  std::string why_not(const Problem& p, DType dtype, Device device) const override {
    if (p.kv_cache) {
      // The KV-cache kernels are cuda-flash's too (kv_cache_path.hpp); under
      // this name they run on sm_90 only, like the rest of the backend.
      const std::string shared = kv_cache::why_not("cuda-hopper", p, dtype, device);
      return shared.empty() ? why_no_sm90() : shared;
    }
    const std::string shared = fused::why_not_fused_problem("cuda-hopper", p, dtype, device);
    if (!shared.empty()) return shared;
    // The grid first (it needs no device), then the device, then what the
    // plan needs of it.
    const cuda::DeviceLimits unknown;
    const std::string grid =
        hopper::why_not(hopper::plan_forward(p, dtype, unknown, detail::plan_override()), unknown);
    if (!grid.empty()) return grid;
    const std::string no_sm90 = why_no_sm90();
    if (!no_sm90.empty()) return no_sm90;
    const cuda::DeviceLimits limits = device_limits();
    return hopper::why_not(hopper::plan_forward(p, dtype, limits, detail::plan_override()), limits);
  }

  // The forward's rules, then the backward plan's (every d the forward takes, padded
  // to the kernel's as there).
  std::string why_not_backward(const Problem& p, DType dtype, Device device) const override {
    const std::string r = why_not(p, dtype, device);
    if (!r.empty()) return r;
    const cuda::DeviceLimits limits = device_limits();
    return hopper::why_not(hopper::plan_backward(p, dtype, limits, detail::plan_override()),
                           limits);
  }

  std::string describe_plan(const Problem& p, DType dtype, Pass pass,
                            const Options& options) const override {
    if (p.kv_cache) return kv_cache::describe_plan(p, options);
    const cuda::DeviceLimits limits = device_limits();
    if (pass == Pass::forward)
      return hopper::describe(hopper::plan_forward(p, dtype, limits, detail::plan_override()));
    return hopper::describe(hopper::plan_backward(p, dtype, limits, detail::plan_override()));
  }

  std::string why_not_tensor(const TensorRef& t, const char* name, Pass pass) const override {
    std::string r = cuda::why_not_device_pointer(t.data, name);
    // A varlen batch's packed [total, heads, d] (lse: [H, total_q], rank
    // 2): its rows index as int in the kernels (fused::kMaxSequence).
    const bool lse = std::string(name) == "lse";
    const bool packed = lse ? t.rank == 2 : t.rank == 3;
    const int64_t total = !packed ? 0 : lse ? t.shape[1] : t.shape[0];
    if (r.empty() && total >= fused::kMaxSequence)
      r = std::string("not supported: cuda-hopper needs packed varlen totals < 2^30 (") + name +
          " has " + std::to_string(total) + " rows)";
    // q, k, v (and the backward's do) are read by TMA and need its
    // alignment; dq, dk, dv are written by TMA where all three meet its
    // alignment, else two elements per 32-bit store; the forward writes o
    // by TMA where o meets TMA's alignment, else two elements per 32-bit
    // store (lse one float at a time), while the backward reads o in
    // 16-byte chunks (the preprocessing kernel).
    const std::string role = name;
    if (r.empty() && role == "o" && pass == Pass::backward)
      r = fused::why_misaligned(t, name, kChunkBytes, "the backward's 16-byte loads");
    if (r.empty() && role == "o" && pass == Pass::forward)
      r = fused::why_misaligned(t, name, kPairBytes, "32-bit stores");
    if (r.empty() && (role == "q" || role == "k" || role == "v" || role == "do"))
      r = hopper::why_not_tma(t, name);
    if (r.empty() && (role == "dq" || role == "dk" || role == "dv"))
      r = fused::why_misaligned(t, name, kPairBytes, "32-bit stores");
    if (r.empty()) r = kv_cache::why_not_cache_tensor(t, name);
    return r;
  }

  void forward_kv_cache(const KvCacheArgs& args) const override { kv_cache::forward(args); }

  void forward(const ForwardArgs& a) const override {
    const hopper::ForwardPlan plan =
        hopper::plan_forward(a.problem, a.q.dtype, device_limits(), detail::plan_override());
    hopper::ForwardParams p;
    p.mask = fused::mask_args(a.problem);
    p.score = fused::score_args(a.problem);
    // Packed GQA: the q and o boxes span the 2^shift query heads of a kv
    // head (forward/pack_gqa.hpp).
    p.pack_shift = plan.pack_shift;
    const int heads_per_box = 1 << plan.pack_shift;
    p.q_map = hopper::make_tile_map(a.q, plan.tile.block_m / heads_per_box, "q", heads_per_box);
    p.k_map = hopper::make_tile_map(a.k, plan.tile.block_n, "k");
    p.v_map = hopper::make_tile_map(a.v, plan.tile.block_n, "v");
    // o goes by TMA where its alignment allows (why_not_tensor asks TMA's
    // alignment of q, k, v only): the kernel's choice, results identical.
    // Not for varlen: TMA clips only at the packed end, so a tile crossing
    // its sequence's end would write the next sequence's rows
    // (forward/epilogue.cuh).
    p.o_by_tma = !plan.varlen && hopper::why_not_tma(a.o, "o").empty();
    if (p.o_by_tma)
      p.o_map = hopper::make_tile_map(a.o, hopper::kWgmmaM / heads_per_box, "o", heads_per_box);
    p.o_by_16_byte_stores = fused::why_misaligned(a.o, "o", kChunkBytes, "16-byte stores").empty();
    p.o = a.o.data;
    p.o_stride = fused::row_strides(a.o);
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_batch_stride = a.lse.stride[0];
    p.lse_head_stride = a.lse.stride[1];
    p.B = int(a.problem.B);
    p.H = int(a.problem.H);
    p.Hkv = int(a.problem.Hkv);
    p.head_dim = plan.head_dim;
    p.seq = fused::sequence_args(a.problem, a.offsets, a.q, a.k);
    p.num_splits = plan.splits;
    // Split-KV partials live in a workspace on the caller's stream (freed
    // there after the combine).
    const auto stream = static_cast<cudaStream_t>(a.options.stream);
    const cuda::StreamWorkspace workspace(plan.workspace_bytes, stream);
    if (plan.split_rows > 0) {
      p.o_part = workspace.floats();
      p.lse_part = p.o_part + plan.split_rows * std::size_t(plan.d);
    }
    switch (plan.d) {
      case 64: hopper::launch_forward<64>(plan, p, a.options.stream); break;
      case 128: hopper::launch_forward<128>(plan, p, a.options.stream); break;
      default: hopper::launch_forward<256>(plan, p, a.options.stream); break;
    }
  }

  void backward(const BackwardArgs& a) const override {
    const hopper::BackwardPlan plan =
        hopper::plan_backward(a.problem, a.q.dtype, device_limits(), detail::plan_override(),
                              a.problem.varlen ? a.q.shape[1] : -1);
    const int64_t d = plan.d;  // the kernel's (the tensors' may be padded to it)
    hopper::bwd::BackwardParams p;
    p.q_map = hopper::make_tile_map(a.q, hopper::bwd::kBoxRows, "q");
    p.k_map = hopper::make_tile_map(a.k, hopper::bwd::kv_box_rows(d), "k");
    p.v_map = hopper::make_tile_map(a.v, hopper::bwd::kv_box_rows(d), "v");
    p.do_map = hopper::make_tile_map(a.dout, hopper::bwd::kBoxRows, "do");
    // The gradients go by TMA where all three meet its alignment
    // (why_not_tensor asks 4 bytes of them): the kernels' choice, results
    // identical. Not for varlen: TMA clips only at the packed end, so a
    // tile crossing a sequence's end would write the next one's rows.
    p.grads_by_tma = !plan.varlen && hopper::why_not_tma(a.dq, "dq").empty() &&
                     hopper::why_not_tma(a.dk, "dk").empty() &&
                     hopper::why_not_tma(a.dv, "dv").empty();
    if (p.grads_by_tma) {
      p.dq_map = hopper::make_tile_map(a.dq, hopper::kWgmmaM, "dq");
      p.dk_map = hopper::make_tile_map(a.dk, hopper::kWgmmaM, "dk");
      p.dv_map = hopper::make_tile_map(a.dv, hopper::kWgmmaM, "dv");
    }
    p.c = fused::backward_params(a);
    hopper::bwd::softcap_backward_terms(p);
    p.dkdv_group_pairs = plan.dkdv_group_pairs;

    // The plan's workspace on the caller's stream (StreamWorkspace, from the
    // library's pool: 256-byte aligned, as the bulk copies need; freed on
    // the stream when `workspace` goes out of scope, also when a launch
    // throws): lse2 and D, [B*H, tq_padded] f32 each; with the fused dQ
    // also its f32 accumulator and the semaphores that fix the order of
    // its adds.
    const auto stream = static_cast<cudaStream_t>(a.options.stream);
    const cuda::StreamWorkspace workspace(plan.workspace_bytes, stream);
    p.c.lse2 = workspace.floats();
    p.c.dsum = p.c.lse2 + plan.rows;
    p.dq_accum = plan.accum_floats > 0 ? p.c.dsum + plan.rows : nullptr;
    p.dq_semaphores = plan.semaphores > 0
                          ? reinterpret_cast<int*>(p.c.dsum + plan.rows + plan.accum_floats)
                          : nullptr;
    switch (plan.d) {
      case 64: hopper::bwd::launch_backward<64>(plan, p, a.options.stream); break;
      case 128: hopper::bwd::launch_backward<128>(plan, p, a.options.stream); break;
      default: hopper::bwd::launch_backward<256>(plan, p, a.options.stream); break;
    }
  }
};

}  // namespace

const BackendImpl* cuda_hopper_backend(std::string* /*reason*/) {
  static const CudaHopperBackend backend;
  return &backend;
}

}  // namespace gqattn::detail
