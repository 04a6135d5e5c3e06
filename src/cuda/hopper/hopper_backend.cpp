// cuda-hopper: the BackendImpl of the sm_90a forward (wgmma, TMA, warp
// specialisation): what it supports (why_not, why_not_tensor), and the
// translation of validated TensorRefs into kernel parameters and TMA maps.
// Backward (bwd::launch_backward) runs d in {64, 128, 256}. Checked by
// tests/gpu/test_hopper_backward.cpp (backward against the f64 oracle) and
// tests/gpu/test_hopper_forward.cpp (every feature against the f64 oracle,
// the refusal messages).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "api/backend.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/common/workspace.hpp"
#include "cuda/fused/problem_args.hpp"
#include "cuda/hopper/backward/dq_choice.hpp"
#include "cuda/hopper/backward/grid_order.hpp"
#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/forward/pack_gqa.hpp"
#include "cuda/hopper/forward/params.hpp"
#include "cuda/hopper/forward/split_kv.hpp"
#include "cuda/hopper/forward/tile_sizes.hpp"
#include "cuda/hopper/launchers.hpp"
#include "cuda/hopper/tma_desc.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

namespace gqattn::hopper {

int64_t forward_blocks(int block_m, int64_t B, int64_t H, int64_t Tq) {
  return (Tq + block_m - 1) / block_m * B * H;
}

}  // namespace gqattn::hopper

namespace gqattn::detail {
namespace {

constexpr int64_t kMaxGridX = std::numeric_limits<int>::max();
// sm_90a code runs on compute capability 9.0 only.
constexpr int kNeedMajor = 9;
constexpr int kNeedMinor = 0;

// The tile problem p runs on (tile_sizes.hpp forward_shape), decided on
// mask_args and score_args exactly as the launcher decides on
// ForwardParams::mask and ::score (a window >= Tk is no window).
hopper::ForwardTileDims forward_tile(const Problem& p) {
  const fused::MaskArgs m = fused::mask_args(p);
  const hopper::TileShape shape =
      hopper::forward_shape(int(p.d), m.causal, m.window, m.tq, m.tk, fused::score_args(p).softcap);
  return hopper::forward_tile_dims(int(p.d), shape);
}

// The backward's extra alignment needs: o is read in 16-byte chunks (the
// preprocessing kernel), dq, dk, dv are written two elements per 32-bit
// store. "" when the data pointer and the strides of every dimension longer
// than 1 are multiples of `bytes`.
constexpr std::size_t kChunkBytes = 16;
constexpr std::size_t kPairBytes = 4;
std::string why_misaligned(const TensorRef& t, const char* name, std::size_t bytes,
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

class CudaHopperBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::CudaHopper; }

  std::string why_not(const Problem& p, DType dtype, Device device) const override {
    const std::string shared = fused::why_not_fused_problem("cuda-hopper", p, dtype, device);
    if (!shared.empty()) return shared;
    const int64_t grid = hopper::forward_blocks(forward_tile(p).block_m, p.B, p.H, p.Tq);
    if (grid > kMaxGridX)
      return "not supported: cuda-hopper needs at most 2^31-1 thread blocks (B*H*Tq too large: " +
             std::to_string(grid) + " blocks)";
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
    const std::size_t need = forward_tile(p).smem_bytes;
    if (need > props.max_shared_per_block_optin)
      return "not supported: cuda-hopper d=" + std::to_string(p.d) + " needs " +
             std::to_string(need / 1024) + " KB of shared memory per block, the device allows " +
             std::to_string(props.max_shared_per_block_optin / 1024) + " KB";
    return "";
#endif
  }

  std::string why_not_tensor(const TensorRef& t, const char* name, Pass pass) const override {
    std::string r = cuda::why_not_device_pointer(t.data, name);
    // q, k, v (and the backward's do) are read by TMA and need its
    // alignment; dq, dk, dv are written by TMA where all three meet its
    // alignment, else two elements per 32-bit store; the
    // forward writes o by TMA where o meets TMA's alignment, else two
    // elements per 32-bit store (lse one float at a time), while the
    // backward reads o in 16-byte chunks (cuda-flash's preprocessing kernel).
    const std::string role = name;
    if (r.empty() && role == "o" && pass == Pass::backward)
      r = why_misaligned(t, name, kChunkBytes, "the backward's 16-byte loads");
    if (r.empty() && role == "o" && pass == Pass::forward)
      r = why_misaligned(t, name, kPairBytes, "32-bit stores");
    if (r.empty() && (role == "q" || role == "k" || role == "v" || role == "do"))
      r = hopper::why_not_tma(t, name);
    if (r.empty() && (role == "dq" || role == "dk" || role == "dv"))
      r = why_misaligned(t, name, kPairBytes, "32-bit stores");
    return r;
  }

