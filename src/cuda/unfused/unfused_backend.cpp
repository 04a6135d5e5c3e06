// The cuda-unfused backend: the seed's correctness path on the GPU behind the
// BackendImpl interface. It says why it cannot run a problem (no device, a
// device older than sm_80 or without a kernel image, P larger than the
// device), checks that every tensor lives on the current device, sizes the
// P workspace against free memory before allocating it, and launches the
// kernels of unfused.hpp on the caller's stream without a host round trip.
// A varlen batch is the exception: it runs sequence by sequence, each the
// dense problem of its own lengths over views offset to its rows, so the
// offsets are read on the host first (needs_host_offsets: dispatch copies
// and checks them, one synchronisation with the stream). A KV-cache call
// also reads the cache's vectors on the host: it appends the new keys into
// the cache, then per sequence gathers the sequence's keys into a
// contiguous buffer and runs the dense forward over them, as the CPU
// mirror does.
// Checked by tests/gpu/test_cuda_unfused.cpp (results against the CPU
// backend, determinism, strides, the refusals and their messages) and
// tests/gpu/test_varlen.cpp (varlen batches and q_start against the oracle)
// and tests/gpu/test_kv_cache.cpp (the KV cache against the oracle).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "api/backend.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_query.hpp"
#include "cuda/common/workspace.hpp"
#include "cuda/unfused/unfused.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

