// The interface every backend implements, and the registry dispatch reads.
//
// Dispatch (src/api/dispatch.cpp) validates the arguments once, resolves the
// scale, then asks each backend `why_not`; a backend runs only problems for
// which it answered "". Backends never re-validate what validate.cpp checks.
// A fused backend decides its plan for a call once (its plan.hpp); why_not,
// describe_plan and the pass itself all read that one plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gqattn/error.hpp"
#include "gqattn/types.hpp"

namespace gqattn::detail {

// A varlen batch's offsets copied to the host and checked (api/varlen.cpp).
struct HostOffsets {
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
  std::vector<int32_t> seqused_k;  // empty: none
  // Sequence b's keys: seqused_k[b] when given, else its packed key rows.
  int64_t tk(int64_t b) const {
    return seqused_k.empty() ? cu_seqlens_k[b + 1] - cu_seqlens_k[b] : seqused_k[b];
  }
  int64_t tq(int64_t b) const { return cu_seqlens_q[b + 1] - cu_seqlens_q[b]; }
};

// Arguments after validation: shapes agree with the problem, pointers are
// non-null and aligned to their element, and problem.scale holds a value.
// A varlen batch (problem.varlen) arrives with its packed tensors as
// batches of one: q, o [1, total_q, H, d], k, v [1, total_k, Hkv, d], lse
// [1, H, total_q], batch stride 0, so that row r of a [B, T, heads, d]
// tensor is addressed alike in both; sequence b's rows start at
// offsets.cu_seqlens_q[b] (fused/sequence.hpp on the device).
// host_offsets holds the checked host copy when dispatch read the offsets
// (host memory, Options::check_offsets, or a backend that needs_host_offsets),
// else null.
struct ForwardArgs {
  Problem problem;
  TensorRef q, k, v, o, lse;  // lse.data may be null (not written)
  Options options;
  VarlenOffsets offsets = {};
  const HostOffsets* host_offsets = nullptr;
};

struct BackwardArgs {
  Problem problem;
  TensorRef q, k, v, o, lse, dout, dq, dk, dv;
  Options options;
  VarlenOffsets offsets = {};
  const HostOffsets* host_offsets = nullptr;
};

// A KV-cache call after validation (api/kv_cache.cpp): q, o, lse as in a
// dense forward; k_new, v_new [B, T_new, Hkv, d] or data == nullptr; the
// cache; host, the checked host copy of its int32 vectors when dispatch read
// them, else null.
struct HostKvCache {
  std::vector<int32_t> seqlens, block_table, batch_idx;  // batch_idx empty: none
};
struct KvCacheArgs {
  Problem problem;
  KvCache cache;
  TensorRef q, k_new, v_new, o, lse;
  Options options;
  const HostKvCache* host = nullptr;
};

class BackendImpl {
 public:
  virtual ~BackendImpl() = default;
  virtual Backend id() const = 0;
  // "" when this backend can run the problem's forward, else one line saying why not.
  virtual std::string why_not(const Problem& problem, DType dtype, Device device) const = 0;
  // The same for backward; a forward-only backend overrides it.
  virtual std::string why_not_backward(const Problem& problem, DType dtype, Device device) const {
    return why_not(problem, dtype, device);
  }
  // Checks one argument tensor needs beyond validate.cpp's (residency on the
  // device, alignment for wide loads), for the pass it is an argument of (o
  // is an output of forward and an input of backward). Dispatch asks for
  // every tensor of the call, lse included when present. "" when fine.
  virtual std::string why_not_tensor(const TensorRef& tensor, const char* name, Pass pass) const {
    (void)tensor;
    (void)name;
    (void)pass;
    return "";
  }
  // The plan the backend would run `pass` of `problem` with, in one line
  // (explain() shows it): "" for a backend with nothing to choose, or when
  // why_not refuses the problem.
  virtual std::string describe_plan(const Problem& problem, DType dtype, Pass pass,
                                    const Options& options) const {
    (void)problem;
    (void)dtype;
    (void)pass;
    (void)options;
    return "";
  }
  // A KV-cache call (Problem::kv_cache; why_not answers for it as for any
  // problem).
  virtual void forward_kv_cache(const KvCacheArgs& args) const = 0;
  // Whether this backend reads a varlen batch's offsets (or a KV cache's
  // int32 vectors) on the host (then dispatch copies and checks them
  // whatever Options::check_offsets says).
  virtual bool needs_host_offsets() const { return false; }
  virtual void forward(const ForwardArgs& args) const = 0;
  virtual void backward(const BackwardArgs& args) const = 0;
};

// Each returns the backend's singleton, or nullptr when it is not compiled in
// (then `reason` says why). Defined in the backend's own folder, or in
// registry.cpp when the backend is not built.
const BackendImpl* cpu_backend();
const BackendImpl* cpu_flash_backend();
const BackendImpl* cuda_unfused_backend(std::string* reason);
const BackendImpl* cuda_flash_backend(std::string* reason);
const BackendImpl* cuda_hopper_backend(std::string* reason);

const BackendImpl* find_backend(Backend backend, std::string* reason);

}  // namespace gqattn::detail