  void forward(const ForwardArgs& a) const override {
    const int64_t d = a.problem.d;
    // The tile launch_forward picks from p.mask and p.score.
    const hopper::ForwardTileDims tile = forward_tile(a.problem);
    hopper::ForwardParams p;
    p.mask = fused::mask_args(a.problem);
    // Packed GQA where a head's queries do not fill a tile: the q and o
    // boxes then span the 2^shift query heads of a kv head (pack_gqa.hpp).
    p.pack_shift = hopper::pack_gqa_shift(tile.block_m, a.problem.Tq, a.problem.H, a.problem.Hkv);
    const int heads_per_box = 1 << p.pack_shift;
    p.q_map = hopper::make_tile_map(a.q, tile.block_m / heads_per_box, "q", heads_per_box);
    p.k_map = hopper::make_tile_map(a.k, tile.block_n, "k");
    p.v_map = hopper::make_tile_map(a.v, tile.block_n, "v");
    // o goes by TMA where its alignment allows (why_not_tensor asks TMA's
    // alignment of q, k, v only): the kernel's choice, results identical.
    p.o_by_tma = hopper::why_not_tma(a.o, "o").empty();
    if (p.o_by_tma)
      p.o_map = hopper::make_tile_map(a.o, hopper::kWgmmaM / heads_per_box, "o", heads_per_box);
    p.o_by_16_byte_stores = why_misaligned(a.o, "o", kChunkBytes, "16-byte stores").empty();
    p.o = a.o.data;
    p.o_stride = fused::row_strides(a.o);
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_batch_stride = a.lse.stride[0];
    p.lse_head_stride = a.lse.stride[1];
    p.B = int(a.problem.B);
    p.H = int(a.problem.H);
    p.Hkv = int(a.problem.Hkv);
    p.score = fused::score_args(a.problem);

    // Split-KV where the work tiles would leave most SMs idle (split_kv.hpp):
    // the tasks' f32 partials, [splits][B][H][Tq] x (d + 1) floats, live in
    // a workspace on the caller's stream (freed there after the combine).
    const int64_t work_tiles = hopper::forward_blocks(
        tile.block_m, a.problem.B, hopper::tile_heads(p), a.problem.Tq << p.pack_shift);
    const int64_t key_tiles = (a.problem.Tk + tile.block_n - 1) / tile.block_n;
    p.num_splits = hopper::split_kv_count(work_tiles, key_tiles,
                                          cuda::current_device_properties().multiprocessors);
    if (work_tiles * p.num_splits > kMaxGridX)
      throw Error("GQATTN_HOPPER_SPLIT_KV", "not supported: " + std::to_string(p.num_splits) +
                                                " splits of " + std::to_string(work_tiles) +
                                                " work tiles exceed 2^31-1 tasks");
    const auto stream = static_cast<cudaStream_t>(a.options.stream);
    const std::size_t split_rows =
        p.num_splits > 1 ? std::size_t(p.num_splits * a.problem.B * a.problem.H * a.problem.Tq) : 0;
    const cuda::StreamWorkspace workspace(split_rows * std::size_t(d + 1) * sizeof(float), stream);
    if (split_rows > 0) {
      p.o_part = workspace.floats();
      p.lse_part = p.o_part + split_rows * std::size_t(d);
    }

    const fused::ElemType elem =
        a.q.dtype == DType::bf16 ? fused::ElemType::bf16 : fused::ElemType::f16;
    switch (d) {
      case 64: hopper::launch_forward<64>(p, elem, a.options.stream); break;
      case 128: hopper::launch_forward<128>(p, elem, a.options.stream); break;
      default: hopper::launch_forward<256>(p, elem, a.options.stream); break;
    }
  }

