// cuda-flash: the plain-data arguments the host side (flash_backend.cpp)
// hands to the kernel launchers (launch_*.cu). No CUDA types here, so the
// backend compiles with the host compiler. Checked through the kernels'
// tests (tests/gpu/test_flash_*.cpp).
#pragma once

#include <cstdint>

#include "cuda/fused/params.hpp"

namespace gqattn::flash {

struct ForwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // may be null: then lse is not written
  fused::RowStrides q_stride, k_stride, v_stride, o_stride;
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;
  int B = 0, H = 0, Hkv = 0;
  fused::MaskArgs mask;  // a varlen batch's bounds; each sequence's from seq
  fused::ScoreArgs score;
  fused::SequenceArgs seq;  // varlen offsets (null: dense)
  // The tensors' head dim: the kernel's own, or less where it is padded
  // (fused::kernel_head_dim; read by the padded instances only). Last, so
  // that the fields above keep their offsets in the kernels' parameters.
  int head_dim = 0;
};

// Launchers (launch_forward.cu, launch_backward.cu). `stream` is a cudaStream_t.
void run_forward(const ForwardParams& params, fused::ElemType elem, int d, void* stream);
void run_backward(const fused::BackwardParams& params, fused::ElemType elem, int d, void* stream);

}  // namespace gqattn::flash
