// cuda-hopper: the BackendImpl of the sm_90a forward (wgmma, TMA, warp
// specialisation): what it supports (why_not, why_not_tensor), and the
// translation of validated TensorRefs into kernel parameters and TMA maps.
// Backward is not implemented yet and throws. Checked by
// tests/gpu/test_hopper_forward.cpp (every feature against the f64 oracle,
// the refusal messages, backward's error).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "api/backend.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/flash/problem_args.hpp"
#include "cuda/hopper/launchers.hpp"
#include "cuda/hopper/params.hpp"
#include "cuda/hopper/tile_sizes.hpp"
#include "cuda/hopper/tma_desc.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

namespace gqattn::hopper {

int64_t forward_blocks(int d, int64_t B, int64_t H, int64_t Tq) {
  const int bm = d == 64    ? ForwardTile<64>::kBlockM
                 : d == 128 ? ForwardTile<128>::kBlockM
                            : ForwardTile<256>::kBlockM;
  return (Tq + bm - 1) / bm * B * H;
}

}  // namespace gqattn::hopper

namespace gqattn::detail {
namespace {

// Sequence lengths stay below this so that every index the kernels form
// (i + Tk - Tq, j - off + window, tile offsets, TMA coordinates) fits in an int.
constexpr int64_t kMaxSequence = int64_t{1} << 30;
constexpr int64_t kMaxGridX = std::numeric_limits<int>::max();
// sm_90a code runs on compute capability 9.0 only.
constexpr int kNeedMajor = 9;
constexpr int kNeedMinor = 0;

bool head_dim_supported(int64_t d) { return d == 64 || d == 128 || d == 256; }

[[maybe_unused]] std::size_t smem_needed(int64_t d) {
  switch (d) {
    case 64: return hopper::forward_smem_bytes<64>();
    case 128: return hopper::forward_smem_bytes<128>();
    default: return hopper::forward_smem_bytes<256>();
  }
}

int box_rows_q(int64_t d) {
  switch (d) {
    case 64: return hopper::ForwardTile<64>::kBlockM;
    case 128: return hopper::ForwardTile<128>::kBlockM;
    default: return hopper::ForwardTile<256>::kBlockM;
  }
}
int box_rows_kv(int64_t d) {
  switch (d) {
    case 64: return hopper::ForwardTile<64>::kBlockN;
    case 128: return hopper::ForwardTile<128>::kBlockN;
    default: return hopper::ForwardTile<256>::kBlockN;
  }
}

hopper::RowStrides strides(const TensorRef& t) { return {t.stride[0], t.stride[1], t.stride[2]}; }

class CudaHopperBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::CudaHopper; }

  std::string why_not(const Problem& p, DType dtype, Device device) const override {
    if (device != Device::cuda) return "runs on CUDA devices only (got device cpu)";
    const bool dtype_ok = dtype == DType::bf16 || dtype == DType::f16;
    if (!dtype_ok || !head_dim_supported(p.d)) {
      std::string got;
      if (!head_dim_supported(p.d)) got = "d=" + std::to_string(p.d);
      if (!dtype_ok) got += std::string(got.empty() ? "" : ", ") + "dtype " + dtype_name(dtype);
      return "not supported: cuda-hopper supports d in {64, 128, 256} and dtypes bf16/f16 (got " +
             got + ")";
    }
    if (p.Tq >= kMaxSequence || p.Tk >= kMaxSequence)
      return "not supported: cuda-hopper needs Tq, Tk < 2^30 (got Tq=" + std::to_string(p.Tq) +
             ", Tk=" + std::to_string(p.Tk) + ")";
    const int64_t grid = hopper::forward_blocks(int(p.d), p.B, p.H, p.Tq);
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
    const std::size_t need = smem_needed(p.d);
    if (need > props.max_shared_per_block_optin)
      return "not supported: cuda-hopper d=" + std::to_string(p.d) + " needs " +
             std::to_string(need / 1024) + " KB of shared memory per block, the device allows " +
             std::to_string(props.max_shared_per_block_optin / 1024) + " KB";
    return "";
#endif
  }

  std::string why_not_tensor(const TensorRef& t, const char* name) const override {
    std::string r = cuda::why_not_device_pointer(t.data, name);
    // q, k, v are read by TMA and need its alignment; o and lse are written
    // with plain stores.
    const std::string role = name;
    if (r.empty() && (role == "q" || role == "k" || role == "v")) r = hopper::why_not_tma(t, name);
    return r;
  }

  void forward(const ForwardArgs& a) const override {
    const int64_t d = a.problem.d;
    hopper::ForwardParams p;
    p.q_map = hopper::make_tile_map(a.q, box_rows_q(d), "q");
    p.k_map = hopper::make_tile_map(a.k, box_rows_kv(d), "k");
    p.v_map = hopper::make_tile_map(a.v, box_rows_kv(d), "v");
    p.o = a.o.data;
    p.o_stride = strides(a.o);
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_batch_stride = a.lse.stride[0];
    p.lse_head_stride = a.lse.stride[1];
    p.B = int(a.problem.B);
    p.H = int(a.problem.H);
    p.Hkv = int(a.problem.Hkv);
    p.mask = flash::mask_args(a.problem);
    p.score = flash::score_args(a.problem);
    const hopper::ElemType elem =
        a.q.dtype == DType::bf16 ? hopper::ElemType::bf16 : hopper::ElemType::f16;
    switch (d) {
      case 64: hopper::launch_forward<64>(p, elem, a.options.stream); break;
      case 128: hopper::launch_forward<128>(p, elem, a.options.stream); break;
      default: hopper::launch_forward<256>(p, elem, a.options.stream); break;
    }
  }

  // Forward only for now: Auto takes cuda-flash for backward.
  std::string why_not_backward(const Problem&, DType, Device) const override {
    return "not supported: backward is not implemented yet (use cuda-flash)";
  }
  void backward(const BackwardArgs&) const override {
    throw Error("backend",
                "cuda-hopper: not supported: backward is not implemented yet (use cuda-flash)");
  }
};

}  // namespace

const BackendImpl* cuda_hopper_backend(std::string* /*reason*/) {
  static const CudaHopperBackend backend;
  return &backend;
}

}  // namespace gqattn::detail
