// The spin of spin_ahead.hpp: see there for why. Checked by running it
// (gqattn_bench --spin-ahead-us counts the calls it did not cover).
#include <cstdint>

#include "spin_ahead.hpp"

namespace gqattn_bench {
namespace {

constexpr std::uint64_t kNanosecondsPerMicrosecond = 1000;

__device__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(std::uint64_t nanoseconds) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
  }
}

}  // namespace

cudaError_t spin_ahead(cudaStream_t stream, int microseconds) {
  if (microseconds <= 0) return cudaSuccess;
  spin_kernel<<<1, 1, 0, stream>>>(std::uint64_t(microseconds) * kNanosecondsPerMicrosecond);
  return cudaGetLastError();
}

}  // namespace gqattn_bench