namespace gqattn {
namespace cuda::unfused {

RowStrides row_strides(const TensorRef& t) {
  if (t.rank == 3) return {t.stride[0], t.stride[2], t.stride[1]};  // lse [B, H, Tq]
  return {t.stride[0], t.stride[1], t.stride[2]};
}

}  // namespace cuda::unfused

namespace detail {
namespace {

namespace unfused = cuda::unfused;

// The oldest architecture the library is built for (GQATTN_CUDA_ARCHS).
constexpr int kMinMajor = 8;
constexpr int kMinMinor = 0;

constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;
constexpr const char* kTooLargeAdvice = "; use cuda-flash or cpu for this size";

std::string gib(double bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / kBytesPerGiB);
  return text;
}

// Workspace bytes: P [B, H, Tq, Tk] f32, and for backward D [B, H, Tq] f32.
// A varlen batch (and a KV-cache call) runs one sequence at a time on one
// stream, so one sequence's workspace at the longest lengths (Tq, Tk)
// serves them all.
// In double first: for sizes no device holds the int64 product overflows.
double workspace_bytes(const Problem& p, bool with_d) {
  const double batch = p.varlen || p.kv_cache ? 1.0 : double(p.B);
  const double rows = batch * double(p.H) * double(p.Tq);
  return rows * double(p.Tk) * sizeof(float) + (with_d ? rows * sizeof(float) : 0.0);
}

std::string workspace_what(bool with_d) {
  return with_d ? "for P [B,H,Tq,Tk] f32 and D [B,H,Tq]" : "for P [B,H,Tq,Tk] f32";
}

// Throws before anything is allocated when the workspace cannot fit in the
// device's free memory now. Freed workspace that the library's pools keep
// (cuda/common/workspace.hpp) counts as used to cudaMemGetInfo: on a
// shortfall it is given back first, and the free memory read again.
void require_free_memory(double bytes, bool with_d) {
  std::size_t free_bytes = 0, total_bytes = 0;
  GQATTN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes > double(free_bytes)) {
    cuda::trim_workspace_pools();
    GQATTN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  }
  if (bytes > double(free_bytes))
    throw Error("backend", "cuda-unfused: needs " + gib(bytes) + " " + workspace_what(with_d) +
                               ", only " + gib(double(free_bytes)) + " free" + kTooLargeAdvice);
}

unfused::Launch launch_on(void* stream) {
  int device = 0;
  int threads_per_sm = 0;
  GQATTN_CUDA_CHECK(cudaGetDevice(&device));
  GQATTN_CUDA_CHECK(
      cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  unfused::Launch launch;
  launch.stream = static_cast<cudaStream_t>(stream);
  const int64_t blocks_per_sm = threads_per_sm / unfused::kThreadsPerBlock;
  const int64_t full = int64_t(cuda::current_device_properties().multiprocessors) * blocks_per_sm;
  launch.max_blocks = full > 0 ? full : 1;
  return launch;
}

unfused::In in(const TensorRef& t) { return {t.data, unfused::row_strides(t)}; }
unfused::Out out(const TensorRef& t) { return {t.data, unfused::row_strides(t)}; }

// Rows row0 .. row0 + rows - 1 of a varlen batch-of-one view (api/varlen.hpp:
// q-like [1, total, heads, d], lse [1, H, total]): the data pointer moved to
// row row0 and the row count set, so that the dense kernels address the
// sequence as batch 0 of a problem with B = 1. A tensor without data (an
// absent lse, or a packed tensor of no rows) stays without.
TensorRef rows_of(const TensorRef& t, int64_t row0, int64_t rows) {
  TensorRef v = t;
  const int dim = t.rank == 3 ? 2 : 1;  // lse's positions are its last dimension
  v.shape[dim] = rows;
  if (t.data != nullptr && row0 != 0)
    v.data = static_cast<char*>(t.data) + row0 * t.stride[dim] * int64_t(dtype_size(t.dtype));
  return v;
}

// Sequence b of a varlen batch as a dense problem of one sequence: its own
// lengths, the batch's q_start if given (else query_start()'s default, its
// own Tk_b - Tq_b), the rest of the problem unchanged.
Problem sequence_problem(const Problem& batch, int64_t tq, int64_t tk) {
  Problem p = batch;
  p.varlen = false;
  p.B = 1;
  p.Tq = tq;
  p.Tk = tk;
  return p;
}

const HostOffsets& host_offsets_of(const HostOffsets* host) {
  // needs_host_offsets() makes dispatch read and check them for every call.
  if (host == nullptr)
    throw Error("backend", "cuda-unfused: a varlen batch arrived without its host offsets");
  return *host;
}

// Zeros the dk, dv rows of sequence b's keys from `first` (its used keys,
// or 0 for a sequence without queries) to the end of its packed rows.
void zero_unread_keys(const BackwardArgs& args, const HostOffsets& host, int64_t b, int64_t first,
                      const unfused::Launch& launch) {
  const int64_t k0 = host.cu_seqlens_k[std::size_t(b)];
  const int64_t packed = host.cu_seqlens_k[std::size_t(b) + 1] - k0;
  if (packed <= first) return;
  for (const TensorRef* t : {&args.dk, &args.dv}) {
    unfused::ZeroRows zero;
    zero.dtype = t->dtype;
    zero.t = out(rows_of(*t, k0 + first, packed - first));
    zero.rows = packed - first;
    zero.heads = args.problem.Hkv;
    zero.d = args.problem.d;
    unfused::launch_zero_rows(zero, launch);
  }
}

// Byte offset `bytes` rounded up to the workspace's alignment, so that each
// buffer carved out of one workspace starts aligned for any element type.
std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Batch b of a [B, ...] tensor (q, o, lse) as a batch of one; a tensor
// without data stays without.
TensorRef batch_row(TensorRef t, int64_t b) {
  if (t.data != nullptr)
    t.data = static_cast<char*>(t.data) + b * t.stride[0] * int64_t(dtype_size(t.dtype));
  t.shape[0] = 1;
  return t;
}

// The KV-cache forward (KvCacheArgs, docs/semantics.md "KV cache"): the new
// keys and values appended into the cache in place, then sequence by
// sequence its keys gathered from the cache into a contiguous
// [1, keys, Hkv, d] buffer and the dense forward run over them (B = 1,
// Tk = keys, q_start as the per-sequence problem says), in the same order of
// operations as the CPU mirror. The slots come from the checked host copy
// of the cache's vectors, uploaded once as one table of (b, t) slots.
void kv_cache_forward(const KvCacheArgs& a, const unfused::Launch& launch,
                      void (*forward_dense)(const Problem&, const TensorRef&, const TensorRef&,
                                            const TensorRef&, const TensorRef&, const TensorRef&,
                                            float*, const unfused::Launch&)) {
  if (a.host == nullptr)  // needs_host_offsets() makes dispatch read them for every call
    throw Error("backend", "cuda-unfused: a KV-cache call arrived without its host vectors");
  const HostKvCache& h = *a.host;
  const Problem& p = a.problem;
  const KvCache& cache = a.cache;
  const int64_t t_new = a.k_new.data ? a.k_new.shape[1] : 0;
  auto cache_slot = [&](int64_t b, int64_t pos) -> std::pair<int64_t, int64_t> {
    if (p.kv_page_size > 0)
      return {h.block_table[std::size_t(b * cache.pages_per_seq + pos / p.kv_page_size)],
              pos % p.kv_page_size};
    return {h.batch_idx.empty() ? b : h.batch_idx[std::size_t(b)], pos};
  };

  // Slot table: the append's source and destination slots, then each
  // sequence's gather sources (its destinations are the buffer's rows
  // 0 .. keys - 1). seqlens are checked: seqlens[b] + t_new <= Tk.
  std::vector<int64_t> slots;
  auto push = [&slots](int64_t i0, int64_t i1) {
    slots.push_back(i0);
    slots.push_back(i1);
  };
  const int64_t appended = p.B * t_new;
  for (int64_t b = 0; b < p.B; ++b)  // append sources: k_new (b, t)
    for (int64_t t = 0; t < t_new; ++t) push(b, t);
  for (int64_t b = 0; b < p.B; ++b)  // append destinations: the cache slots
    for (int64_t t = 0; t < t_new; ++t) {
      const auto [i0, i1] = cache_slot(b, h.seqlens[std::size_t(b)] + t);
      push(i0, i1);
    }
  std::vector<std::size_t> gather_at(std::size_t(p.B));  // first pair of sequence b's gather
  for (int64_t b = 0; b < p.B; ++b) {
    gather_at[std::size_t(b)] = slots.size() / 2;
    const int64_t keys = h.seqlens[std::size_t(b)] + t_new;
    for (int64_t pos = 0; pos < keys; ++pos) {
      const auto [i0, i1] = cache_slot(b, pos);
      push(i0, i1);
    }
  }

  // One workspace: the slot table, the gathered K and V (at capacity Tk),
  // then P of one sequence. Allocated before anything is written: a failed
  // allocation leaves the cache and the outputs untouched.
  const std::size_t elem = dtype_size(a.q.dtype);
  const std::size_t table_bytes = aligned(slots.size() * sizeof(int64_t));
  const std::size_t kv_bytes = aligned(std::size_t(p.Tk * p.Hkv * p.d) * elem);
  const double p_bytes = workspace_bytes(p, /*with_d=*/false);
  require_free_memory(double(table_bytes + 2 * kv_bytes) + p_bytes, /*with_d=*/false);
  cuda::StreamWorkspace workspace(table_bytes + 2 * kv_bytes + std::size_t(p_bytes), launch.stream);
  char* base = static_cast<char*>(workspace.data());
  auto* table = reinterpret_cast<int64_t*>(base);
  void* k_rows = base + table_bytes;
  void* v_rows = base + table_bytes + kv_bytes;
  auto* P = reinterpret_cast<float*>(base + table_bytes + 2 * kv_bytes);
  if (!slots.empty())  // pageable source: staged before the call returns
    GQATTN_CUDA_CHECK(cudaMemcpyAsync(table, slots.data(), slots.size() * sizeof(int64_t),
                                      cudaMemcpyHostToDevice, launch.stream));

  for (const auto& [from, to] :
       {std::pair<const TensorRef*, const TensorRef*>{&a.k_new, &cache.k}, {&a.v_new, &cache.v}}) {
    unfused::SlotCopy append;
    append.dtype = a.q.dtype;
    append.src = in(*from);
    append.dst = out(*to);
    append.src_slots = table;
    append.dst_slots = table + 2 * appended;
    append.rows = appended;
    append.heads = p.Hkv;
    append.d = p.d;
    unfused::launch_copy_slots(append, launch);
  }

  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t keys = h.seqlens[std::size_t(b)] + t_new;
    Problem one = p;
    one.kv_cache = false;
    one.kv_page_size = 0;
    one.B = 1;
    one.Tk = keys;
    const TensorRef k = contiguous(k_rows, a.q.dtype, Device::cuda, 1, keys, p.Hkv, p.d);
    const TensorRef v = contiguous(v_rows, a.q.dtype, Device::cuda, 1, keys, p.Hkv, p.d);
    // keys == 0: nothing gathered; the forward kernel keeps no key for any
    // row and writes o = 0, lse = -inf without reading k or v.
    const int64_t* pairs = table + 2 * gather_at[std::size_t(b)];
    for (const auto& [from, to] :
         {std::pair<const TensorRef*, const TensorRef*>{&cache.k, &k}, {&cache.v, &v}}) {
      unfused::SlotCopy gather;
      gather.dtype = a.q.dtype;
      gather.src = in(*from);
      gather.dst = out(*to);
      gather.src_slots = pairs;
      gather.dst_slots = nullptr;  // row pos of the buffer
      gather.rows = keys;
      gather.heads = p.Hkv;
      gather.d = p.d;
      unfused::launch_copy_slots(gather, launch);
    }
    forward_dense(one, batch_row(a.q, b), k, v, batch_row(a.o, b), batch_row(a.lse, b), P, launch);
  }
}

class CudaUnfusedBackend final : public BackendImpl {
 public:
  Backend id() const override { return Backend::CudaUnfused; }

