// The CUDA side of `gqattn bench` (tools/bench_command.cpp): device memory, a
// private stream, and CUDA events around each timed call with a GPU spin
// queued ahead of it. Built only where the tool is built with CUDA (tools/
// CMakeLists.txt defines GQATTN_WITH_CUDA for it then); bench_command.cpp
// includes this behind that definition, so that a CPU-only build needs none
// of it.
//
// Why the spin: every timed call follows a synchronisation, so without it
// the start event fires on an idle stream at once and the host's time to
// launch the call (argument checks, workspace, the launches) lands inside
// the measured window. A one-thread kernel spinning on the GPU's global
// timer keeps the stream busy while the host queues start event, call and
// stop event behind it; the events then time the GPU alone. The spin is
// bench/spin_ahead.cu's, which gqattn_bench queues too (compiled into the
// tool as a source file).
#pragma once

#include <cstddef>
#include <functional>

namespace gqattn_tool {

// Each throws std::runtime_error naming what failed and the CUDA error.
void* cuda_alloc(std::size_t bytes);
void cuda_free(void* data) noexcept;
void cuda_upload(void* device_dst, const void* host_src, std::size_t bytes);

// A private (non-blocking) stream and two events.
class CudaTimer {
 public:
  explicit CudaTimer(int spin_us);
  ~CudaTimer();
  CudaTimer(const CudaTimer&) = delete;
  CudaTimer& operator=(const CudaTimer&) = delete;

  void* stream() const { return stream_; }  // a cudaStream_t, for Options::stream
  int spin_us() const { return spin_us_; }

  // Queues the spin, the start event, call() (which queues its work on
  // stream()), the stop event; waits for the stop event and returns the
  // milliseconds between the two events. *host_late is set when the host
  // took at least the spin's length to queue start, call and stop: that
  // call's time may then include host time.
  double time(const std::function<void()>& call, bool* host_late);
  void synchronize();

 private:
  void* stream_ = nullptr;
  void* start_ = nullptr;
  void* stop_ = nullptr;
  int spin_us_ = 0;
};

}  // namespace gqattn_tool
