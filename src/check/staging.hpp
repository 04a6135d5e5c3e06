// Staging of check inputs and outputs: a tensor's elements live in a buffer
// on the backend's device with the tensor's (possibly padded) strides; the
// checker reads and writes them as packed float vectors on the host.
//
// Padding elements are filled with NaN, so a kernel that reads outside its
// tensor poisons its own output and fails the check. A tensor may have no
// elements (a varlen batch whose sequences are all empty).
//
// StagedOffsets: a varlen batch's int32 offsets on the same device.
#pragma once

#include <cstdint>
#include <vector>

#include "gqattn/types.hpp"

namespace gqattn::check {

class StagedTensor {
 public:
  // shape of rank 2 to 4; padded: strides get gaps after every row and block.
  StagedTensor(DType dtype, Device device, std::vector<int64_t> shape, bool padded);
  ~StagedTensor();
  StagedTensor(const StagedTensor&) = delete;
  StagedTensor& operator=(const StagedTensor&) = delete;

  const TensorRef& ref() const { return ref_; }
  // Writes packed values (rounded to the dtype) into the strided buffer.
  void upload(const std::vector<float>& packed);
  // Fills the whole buffer, gaps included, with NaN.
  void poison();
  // Reads the strided buffer back as packed floats.
  std::vector<float> download() const;
  // The raw bytes of the whole buffer (for bitwise comparisons).
  std::vector<uint8_t> bytes() const;

 private:
  void set_bytes(const std::vector<uint8_t>& image);

  TensorRef ref_;
  std::size_t buffer_bytes_ = 0;
  int64_t elements_ = 0;
};

// An int32 vector (cu_seqlens, seqused_k) on `device`; an empty vector
// gives an absent OffsetsRef (data == nullptr).
class StagedOffsets {
 public:
  StagedOffsets(const std::vector<int32_t>& values, Device device);
  ~StagedOffsets();
  StagedOffsets(const StagedOffsets&) = delete;
  StagedOffsets& operator=(const StagedOffsets&) = delete;

  const OffsetsRef& ref() const { return ref_; }

 private:
  OffsetsRef ref_;
};

// Waits for all device work (no-op on the CPU); used before reading clocks.
void synchronize(Device device);

}  // namespace gqattn::check