  std::string why_not(const Problem& problem, DType, Device device) const override {
    if (device != Device::cuda)
      return "tensors live in host memory; cuda-unfused needs CUDA device memory";
    std::string reason = cuda::why_no_device(kMinMajor, kMinMinor);
    if (reason.empty()) reason = unfused::why_no_kernel_image();
    if (!reason.empty()) return reason;
    // Backward's workspace, so that a problem forward accepts can also be
    // differentiated. Free memory changes; the check at run time uses it.
    std::size_t free_bytes = 0, total_bytes = 0;
    const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // returned as the reason instead
      return std::string("cannot query device memory: ") + cudaGetErrorString(status);
    }
    const double need = workspace_bytes(problem, /*with_d=*/true);
    if (need > double(total_bytes))
      return "needs " + gib(need) + " " + workspace_what(true) + ", the device has " +
             gib(double(total_bytes)) + kTooLargeAdvice;
    return "";
  }

  // A varlen batch runs sequence by sequence from the host, and so does a
  // KV-cache call (the cache's vectors read on the host).
  bool needs_host_offsets() const override { return true; }

  void forward_kv_cache(const KvCacheArgs& args) const override {
    kv_cache_forward(args, launch_on(args.options.stream), &forward_dense);
  }

  std::string why_not_tensor(const TensorRef& t, const char* name, Pass) const override {
    return cuda::why_not_device_pointer(t.data, name);
  }

