// The CUDA side of `gqattn bench`: see bench_cuda.hpp.
#include <cuda_runtime_api.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "bench_cuda.hpp"
#include "spin_ahead.hpp"  // bench/: the spin gqattn_bench queues, the same kernel

namespace gqattn_tool {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

void* cuda_alloc(std::size_t bytes) {
  void* data = nullptr;
  check(cudaMalloc(&data, bytes), "cudaMalloc");
  return data;
}

void cuda_free(void* data) noexcept {
  if (data != nullptr) (void)cudaFree(data);
}

void cuda_upload(void* device_dst, const void* host_src, std::size_t bytes) {
  check(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

CudaTimer::CudaTimer(int spin_us) : spin_us_(spin_us) {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = stream;
  try {
    check(cudaEventCreate(&start), "cudaEventCreate");
    start_ = start;
    check(cudaEventCreate(&stop), "cudaEventCreate");
    stop_ = stop;
  } catch (...) {
    if (start_ != nullptr) (void)cudaEventDestroy(as_event(start_));
    (void)cudaStreamDestroy(stream);
    throw;
  }
}

CudaTimer::~CudaTimer() {
  (void)cudaStreamSynchronize(as_stream(stream_));
  (void)cudaEventDestroy(as_event(start_));
  (void)cudaEventDestroy(as_event(stop_));
  (void)cudaStreamDestroy(as_stream(stream_));
}

double CudaTimer::time(const std::function<void()>& call, bool* host_late) {
  const cudaStream_t stream = as_stream(stream_);
  // From before the spin's launch: the spin starts no earlier than this.
  const auto queue_start = std::chrono::steady_clock::now();
  check(gqattn_bench::spin_ahead(stream, spin_us_), "spin kernel");
  check(cudaEventRecord(as_event(start_), stream), "cudaEventRecord");
  call();
  check(cudaEventRecord(as_event(stop_), stream), "cudaEventRecord");
  const double queue_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - queue_start)
          .count();
  check(cudaEventSynchronize(as_event(stop_)), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, as_event(start_), as_event(stop_)), "cudaEventElapsedTime");
  if (host_late != nullptr) *host_late = queue_us >= double(spin_us_);
  return double(ms);
}

void CudaTimer::synchronize() { check(cudaStreamSynchronize(as_stream(stream_)), "sync"); }

}  // namespace gqattn_tool
