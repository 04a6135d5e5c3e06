// Generic helpers for GPU tests: the skip rule, RAII device buffers, upload
// and download, NaN poisoning. Header-only; every GPU test may use it.
//
// Every GPU test starts with GQATTN_SKIP_WITHOUT_CUDA(), so on a machine
// without a usable device (and in a build without CUDA) the whole suite
// reports SKIPPED with the reason instead of failing.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "gqattn/attention.hpp"

namespace gqattn::test {

// "" when a CUDA device is visible to this process, else why not (without
// the "no CUDA device: " that the skip message puts in front).
inline std::string why_no_cuda_device() {
  std::string why;
  if (!gqattn::cuda_devices(&why).empty()) return "";
  const std::string prefix = "no CUDA device: ";
  if (why.compare(0, prefix.size(), prefix) == 0) why.erase(0, prefix.size());
  return why.empty() ? "none visible" : why;
}

}  // namespace gqattn::test

#define GQATTN_SKIP_WITHOUT_CUDA()                                                               \
  do {                                                                                           \
    const std::string gqattn_skip_reason_ = gqattn::test::why_no_cuda_device();                  \
    if (!gqattn_skip_reason_.empty()) GTEST_SKIP() << "no CUDA device: " << gqattn_skip_reason_; \
  } while (0)

#ifdef GQATTN_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "gqattn/dtype.hpp"

namespace gqattn::test {

// Throws (gtest reports the exception as a failure) when a CUDA call fails.
inline void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(status) + ": " +
                             cudaGetErrorString(status));
}

// Every byte 0xFF: as f32, bf16 or f16 each element is a NaN, so an output
// element a kernel forgot to write stays NaN and fails any comparison.
constexpr int kPoisonByte = 0xFF;
constexpr uint16_t kPoisonBits16 = 0xFFFFu;  // a poisoned bf16 / f16 element

// A device allocation owned by the test.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    cuda_ok(cudaMalloc(&data_, bytes_ == 0 ? 1 : bytes_), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  void upload(const void* host, std::size_t bytes) {
    if (bytes > bytes_)
      throw std::runtime_error("DeviceBuffer::upload: more bytes than the buffer");
    cuda_ok(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(upload)");
  }
  template <class T>
  void upload(const std::vector<T>& host) {
    upload(host.data(), host.size() * sizeof(T));
  }
  // The whole buffer as elements of T (synchronous: waits for all work).
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    cuda_ok(cudaMemcpy(host.data(), data_, host.size() * sizeof(T), cudaMemcpyDeviceToHost),
            "cudaMemcpy(download)");
    return host;
  }
  void poison() { cuda_ok(cudaMemset(data_, kPoisonByte, bytes_), "cudaMemset(poison)"); }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A device buffer holding a copy of `host`.
template <class T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  buffer.upload(host);
  return buffer;
}

// A stream owned by the test.
class Stream {
 public:
  Stream() { cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"); }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const { cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
};

inline void device_synchronize() { cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

// A 16-bit tensor of `rows` rows of `packed_row` elements stored with row
// stride `row` (>= packed_row), against the same values packed: elements
// that differ, and gap elements (the row - packed_row after each row, first
// poisoned) that no longer hold kPoisonBits16.
struct StridedComparison {
  int64_t differing = 0;
  int64_t gap_written = 0;
};
inline StridedComparison compare_strided(const std::vector<uint16_t>& strided,
                                         const std::vector<uint16_t>& packed, int64_t rows,
                                         int64_t packed_row, int64_t row) {
  StridedComparison c;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t e = 0; e < packed_row; ++e)
      c.differing += strided[std::size_t(r * row + e)] != packed[std::size_t(r * packed_row + e)];
    for (int64_t e = packed_row; e < row; ++e)
      c.gap_written += strided[std::size_t(r * row + e)] != kPoisonBits16;
  }
  return c;
}

// bf16 bits of n samples of N(0, 1), for upload to a DeviceBuffer.
inline std::vector<uint16_t> random_bf16(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> bits(static_cast<std::size_t>(n));
  for (uint16_t& b : bits) b = float_to_bf16(normal(rng));
  return bits;
}

}  // namespace gqattn::test

#endif  // GQATTN_WITH_CUDA
