// The fused KV-cache path, host side; see kv_cache_path.hpp.
#include "cuda/kv_cache/kv_cache_path.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/common/workspace.hpp"
#include "cuda/fused/problem_args.hpp"
#include "cuda/kv_cache/launchers.hpp"
#include "cuda/kv_cache/params.hpp"
#include "cuda/kv_cache/plan.hpp"

namespace gqattn::kv_cache {
namespace {

constexpr int kMaxGridYZ = 65535;

// Resident CTAs per SM of one attention kernel on the current device,
// asked once per kernel and device.
int resident_ctas(const Plan& kernel, bool softcap, fused::ElemType elem) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, bool, fused::ElemType>, int> known;
  int device = 0;
  GQATTN_CUDA_CHECK(cudaGetDevice(&device));
  const auto key = std::make_tuple(device, kernel.d, kernel.warps_m, softcap, elem);
  const std::lock_guard<std::mutex> lock(mutex);
  const auto at = known.find(key);
  if (at != known.end()) return at->second;
  int ctas = 0;
  switch (kernel.d) {
    case 64: ctas = resident_ctas_per_sm<64>(kernel.warps_m, softcap, elem); break;
    case 128: ctas = resident_ctas_per_sm<128>(kernel.warps_m, softcap, elem); break;
    default: ctas = resident_ctas_per_sm<256>(kernel.warps_m, softcap, elem); break;
  }
  return known[key] = ctas;
}

Plan plan_for(const Problem& p, const Options& options, fused::ElemType elem) {
  const Plan kernel = plan(p, DeviceShape{}, options.batch_invariant);
  if (options.batch_invariant) return kernel;
  DeviceShape device;
  device.multiprocessors = cuda::current_device_limits(8, 0).multiprocessors;
  if (device.multiprocessors > 0) device.ctas_per_sm = resident_ctas(kernel, p.softcap > 0, elem);
  return plan(p, device, false);
}

}  // namespace

std::string why_not(const char* backend, const Problem& p, DType dtype, Device device) {
  const std::string shared = fused::why_not_fused_problem(backend, p, dtype, device);
  if (!shared.empty()) return shared;
  const std::string name = backend;
  if (p.Tq * (p.H / p.Hkv) >= fused::kMaxSequence)
    return "not supported: " + name + "'s KV-cache path needs Tq * H / Hkv < 2^30";
  if (p.B > kMaxGridYZ || p.Hkv > kMaxGridYZ)
    return "not supported: " + name +
           "'s KV-cache path needs B, Hkv <= 65535 (got B=" + std::to_string(p.B) +
           ", Hkv=" + std::to_string(p.Hkv) + ")";
  const Plan worst =
      plan(p, DeviceShape{}, /*batch_invariant=*/true);  // the most splits either rule takes
  if (worst.m_tiles * std::max<int64_t>(worst.num_splits, kMaxSplits) >
      std::numeric_limits<int>::max())
    return "not supported: " + name + "'s KV-cache path needs at most 2^31-1 thread blocks";
  std::string reason = cuda::why_no_device(8, 0);
  if (reason.empty()) reason = cuda::why_no_kernel_image(any_kernel());
  if (!reason.empty()) return reason;
  const std::size_t need = smem_bytes(worst.d, kWarps);
  const std::size_t have = cuda::current_device_properties().max_shared_per_block_optin;
  if (need > have)
    return "not supported: " + name + "'s KV-cache kernel at d=" + std::to_string(worst.d) +
           " needs " + std::to_string((need + 1023) / 1024) +
           " KB of shared memory per block, the device allows " + std::to_string(have / 1024) +
           " KB";
  return "";
}

std::string why_not_cache_tensor(const TensorRef& t, const char* name) {
  for (const char* cache : {"k_cache", "v_cache", "k_new", "v_new"})
    if (std::strcmp(name, cache) == 0)
      return fused::why_misaligned(t, name, fused::kChunkBytes, "16-byte loads");
  return "";
}

std::string describe_plan(const Problem& p, const Options& options) {
  // bf16 and f16 kernels have the same occupancy.
  return describe(plan_for(p, options, fused::ElemType::bf16), options.batch_invariant);
}

void forward(const detail::KvCacheArgs& a) {
  const Problem& problem = a.problem;
  const fused::ElemType elem =
      a.q.dtype == DType::bf16 ? fused::ElemType::bf16 : fused::ElemType::f16;
  const Plan plan = plan_for(problem, a.options, elem);
  Params p;
  p.q = a.q.data;
  p.o = a.o.data;
  p.lse = static_cast<float*>(a.lse.data);
  p.q_stride = fused::row_strides(a.q);
  p.o_stride = fused::row_strides(a.o);
  p.lse_batch_stride = a.lse.stride[0];
  p.lse_head_stride = a.lse.stride[1];
  CacheArgs& c = p.cache;
  c.k = a.cache.k.data;
  c.v = a.cache.v.data;
  c.k_stride = fused::row_strides(a.cache.k);
  c.v_stride = fused::row_strides(a.cache.v);
  c.seqlens = a.cache.seqlens.data;
  c.block_table = problem.kv_page_size > 0 ? a.cache.block_table.data : nullptr;
  c.batch_idx = a.cache.batch_idx.data;
  c.pages_per_seq = int(a.cache.pages_per_seq);
  c.page_size = int(problem.kv_page_size);
  c.cache_rows = int(a.cache.k.shape[0]);
  c.capacity = int(problem.Tk);
  if (a.k_new.data != nullptr) {
    p.k_new = a.k_new.data;
    p.v_new = a.v_new.data;
    p.k_new_stride = fused::row_strides(a.k_new);
    p.v_new_stride = fused::row_strides(a.v_new);
    p.t_new = int(a.k_new.shape[1]);
  }
  p.B = int(problem.B);
  p.Tq = int(problem.Tq);
  p.H = int(problem.H);
  p.Hkv = int(problem.Hkv);
  p.head_dim = int(problem.d);
  p.causal = problem.causal;
  // Normalised per sequence by the kernel (each has its own query offset).
  p.window = int(problem.window < std::numeric_limits<int>::max() ? problem.window : 0);
  p.q_start_given = problem.q_start.has_value();
  p.q_start = p.q_start_given ? int(*problem.q_start) : 0;
  p.score = fused::score_args(problem);
  p.num_splits = plan.num_splits;
  p.tiles_per_split = plan.tiles_per_split;
  const auto stream = static_cast<cudaStream_t>(a.options.stream);
  // The partials on the caller's stream, freed there after the combine.
  const cuda::StreamWorkspace workspace(std::size_t(plan.workspace_floats) * sizeof(float), stream);
  if (plan.num_splits > 1) {
    p.o_part = workspace.floats();
    p.lse_part = p.o_part + int64_t(plan.num_splits) * p.B * p.H * p.Tq * plan.d;
  }
  switch (plan.d) {
    case 64: launch<64>(plan, p, elem, stream); break;
    case 128: launch<128>(plan, p, elem, stream); break;
    default: launch<256>(plan, p, elem, stream); break;
  }
}

}  // namespace gqattn::kv_cache