  // explain()'s plan: its memory grows with Tq x Tk, and what the fused
  // backends take instead.
  std::string describe_plan(const Problem& p, DType, Pass pass, const Options&) const override {
    const bool with_d = pass == Pass::backward;
    return std::string(with_d ? "backward" : "forward") + ": unfused, " +
           gib(workspace_bytes(p, with_d)) + " of workspace " + workspace_what(with_d) +
           " (grows with Tq x Tk); the fused backends take bf16/f16 with d <= 256, a multiple of 8";
  }

  void forward(const ForwardArgs& args) const override {
    const double bytes = workspace_bytes(args.problem, /*with_d=*/false);
    require_free_memory(bytes, /*with_d=*/false);
    const unfused::Launch launch = launch_on(args.options.stream);
    cuda::StreamWorkspace workspace(static_cast<std::size_t>(bytes), launch.stream);
    if (!args.problem.varlen) {
      forward_dense(args.problem, args.q, args.k, args.v, args.o, args.lse, workspace.floats(),
                    launch);
      return;
    }
    // One sequence after another on the stream, all in one workspace. A
    // sequence without queries has nothing to write; one without keys gets
    // o = 0 and lse = -inf from the kernel (no key is kept for any row).
    const HostOffsets& host = host_offsets_of(args.host_offsets);
    for (int64_t b = 0; b < args.problem.B; ++b) {
      const int64_t tq = host.tq(b), tk = host.tk(b);
      if (tq == 0) continue;
      const int64_t q0 = host.cu_seqlens_q[std::size_t(b)];
      const int64_t k0 = host.cu_seqlens_k[std::size_t(b)];
      forward_dense(sequence_problem(args.problem, tq, tk), rows_of(args.q, q0, tq),
                    rows_of(args.k, k0, tk), rows_of(args.v, k0, tk), rows_of(args.o, q0, tq),
                    rows_of(args.lse, q0, tq), workspace.floats(), launch);
    }
  }