  // d in {64, 128, 256} (at d = 256 the consumer warpgroups share a tile).
  std::string why_not_backward(const Problem& p, DType dtype, Device device) const override {
    const std::string r = why_not(p, dtype, device);
    if (!r.empty()) return r;
    if (!hopper::bwd::head_dim_supported(p.d))
      return "not supported: cuda-hopper backward supports d in {64, 128, 256} (got d=" +
             std::to_string(p.d) + "); use cuda-flash";
    // Every launch either dQ path may make (backward_dq_choice.hpp).
    const int64_t grid = std::max(
        {hopper::bwd::dkdv_blocks(p.B, p.Hkv, p.Tk, p.d),
         hopper::bwd::dq_blocks(p.B, p.H, p.Tq, p.d),
         hopper::bwd::ceil_div(p.B * p.H * fused::tq_padded(p.Tq), fused::kPreprocessRowsPerBlock),
         hopper::bwd::fused_dq_supported(int(p.d))
             ? hopper::bwd::dq_convert_blocks(p.B, p.H, fused::tq_padded(p.Tq))
             : 0});
    if (grid > kMaxGridX)
      return "not supported: cuda-hopper backward needs at most 2^31-1 thread blocks (" +
             std::to_string(grid) + " blocks)";
#ifdef GQATTN_HOPPER_SM90A
    const std::size_t need = hopper::bwd::backward_smem_bytes(p.d);
    const std::size_t have = cuda::current_device_properties().max_shared_per_block_optin;
    if (need > have)
      return "not supported: cuda-hopper backward d=" + std::to_string(p.d) + " needs " +
             std::to_string(need / 1024) + " KB of shared memory per block, the device allows " +
             std::to_string(have / 1024) + " KB";
#endif
    return "";
  }

  void backward(const BackwardArgs& a) const override {
    const int64_t d = a.problem.d;
    hopper::bwd::BackwardParams p;
    p.q_map = hopper::make_tile_map(a.q, hopper::bwd::kBoxRows, "q");
    p.k_map = hopper::make_tile_map(a.k, hopper::bwd::kv_box_rows(d), "k");
    p.v_map = hopper::make_tile_map(a.v, hopper::bwd::kv_box_rows(d), "v");
    p.do_map = hopper::make_tile_map(a.dout, hopper::bwd::kBoxRows, "do");
    // The gradients go by TMA where all three meet its alignment
    // (why_not_tensor asks 4 bytes of them): the kernels' choice, results
    // identical.
    p.grads_by_tma = hopper::why_not_tma(a.dq, "dq").empty() &&
                     hopper::why_not_tma(a.dk, "dk").empty() &&
                     hopper::why_not_tma(a.dv, "dv").empty();
    if (p.grads_by_tma) {
      p.dq_map = hopper::make_tile_map(a.dq, hopper::kWgmmaM, "dq");
      p.dk_map = hopper::make_tile_map(a.dk, hopper::kWgmmaM, "dk");
      p.dv_map = hopper::make_tile_map(a.dv, hopper::kWgmmaM, "dv");
    }
    p.c = fused::backward_params(a);
    hopper::bwd::softcap_backward_terms(p);
    fused::BackwardParams& c = p.c;
    const int64_t padded = c.tq_padded;
    p.dkdv_group_pairs = hopper::bwd::dkdv_grid_group_pairs(
        a.problem, cuda::current_device_properties().multiprocessors);

    // Workspace on the caller's stream (StreamWorkspace, from the library's
    // pool: 256-byte aligned, as the bulk copies need; freed on the stream
    // when `workspace` goes out of scope, also when a launch throws): lse2
    // and D, [B*H, tq_padded] f32 each; with the fused dQ
    // (backward_dq_choice.hpp) also its f32 accumulator (B*H*tq_padded*d,
    // linear in T) and, unless the caller allows a non-deterministic dq,
    // the semaphores that fix the order of its adds.
    const auto stream = static_cast<cudaStream_t>(a.options.stream);
    const std::size_t rows = std::size_t(a.problem.B * a.problem.H * padded);
    const bool fused = hopper::bwd::use_fused_dq(a.problem);
    const std::size_t accum =
        fused ? hopper::bwd::fused_dq_accum_floats(a.problem.B, a.problem.H, padded, d) : 0;
    const std::size_t semaphores =
        fused ? hopper::bwd::fused_dq_semaphores(a.problem.B, a.problem.H, padded) : 0;
    const cuda::StreamWorkspace workspace(
        (2 * rows + accum) * sizeof(float) + semaphores * sizeof(int), stream);
    c.lse2 = workspace.floats();
    c.dsum = c.lse2 + rows;
    p.dq_accum = accum > 0 ? c.dsum + rows : nullptr;
    p.dq_semaphores = semaphores > 0 ? reinterpret_cast<int*>(c.dsum + rows + accum) : nullptr;
    const fused::ElemType elem =
        a.q.dtype == DType::bf16 ? fused::ElemType::bf16 : fused::ElemType::f16;
    if (d == 64)
      hopper::bwd::launch_backward<64>(p, elem, a.options.stream);
    else if (d == 128)
      hopper::bwd::launch_backward<128>(p, elem, a.options.stream);
    else
      hopper::bwd::launch_backward<256>(p, elem, a.options.stream);
  }
};

}  // namespace

const BackendImpl* cuda_hopper_backend(std::string* /*reason*/) {
  static const CudaHopperBackend backend;
  return &backend;
}

}  // namespace gqattn::detail
