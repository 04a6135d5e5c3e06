// A calibration probe for compute-sanitizer racecheck: the smallest kernel
// with the pipeline pattern that cuda-hopper's backward uses for lse2 / D
// (src/cuda/hopper/launch_backward.cuh, backward_common.cuh): one producer
// thread fills a two-slot ring in shared memory with 1-D bulk copies
// (cp.async.bulk, completing on a `full` mbarrier with expect_tx), the
// consumer warps wait on `full`, read the slot with ordinary loads, and
// release it with one arrival per warp on an `empty` mbarrier, which the
// producer waits for before it copies into the slot again. That ordering
// is the one the PTX ISA gives for the async proxy (complete_tx, then the
// phase wait); `scripts/h200-cycle racecheck` runs this probe first, so
// that hazards racecheck reports on it are known to be the tool's and the
// same reports on the real kernels can be read against them.
//
// Measured on the H200 (2026-11-30, compute-sanitizer of CUDA 13.0): the
// probe passes, memcheck and synccheck are clean, racecheck reports 6
// hazards between bulk_load's write (bulk_copy.cuh) and the consumers'
// loads, with or without a fence.proxy.async before each release; the
// backward's lse2 / D reports have the same signature (its producer loads
// lse2 and D by bulk copy: docs/backends/cuda-hopper.md, Backward).
//
// As a test (ctest label gpu): the consumers' sums must equal the host's.
// Exit 0 pass, 1 fail, 77 skipped (no sm_90 device, or no sm_90a code).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/hopper/ptx/bulk_copy.cuh"
#include "cuda/hopper/ptx/mbarrier.cuh"

namespace {

constexpr int kSkip = 77;
constexpr int kSlots = 2;
constexpr int kSteps = 8;  // four passes over the ring
constexpr int kConsumerWarps = 4;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // + the producer's warp
constexpr int kFloats = 2 * kConsumers;    // one slot: 1 KB
constexpr uint32_t kSlotBytes = kFloats * sizeof(float);

__global__ void ring_kernel(const float* src, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace ptx = gqattn::hopper::ptx;
  __shared__ alignas(128) float slots[kSlots][kFloats];
  __shared__ alignas(8) uint64_t full[kSlots];
  __shared__ alignas(8) uint64_t empty[kSlots];
  const auto addr = [](const void* p) { return uint32_t(__cvta_generic_to_shared(p)); };
  const int tid = int(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < kSlots; ++s) {
      ptx::mbar_init(addr(&full[s]), 1);
      ptx::mbar_init(addr(&empty[s]), kConsumerWarps);
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();

  if (tid >= kConsumers) {  // the producer's warp; one thread copies
    if (tid == kConsumers) {
      for (int t = 0; t < kSteps; ++t) {
        const int s = t % kSlots;
        ptx::mbar_wait(addr(&empty[s]), uint32_t((t / kSlots) & 1) ^ 1u);
        ptx::mbar_arrive_expect_tx(addr(&full[s]), kSlotBytes);
        ptx::bulk_load(addr(&slots[s][0]), src + t * kFloats, kSlotBytes, addr(&full[s]));
      }
    }
    return;
  }
  float sum = 0.0f;
  for (int t = 0; t < kSteps; ++t) {
    const int s = t % kSlots;
    ptx::mbar_wait(addr(&full[s]), uint32_t((t / kSlots) & 1));
    sum += slots[s][tid] + slots[s][tid + kConsumers];
    __syncwarp();
    if (tid % 32 == 0) ptx::mbar_arrive(addr(&empty[s]));
  }
  out[tid] = sum;
#else
  (void)src;
  (void)out;
  (void)kSlots;
  (void)kSlotBytes;
  __trap();  // never launched: main() checks for sm_90 first
#endif
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "bulk_copy_ring: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    std::printf("bulk_copy_ring: skipped: no CUDA device\n");
    return kSkip;
  }
  if (prop.major < 9) {
    std::printf("bulk_copy_ring: skipped: needs sm_90, device is sm_%d%d\n", prop.major,
                prop.minor);
    return kSkip;
  }
  std::vector<float> host(std::size_t(kSteps) * kFloats);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = float(i % 97) - 48.0f;
  float* src = nullptr;
  float* out = nullptr;
  if (!ok(cudaMalloc(&src, host.size() * sizeof(float)), "cudaMalloc") ||
      !ok(cudaMalloc(&out, kConsumers * sizeof(float)), "cudaMalloc") ||
      !ok(cudaMemcpy(src, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy") ||
      !ok(cudaMemset(out, 0xff, kConsumers * sizeof(float)), "cudaMemset"))
    return 1;
  ring_kernel<<<1, kThreads>>>(src, out);
  if (!ok(cudaGetLastError(), "launch")) {
    std::printf("bulk_copy_ring: skipped: no sm_90a code in this build\n");
    return kSkip;
  }
  std::vector<float> got(kConsumers);
  if (!ok(cudaMemcpy(got.data(), out, kConsumers * sizeof(float), cudaMemcpyDeviceToHost),
          "cudaMemcpy"))
    return 1;
  int wrong = 0;
  for (int i = 0; i < kConsumers; ++i) {
    float want = 0.0f;
    for (int t = 0; t < kSteps; ++t)
      want += host[std::size_t(t) * kFloats + i] + host[std::size_t(t) * kFloats + i + kConsumers];
    if (got[i] != want) ++wrong;
  }
  cudaFree(src);
  cudaFree(out);
  std::printf("bulk_copy_ring: %s (%d of %d consumer sums wrong)\n", wrong ? "FAIL" : "PASS", wrong,
              kConsumers);
  return wrong ? 1 : 0;
}
