// gqattn public types: the problem description, tensor references and options.
//
// Everything a caller passes to forward()/backward() is described here. The
// semantics every backend meets are in docs/semantics.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace gqattn {

enum class DType { f32, bf16, f16 };
enum class Device { cpu, cuda };

// Backends. Auto picks the fastest compiled-in backend that supports the
// problem; an explicit backend that cannot run a problem fails with the reason.
enum class Backend { Auto, Cpu, CudaUnfused, CudaFlash, CudaHopper, CpuFlash };

// A backend may support one pass and not the other (a forward-only backend).
enum class Pass { forward, backward };

// A view of caller-owned memory. Strides are in elements; the last dimension
// must be contiguous (stride 1), the others are free.
//   q, o, do, dq : rank 4, [B, Tq, H, d]       varlen: rank 3, [total_q, H, d]
//   k, v, dk, dv : rank 4, [B, Tk, Hkv, d]     varlen: rank 3, [total_k, Hkv, d]
//   lse          : rank 3, [B, H, Tq], f32     varlen: rank 2, [H, total_q], f32
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int rank = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
};

// A tensor with default (row-major, packed) strides. For q this is the seed's
// packed layout [B, T, H*d].
TensorRef contiguous(void* data, DType dtype, Device device, int64_t d0, int64_t d1);
TensorRef contiguous(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2);
TensorRef contiguous(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2,
                     int64_t d3);

struct Problem {
  int64_t B = 1;
  int64_t Tq = 1;
  int64_t Tk = 1;
  int64_t H = 1;
  int64_t Hkv = 1;
  int64_t d = 64;
  bool causal = false;
  int64_t window = 0;          // keys kept per query, self included; 0 = no window
  float softcap = 0.0f;        // s = softcap * tanh(s / softcap) when > 0; 0 = off
  std::optional<float> scale;  // default 1/sqrt(d)
  // Where the queries sit among the keys: query i at position q_start + i,
  // key j at position j; causal keeps j <= q_start + i, the window keeps
  // j >= q_start + i - window + 1. Unset: Tk - Tq (bottom-right aligned;
  // in a varlen batch, each sequence's own Tk_b - Tq_b). 0 is PyTorch
  // SDPA's top-left alignment. Any value, negative or past Tk, is allowed.
  std::optional<int64_t> q_start;
  // A packed variable-length batch (docs/semantics.md, "Variable-length
  // batches"): B sequences whose rows are packed one after another, the
  // sequence offsets passed beside the tensors (VarlenOffsets); Tq and Tk
  // are then the longest sequence's lengths (max_seqlen_q, max_seqlen_k),
  // bounds the offsets must keep.
  bool varlen = false;
  // Attention over a KV cache (forward_with_kv_cache, docs/semantics.md,
  // "KV cache"): B sequences of Tq queries over the keys in their cache
  // rows, Tk being the cache's capacity per sequence. kv_page_size > 0: the
  // cache is paged in pages of that many keys; 0: a dense cache.
  bool kv_cache = false;
  int64_t kv_page_size = 0;

  float effective_scale() const;
  // q_start, or its default Tk - Tq (of a dense problem; a varlen batch's
  // sequences default to their own lengths).
  int64_t query_start() const;
  // (query, key) pairs that the mask keeps in one (batch, head), exactly
  // (docs/semantics.md): the FLOP count of a pass is proportional to it.
  int64_t kept_pairs() const;
  // The window as the mask uses it: 0 (no window) when window == 0 or
  // window >= query_start() + Tq, else window. An identity of the mask
  // rule, not a new rule: key j is kept iff j >= q_start + i - window + 1,
  // and q_start + i <= q_start + Tq - 1 for every query i, so a window of
  // q_start + Tq or more keeps every key on the left, as no window does.
  // Every backend and the oracle read the window through this (per
  // sequence in a varlen batch: window_of), which also keeps pos - window + 1
  // far from overflow (a window near INT64_MAX, e.g. Python's sys.maxsize
  // for "no window", becomes 0).
  int64_t effective_window() const;
};

