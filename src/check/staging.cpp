// Staged tensors for the checker; see staging.hpp.
#include "check/staging.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <new>
#include <numeric>

#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

#ifdef GQATTN_WITH_CUDA
#include "cuda/common/cuda_check.hpp"
#endif

namespace gqattn::check {
namespace {

// Gap (in elements) after every row and block when strides are padded: 8
// elements keeps 16-byte alignment for 16-bit types (32 bytes for f32).
constexpr int64_t kStrideGap = 8;
constexpr std::align_val_t kHostAlignment{64};

// Visits every element: fn(packed_index, offset_in_buffer).
template <typename Fn>
void for_each_element(const TensorRef& t, Fn fn) {
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return;
  int64_t index[4] = {0, 0, 0, 0};
  int64_t packed = 0;
  while (true) {
    int64_t offset = 0;
    for (int i = 0; i < t.rank; ++i) offset += index[i] * t.stride[i];
    fn(packed++, offset);
    int dim = t.rank - 1;
    while (dim >= 0 && ++index[dim] == t.shape[dim]) index[dim--] = 0;
    if (dim < 0) return;
  }
}

}  // namespace

StagedTensor::StagedTensor(DType dtype, Device device, std::vector<int64_t> shape, bool padded) {
  ref_.dtype = dtype;
  ref_.device = device;
  ref_.rank = static_cast<int>(shape.size());
  const int64_t gap = padded ? kStrideGap : 0;
  ref_.stride[ref_.rank - 1] = 1;
  ref_.shape[ref_.rank - 1] = shape[std::size_t(ref_.rank - 1)];
  for (int i = ref_.rank - 2; i >= 0; --i) {
    ref_.shape[i] = shape[std::size_t(i)];
    // An empty dimension still steps (stride 0 on a dimension of size > 1
    // would repeat elements, which outputs may not).
    ref_.stride[i] = ref_.stride[i + 1] * std::max<int64_t>(ref_.shape[i + 1], 1) + gap;
  }
  int64_t span = 1;
  for (int i = 0; i < ref_.rank; ++i) span += (ref_.shape[i] - 1) * ref_.stride[i];
  elements_ = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  // No elements: a buffer of one, so that the tensor still has an address.
  if (elements_ == 0) span = 1;
  buffer_bytes_ = std::size_t(span) * dtype_size(dtype);
  if (device == Device::cpu) {
    ref_.data = ::operator new(buffer_bytes_, kHostAlignment);
  } else {
#ifdef GQATTN_WITH_CUDA
    GQATTN_CUDA_CHECK(cudaMalloc(&ref_.data, buffer_bytes_));
#else
    throw Error("device", "this build has no CUDA");
#endif
  }
  poison();
}

StagedTensor::~StagedTensor() {
  if (ref_.device == Device::cpu) {
    ::operator delete(ref_.data, kHostAlignment);
  } else {
#ifdef GQATTN_WITH_CUDA
    cudaFree(ref_.data);
#endif
  }
}

std::vector<uint8_t> StagedTensor::bytes() const {
  std::vector<uint8_t> image(buffer_bytes_);
  if (ref_.device == Device::cpu) {
    std::memcpy(image.data(), ref_.data, buffer_bytes_);
  } else {
#ifdef GQATTN_WITH_CUDA
    GQATTN_CUDA_CHECK(cudaMemcpy(image.data(), ref_.data, buffer_bytes_, cudaMemcpyDeviceToHost));
#endif
  }
  return image;
}

void StagedTensor::set_bytes(const std::vector<uint8_t>& image) {
  if (ref_.device == Device::cpu) {
    std::memcpy(ref_.data, image.data(), buffer_bytes_);
  } else {
#ifdef GQATTN_WITH_CUDA
    GQATTN_CUDA_CHECK(cudaMemcpy(ref_.data, image.data(), buffer_bytes_, cudaMemcpyHostToDevice));
#endif
  }
}

// All-ones bytes are a NaN in f32, bf16 and f16 alike.
void StagedTensor::poison() { set_bytes(std::vector<uint8_t>(buffer_bytes_, 0xff)); }

void StagedTensor::upload(const std::vector<float>& packed) {
  if (int64_t(packed.size()) != elements_) throw Error("upload", "size mismatch");
  std::vector<uint8_t> image(buffer_bytes_, 0xff);
  for_each_element(ref_, [&](int64_t i, int64_t offset) {
    store_from_float(image.data(), ref_.dtype, std::size_t(offset), packed[std::size_t(i)]);
  });
  set_bytes(image);
}

std::vector<float> StagedTensor::download() const {
  const std::vector<uint8_t> image = bytes();
  std::vector<float> packed(static_cast<std::size_t>(elements_));
  for_each_element(ref_, [&](int64_t i, int64_t offset) {
    packed[std::size_t(i)] = load_as_float(image.data(), ref_.dtype, std::size_t(offset));
  });
  return packed;
}

StagedOffsets::StagedOffsets(const std::vector<int32_t>& values, Device device) {
  ref_.device = device;
  ref_.size = int64_t(values.size());
  if (values.empty()) return;
  const std::size_t bytes = values.size() * sizeof(int32_t);
  if (device == Device::cpu) {
    auto* host = static_cast<int32_t*>(::operator new(bytes, kHostAlignment));
    std::memcpy(host, values.data(), bytes);
    ref_.data = host;
  } else {
#ifdef GQATTN_WITH_CUDA
    void* data = nullptr;
    GQATTN_CUDA_CHECK(cudaMalloc(&data, bytes));
    ref_.data = static_cast<const int32_t*>(data);
    GQATTN_CUDA_CHECK(cudaMemcpy(data, values.data(), bytes, cudaMemcpyHostToDevice));
#else
    throw Error("device", "this build has no CUDA");
#endif
  }
}

StagedOffsets::~StagedOffsets() {
  if (ref_.data == nullptr) return;
  void* data = const_cast<int32_t*>(ref_.data);
  if (ref_.device == Device::cpu) {
    ::operator delete(data, kHostAlignment);
  } else {
#ifdef GQATTN_WITH_CUDA
    cudaFree(data);
#endif
  }
}

void synchronize(Device device) {
#ifdef GQATTN_WITH_CUDA
  if (device == Device::cuda) GQATTN_CUDA_CHECK(cudaDeviceSynchronize());
#else
  (void)device;
#endif
}

}  // namespace gqattn::check
