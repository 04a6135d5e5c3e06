// A varlen batch's sequence offsets: shape rules, host copy, value rules and
// the batch-of-one views; see varlen.hpp.
#include "api/varlen.hpp"

#include <cstring>
#include <string>

#include "gqattn/error.hpp"

#ifdef GQATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gqattn::detail {
namespace {

std::string str(int64_t x) { return std::to_string(x); }

void check_cumulative(const char* name, const std::vector<int32_t>& cu, int64_t total,
                      int64_t max_len, const char* max_name) {
  if (cu.front() != 0) throw Error(std::string(name) + "[0] = " + str(cu.front()), "must be 0");
  for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t len = int64_t(cu[b + 1]) - cu[b];
    if (len < 0)
      throw Error(std::string(name) + "[" + str(int64_t(b) + 1) + "] = " + str(cu[b + 1]),
                  "must be >= " + std::string(name) + "[" + str(int64_t(b)) + "] = " + str(cu[b]) +
                      " (offsets never decrease)");
    if (len > max_len)
      throw Error(std::string(name) + " sequence " + str(int64_t(b)),
                  "has " + str(len) + " rows, more than " + max_name + " = " + str(max_len));
  }
  if (cu.back() != total)
    throw Error(std::string(name) + "[B] = " + str(cu.back()),
                "must equal the packed rows, " + str(total) + " (the last offset ends the data)");
}

}  // namespace

void validate_int32_vector(const char* name, const OffsetsRef& o, int64_t size, Device device) {
  if (o.data == nullptr) throw Error(name, "data is a null pointer");
  if (o.size != size)
    throw Error(std::string(name) + ".size = " + str(o.size),
                "must be " + str(size) + " (B + 1 for cu_seqlens, B for seqused_k)");
  if (o.device != device)
    throw Error(
        std::string(name) + ".device = " + (o.device == Device::cpu ? "cpu" : "cuda"),
        std::string("must be ") + (device == Device::cpu ? "cpu" : "cuda") + " (where q lives)");
  if (reinterpret_cast<std::uintptr_t>(o.data) % sizeof(int32_t) != 0)
    throw Error(name, "pointer is not aligned to its element size (4 bytes)");
}

std::vector<int32_t> copy_to_host(const OffsetsRef& o, void* stream) {
  std::vector<int32_t> out(static_cast<std::size_t>(o.size));
  if (o.size == 0) return out;
  if (o.device == Device::cpu) {
    std::memcpy(out.data(), o.data, sizeof(int32_t) * out.size());
    return out;
  }
#ifdef GQATTN_WITH_CUDA
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e =
      cudaMemcpyAsync(out.data(), o.data, sizeof(int32_t) * out.size(), cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess)
    throw Error("sequence offsets",
                std::string("copying them to the host for their check failed: ") +
                    cudaGetErrorString(e) +
                    " (under CUDA graph capture, set Options::check_offsets = false and use a "
                    "fused backend: cuda-unfused always reads them on the host)");
  return out;
#else
  (void)stream;
  throw Error("sequence offsets", "are in CUDA memory, and this build has no CUDA");
#endif
}

void validate_offsets_shape(const Problem& p, const VarlenOffsets& o, Device device) {
  validate_int32_vector("cu_seqlens_q", o.cu_seqlens_q, p.B + 1, device);
  validate_int32_vector("cu_seqlens_k", o.cu_seqlens_k, p.B + 1, device);
  if (o.seqused_k.data != nullptr) validate_int32_vector("seqused_k", o.seqused_k, p.B, device);
}

HostOffsets read_offsets(const VarlenOffsets& o, void* stream) {
  HostOffsets h;
  h.cu_seqlens_q = copy_to_host(o.cu_seqlens_q, stream);
  h.cu_seqlens_k = copy_to_host(o.cu_seqlens_k, stream);
  if (o.seqused_k.data != nullptr) h.seqused_k = copy_to_host(o.seqused_k, stream);
  return h;
}

void check_offsets(const Problem& p, const HostOffsets& h, int64_t total_q, int64_t total_k) {
  check_cumulative("cu_seqlens_q", h.cu_seqlens_q, total_q, p.Tq, "max_seqlen_q (Problem::Tq)");
  check_cumulative("cu_seqlens_k", h.cu_seqlens_k, total_k, p.Tk, "max_seqlen_k (Problem::Tk)");
  for (std::size_t b = 0; b < h.seqused_k.size(); ++b) {
    const int64_t keys = int64_t(h.cu_seqlens_k[b + 1]) - h.cu_seqlens_k[b];
    if (h.seqused_k[b] < 0 || h.seqused_k[b] > keys)
      throw Error(
          "seqused_k[" + str(int64_t(b)) + "] = " + str(h.seqused_k[b]),
          "must be in [0, " + str(keys) + "] (the keys of sequence " + str(int64_t(b)) + ")");
  }
}

TensorRef batch_of_one(const TensorRef& t) {
  TensorRef out = t;
  out.rank = t.rank + 1;
  out.shape[0] = 1;
  out.stride[0] = 0;
  for (int i = 0; i < t.rank; ++i) {
    out.shape[i + 1] = t.shape[i];
    out.stride[i + 1] = t.stride[i];
  }
  return out;
}

TensorRef offsets_tensor(const OffsetsRef& o) {
  TensorRef t;
  t.data = const_cast<int32_t*>(o.data);
  t.dtype = DType::f32;  // any 4-byte element: only the bytes matter here
  t.device = o.device;
  t.rank = 1;
  t.shape[0] = o.size;
  t.stride[0] = 1;
  return t;
}

}  // namespace gqattn::detail