// Sequence offsets of a varlen batch: an int32 vector in caller memory
// (contiguous), on the device of the tensors.
struct OffsetsRef {
  const int32_t* data = nullptr;
  Device device = Device::cpu;
  int64_t size = 0;
};

// The offsets of a varlen batch of B sequences. Sequence b owns query rows
// cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 and key rows cu_seqlens_k[b] ..
// cu_seqlens_k[b + 1] - 1; both are non-decreasing, start at 0 and end at
// total_q, total_k, and no sequence is longer than the problem's Tq, Tk.
// seqused_k (optional, data == nullptr: none): sequence b uses only its
// first seqused_k[b] keys, as if it had that many.
struct VarlenOffsets {
  OffsetsRef cu_seqlens_q;  // [B + 1]
  OffsetsRef cu_seqlens_k;  // [B + 1]
  OffsetsRef seqused_k;     // [B] or absent
};

// The cache of forward_with_kv_cache. Dense: k, v [B_cache, T_cache, Hkv, d],
// sequence b in cache row batch_idx[b] (or b without batch_idx). Paged: k, v
// [num_pages, page_size, Hkv, d], key position p of sequence b in page
// block_table[b * pages_per_seq + p / page_size], row p % page_size.
// seqlens[b]: keys already cached for sequence b. The int32 vectors live on
// the device of the tensors.
struct KvCache {
  TensorRef k, v;          // read, and written where new keys are appended
  OffsetsRef seqlens;      // [B]
  OffsetsRef block_table;  // paged: [B * pages_per_seq], row-major; dense: absent
  int64_t pages_per_seq = 0;
  OffsetsRef batch_idx;  // dense, optional: [B]
};

// A problem of B sequences of Tq queries and Tk keys, H query heads over
// Hkv key/value heads of dimension d, with the given mask and softcap (scale
// left to its default, 1/sqrt(d)).
Problem make_problem(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t d,
                     bool causal = false, int64_t window = 0, float softcap = 0.0f);

struct Options {
  Backend backend = Backend::Auto;
  void* stream = nullptr;  // cudaStream_t for CUDA backends; ignored on the CPU
  // Same bits on every run (the default). false permits a faster
  // non-deterministic path where a backend has one (cuda-flash's backward
  // then adds the dQ partials with atomics in hardware order,
  // docs/backends/cuda-flash.md):
  // results stay within the same tolerances but may differ in the last bits
  // from run to run. Backends and passes without such a path ignore it and
  // stay deterministic (cuda-hopper: its ordered dQ adds measured faster
  // than unordered ones, docs/backends/cuda-hopper.md).
  bool deterministic = true;
  // Threads of the CPU backend (and the oracle): 0 = the library's default
  // (std::thread::hardware_concurrency()); n > 0 = at most n threads, the
  // caller's included. The torch op fills it from torch.get_num_threads().
  // The threads are started once and reused by later calls. CUDA backends
  // ignore it.
  int num_threads = 0;
  // Varlen batches: whether offsets in device memory are copied to the host
  // and checked before the call (a synchronisation with the stream, not
  // allowed under CUDA graph capture). Offsets in host memory are always
  // checked. Unchecked, the kernels clamp every index they derive from the
  // offsets: wrong offsets can give wrong numbers, never a read or write
  // outside the tensors.
  bool check_offsets = true;
  // KV-cache calls on the fused CUDA backends: how a sequence's keys are
  // split over thread blocks. false (the default): by the batch and the
  // GPU's size, to fill the GPU; a sequence's bits may then change with the
  // batch it is served in. true: by the sequence's own length only, so a
  // sequence gives the same bits alone or in any batch, on any GPU of the
  // same kind (docs/semantics.md, "KV cache"). Other calls and backends
  // ignore it (their results never depend on the other sequences).
  bool batch_invariant = false;
};

}  // namespace gqattn
