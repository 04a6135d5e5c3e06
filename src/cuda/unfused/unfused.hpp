// The cuda-unfused kernels as the backend glue sees them: plain structs of
// sizes, device pointers and element strides, and one launcher per pass.
// The kernels port the seed's attention_fwd, attention_bwd_d,
// attention_bwd_dq and attention_bwd_dkv to CUDA, one thread per row, in the
// seed's (and the CPU mirror's) order of float operations. Checked against
// the CPU backend by tests/gpu/test_cuda_unfused.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "api/resolved_problem.hpp"
#include "gqattn/types.hpp"

namespace gqattn::cuda::unfused {

// Threads per block. Every kernel is one thread per row with long serial
// loops, so small blocks spread a short row list over more SMs.
constexpr int kThreadsPerBlock = 128;

// The problem's sizes, resolved once (shared with the CPU mirror).
using Shape = detail::ResolvedProblem;

// Element strides of a [B, T, heads, d] tensor's batch, position and head
// dimensions (d is contiguous). lse [B, H, Tq] maps its head and position
// strides to `h` and `t`.
struct RowStrides {
  int64_t b = 0, t = 0, h = 0;
};
RowStrides row_strides(const TensorRef& t);

struct In {
  const void* data = nullptr;
  RowStrides stride;
};
struct Out {
  void* data = nullptr;
  RowStrides stride;
};

struct Launch {
  cudaStream_t stream = nullptr;
  // Grid size cap: enough blocks to fill the device; rows beyond it are
  // handled by each thread's grid-stride loop, so any row count works.
  int64_t max_blocks = 1;
};

// attention_fwd: P [B, H, Tq, Tk] f32, and o, lse when their data is set.
struct ForwardPass {
  Shape shape;
  DType dtype = DType::f32;
  In q, k, v;
  Out o;    // data null: P only (backward recomputing the forward's P)
  Out lse;  // f32; data null: not written
  float* P = nullptr;
};
void launch_forward(const ForwardPass& pass, const Launch& launch);

// The backward kernels after launch_forward has filled P: D, then dv, then
// dq (which turns P into dS in place), then dk.
struct BackwardPass {
  Shape shape;
  DType dtype = DType::f32;
  In q, k, v, o, dout;
  Out dq, dk, dv;
  float* P = nullptr;  // [B, H, Tq, Tk]: P on entry, dS on return
  float* D = nullptr;  // [B, H, Tq]
};
void launch_backward(const BackwardPass& pass, const Launch& launch);

// Zeros `rows` rows of a [B = 1, T, heads, d] tensor, starting at its data
// pointer: the gradients of a varlen batch's key rows that no query reads
// (past seqused_k, or of a sequence without queries).
struct ZeroRows {
  DType dtype = DType::f32;
  Out t;
  int64_t rows = 0, heads = 0, d = 0;
};
void launch_zero_rows(const ZeroRows& zero, const Launch& launch);

// Copies `rows` rows of (heads x d) elements between two [B, T, heads, d]
// tensors: row r from src slot (src_slots[2r], src_slots[2r + 1]) = (b, t)
// to dst slot (dst_slots[2r], dst_slots[2r + 1]), or to (0, r) when
// dst_slots is null (a gather into a contiguous buffer). The KV-cache path appends
// new keys into the cache and gathers a sequence's keys out of it with it.
// The slot tables live in device memory and hold slots inside both tensors.
struct SlotCopy {
  DType dtype = DType::f32;
  In src;
  Out dst;
  const int64_t* src_slots = nullptr;  // [rows, 2]
  const int64_t* dst_slots = nullptr;  // [rows, 2], or null: (0, r)
  int64_t rows = 0, heads = 0, d = 0;
};
void launch_copy_slots(const SlotCopy& copy, const Launch& launch);

// "" when the current device can run these kernels (the build holds an
// image for its architecture), else why not.
std::string why_no_kernel_image();

}  // namespace gqattn::cuda::unfused