  void backward(const BackwardArgs& args) const override {
    const double bytes = workspace_bytes(args.problem, /*with_d=*/true);
    require_free_memory(bytes, /*with_d=*/true);
    const unfused::Launch launch = launch_on(args.options.stream);
    cuda::StreamWorkspace workspace(static_cast<std::size_t>(bytes), launch.stream);
    if (!args.problem.varlen) {
      backward_dense(args, workspace.floats(), launch);
      return;
    }
    // Each sequence's dk, dv rows are its own (no sum across sequences), so
    // the sequences run one after another like independent problems. D
    // follows P at the longest sequence's P size, as for a dense B = 1.
    const HostOffsets& host = host_offsets_of(args.host_offsets);
    for (int64_t b = 0; b < args.problem.B; ++b) {
      const int64_t tq = host.tq(b), tk = host.tk(b);
      if (tq == 0) {  // no query reads its keys
        zero_unread_keys(args, host, b, 0, launch);
        continue;
      }
      const int64_t q0 = host.cu_seqlens_q[std::size_t(b)];
      const int64_t k0 = host.cu_seqlens_k[std::size_t(b)];
      BackwardArgs one = args;
      one.problem = sequence_problem(args.problem, tq, tk);
      for (TensorRef* t : {&one.q, &one.o, &one.lse, &one.dout, &one.dq}) *t = rows_of(*t, q0, tq);
      for (TensorRef* t : {&one.k, &one.v, &one.dk, &one.dv}) *t = rows_of(*t, k0, tk);
      backward_dense(one, workspace.floats(), launch);
      zero_unread_keys(args, host, b, tk, launch);  // keys past seqused_k
    }
  }

 private:
  static void forward_dense(const Problem& problem, const TensorRef& q, const TensorRef& k,
                            const TensorRef& v, const TensorRef& o, const TensorRef& lse, float* P,
                            const unfused::Launch& launch) {
    unfused::ForwardPass pass;
    pass.shape = detail::resolve(problem);
    pass.dtype = q.dtype;
    pass.q = in(q);
    pass.k = in(k);
    pass.v = in(v);
    pass.o = out(o);
    pass.lse = out(lse);  // data may be null: lse not written
    pass.P = P;
    unfused::launch_forward(pass, launch);
  }

  // The dense backward of args.problem, P and D in `workspace` (at least
  // workspace_bytes(args.problem, true) bytes).
  static void backward_dense(const BackwardArgs& args, float* workspace,
                             const unfused::Launch& launch) {
    const unfused::Shape shape = detail::resolve(args.problem);
    float* P = workspace;
    float* D = P + shape.B * shape.H * shape.Tq * shape.Tk;

    // P again, by the forward's own kernel: bit-identical to the P that
    // produced o (lse is not read; exp(s - lse) would round differently).
    unfused::ForwardPass recompute;
    recompute.shape = shape;
    recompute.dtype = args.q.dtype;
    recompute.q = in(args.q);
    recompute.k = in(args.k);
    recompute.v = in(args.v);
    recompute.P = P;
    unfused::launch_forward(recompute, launch);

    unfused::BackwardPass pass;
    pass.shape = shape;
    pass.dtype = args.q.dtype;
    pass.q = in(args.q);
    pass.k = in(args.k);
    pass.v = in(args.v);
    pass.o = in(args.o);
    pass.dout = in(args.dout);
    pass.dq = out(args.dq);
    pass.dk = out(args.dk);
    pass.dv = out(args.dv);
    pass.P = P;
    pass.D = D;
    unfused::launch_backward(pass, launch);
  }
};

}  // namespace

const BackendImpl* cuda_unfused_backend(std::string* /*reason*/) {
  static const CudaUnfusedBackend backend;
  return &backend;
}

}  // namespace detail
}  // namespace gqattn
