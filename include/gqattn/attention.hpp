// gqattn's entry points: forward, backward, explain, build/device info and
// the release of retained CUDA workspace.
//
// forward  : o = softmax(mask(softcap(scale * q k^T))) v, and lse (natural log)
// backward : dq, dk, dv from q, k, v, o, lse and do (the gradient of o)
// Both validate every argument first (throwing gqattn::Error, writing
// nothing), then run on the backend named by options.backend.
#pragma once

#include <string>
#include <vector>

#include "gqattn/error.hpp"
#include "gqattn/types.hpp"

namespace gqattn {

// lse may have data == nullptr in forward: then it is not written.
void forward(const Problem& problem, const TensorRef& q, const TensorRef& k, const TensorRef& v,
             const TensorRef& o, const TensorRef& lse, const Options& options = {});

// lse and o are those forward produced. dq, dk, dv are overwritten (not
// accumulated into). GQA: dk/dv sum the contributions of every query head of
// their group.
void backward(const Problem& problem, const TensorRef& q, const TensorRef& k, const TensorRef& v,
              const TensorRef& o, const TensorRef& lse, const TensorRef& dout, const TensorRef& dq,
              const TensorRef& dk, const TensorRef& dv, const Options& options = {});

// A varlen batch (Problem::varlen, docs/semantics.md): the same passes over
// packed tensors, q [total_q, H, d], k, v [total_k, Hkv, d], lse [H, total_q],
// sequence b being the dense problem of its own lengths.
void forward(const Problem& problem, const VarlenOffsets& offsets, const TensorRef& q,
             const TensorRef& k, const TensorRef& v, const TensorRef& o, const TensorRef& lse,
             const Options& options = {});
void backward(const Problem& problem, const VarlenOffsets& offsets, const TensorRef& q,
              const TensorRef& k, const TensorRef& v, const TensorRef& o, const TensorRef& lse,
              const TensorRef& dout, const TensorRef& dq, const TensorRef& dk, const TensorRef& dv,
              const Options& options = {});

// Attention over a KV cache (Problem::kv_cache, docs/semantics.md "KV
// cache"), forward only. k_new, v_new [B, T_new, Hkv, d] (data == nullptr:
// no new keys) are first written into the cache in place at positions
// seqlens[b] .. seqlens[b] + T_new - 1 of sequence b (the caller's
// seqlens is not changed); then q [B, Tq, H, d] attends to the
// seqlens[b] + T_new keys of its sequence, query i at position
// seqlens[b] + T_new - Tq + i unless Problem::q_start says otherwise.
// problem.Tk is the cache's capacity per sequence (T_cache, or
// pages_per_seq * page_size).
void forward_with_kv_cache(const Problem& problem, const KvCache& cache, const TensorRef& q,
                           const TensorRef& k_new, const TensorRef& v_new, const TensorRef& o,
                           const TensorRef& lse, const Options& options = {});

// Merges two partial attention results over disjoint key sets by their lse:
// o = (e^lse_a o_a + e^lse_b o_b) / (e^lse_a + e^lse_b), lse = log(e^lse_a +
// e^lse_b); a row whose lse is -inf on both sides gets o = 0, lse = -inf.
// o_* and o [B, Tq, H, d] (one dtype), lse_* and lse [B, H, Tq] f32, all on
// one device; o and lse may be o_a and lse_a (in place) but overlap nothing
// else.
void merge_attention_states(const TensorRef& o_a, const TensorRef& lse_a, const TensorRef& o_b,
                            const TensorRef& lse_b, const TensorRef& o, const TensorRef& lse,
                            const Options& options = {});

// Whether `backend` can run `pass` of `problem` with tensors of `dtype` on
// `device`, and how. For Backend::Auto, `chosen` names the backend Auto
// would pick. `options` matters where the plan depends on it
// (Options::deterministic: cuda-flash's dQ path).
struct Explanation {
  bool supported = false;
  Backend chosen = Backend::Auto;
  std::string reason;  // empty when supported; otherwise why not (per backend for Auto)
  // When supported: the plan the chosen backend would run, in one line
  // (tile, score mode, splits, dQ path, workspace, ...); "" for a backend
  // with nothing to choose.
  std::string plan;
};
Explanation explain(const Problem& problem, DType dtype, Device device, Backend backend,
                    Pass pass = Pass::forward, const Options& options = {});

const char* backend_name(Backend backend);  // "cpu", "cuda-unfused", ...
// Parses a backend name as backend_name prints it, or "auto"; throws Error otherwise.
Backend parse_backend(const std::string& name);
std::vector<Backend> all_backends();  // every concrete backend, compiled in or not

struct BackendStatus {
  Backend backend;
  bool compiled = false;   // built into this library
  bool available = false;  // usable on this machine now
  std::string reason;      // why not, when not available
};
std::vector<BackendStatus> backend_status();

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int multiprocessors = 0;
  std::size_t memory_bytes = 0;
};
struct BuildInfo {
  std::string version;
  bool cuda_compiled = false;
  std::string cuda_architectures;  // as configured, e.g. "80;90a"
  std::string cuda_runtime;        // runtime version compiled against, or ""
};
BuildInfo build_info();
// CUDA devices visible now; `why_none` says why the list is empty.
std::vector<CudaDeviceInfo> cuda_devices(std::string* why_none = nullptr);

// The CUDA backends take their per-call workspace from a memory pool of the
// library's own per device, which keeps up to 1 GiB of freed workspace
// mapped across synchronisations so that later calls reuse it without
// mapping it afresh. This returns that memory to the driver, e.g. before a
// phase that needs it elsewhere (PyTorch's caching allocator does not see
// it). Workspace freed by calls whose completion the host has not yet
// observed (by a stream, event or device synchronisation) may stay. A no-op
// without CUDA or before a CUDA backend allocated workspace; later calls
// fill the pools again. Throws gqattn::Error if the CUDA runtime fails.
void release_workspace_memory();

}  // namespace gqattn
