// gqattn._ext's KV-cache functions (nanobind): forward_with_kv_cache over a
// dense or paged cache that it appends new keys to in place, and
// merge_attention_states, on any DLPack tensors, zero-copy, writing into
// caller-provided outputs. bind_kv_cache() adds them to the module that
// gqattn_ext.cpp defines (whose exception translator turns gqattn::Error
// into gqattn.Error for these functions too).
// Checked by python/tests/test_kv_cache.py (pytest, through gqattn.torch).
//
// As in gqattn_ext.cpp, the binding only translates arrays into TensorRef /
// OffsetsRef and scalars into Problem / Options; every rule is the library's
// (src/api/kv_cache.cpp, src/api/merge_states.cpp). The binding checks only
// what those types cannot carry: rank > 4, dtypes and devices the library
// has no name for, which GPU a tensor lives on, and the block table's 2-D
// row-major layout (OffsetsRef is a flat vector).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "gqattn/attention.hpp"
#include "gqattn/error.hpp"
#include "gqattn/types.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

std::string str(int64_t x) { return std::to_string(x); }

bool is_gpu(int device_type) { return device_type == 2 || device_type == 13; }

// DLPack device types: kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 (pinned),
// kDLCUDAManaged = 13.
gqattn::Device device_of(const std::string& name, int device_type) {
  if (device_type == 1 || device_type == 3) return gqattn::Device::cpu;
  if (is_gpu(device_type)) return gqattn::Device::cuda;
  throw gqattn::Error(name + ".device", "must be host (CPU) or CUDA memory (DLPack device type " +
                                            str(device_type) + " is neither)");
}

std::string dtype_name(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  const char* base = dt.code == uint8_t(Code::Int)      ? "int"
                     : dt.code == uint8_t(Code::UInt)   ? "uint"
                     : dt.code == uint8_t(Code::Float)  ? "float"
                     : dt.code == uint8_t(Code::Bfloat) ? "bfloat"
                                                        : "dlpack-type-";
  return base + std::to_string(int(dt.bits));
}

gqattn::DType dtype_of(const std::string& name, nb::dlpack::dtype dt, bool lse) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes == 1 && dt.code == uint8_t(Code::Float) && dt.bits == 32) return gqattn::DType::f32;
  if (!lse && dt.lanes == 1 && dt.code == uint8_t(Code::Float) && dt.bits == 16)
    return gqattn::DType::f16;
  if (!lse && dt.lanes == 1 && dt.code == uint8_t(Code::Bfloat) && dt.bits == 16)
    return gqattn::DType::bf16;
  throw gqattn::Error(
      name + ".dtype = " + dtype_name(dt),
      lse ? "must be float32 (lse is always f32)" : "must be float32, bfloat16 or float16");
}

template <typename Array>
void* data_of(const Array& a) {
  return const_cast<void*>(static_cast<const void*>(a.data()));
}

// Every tensor must live where q lives: TensorRef has no GPU index.
template <typename Array>
void require_q_gpu(const std::string& name, const Array& a, const InArray& q) {
  if (is_gpu(a.device_type()) && is_gpu(q.device_type()) && a.device_id() != q.device_id())
    throw gqattn::Error(name + ".device = cuda:" + str(int64_t(a.device_id())),
                        "must be cuda:" + str(int64_t(q.device_id())) + " (where q lives)");
}

// dims: the shape the role expects, for the rank message.
template <typename Array>
gqattn::TensorRef ref(const std::string& name, const Array& a, const InArray& q, int rank,
                      const char* dims, bool lse = false) {
  if (int(a.ndim()) != rank)
    throw gqattn::Error(name + ".rank = " + str(int64_t(a.ndim())),
                        "must be " + str(rank) + " (shape " + dims + ")");
  require_q_gpu(name, a, q);
  gqattn::TensorRef t;
  t.data = data_of(a);
  t.dtype = dtype_of(name, a.dtype(), lse);
  t.device = device_of(name, a.device_type());
  t.rank = rank;
  for (int i = 0; i < rank; ++i) {
    t.shape[i] = int64_t(a.shape(size_t(i)));
    t.stride[i] = a.stride(size_t(i));  // in elements, as TensorRef's
  }
  return t;
}

// A written argument: a writable array, taken without conversion (a copy
// would be written instead of the caller's array).
OutArray writable(const char* name, nb::handle h) {
  OutArray out;
  if (nb::try_cast<OutArray>(h, out, /*convert=*/false)) return out;
  InArray read_only;
  if (nb::try_cast<InArray>(h, read_only, /*convert=*/false))
    throw gqattn::Error(name, "is read-only: it is written, so it must be a writable array");
  throw nb::type_error((std::string(name) + ": must be an array (numpy, torch, cupy or any " +
                        "DLPack array), got " + nb::inst_name(nb::borrow(h.type())).c_str())
                           .c_str());
}

// An int32 vector of the cache (cache_seqlens, cache_batch_idx, or the
// block table [B, pages_per_seq] flattened row-major). Its size, values and
// device are the library's to check.
gqattn::OffsetsRef ints(const std::string& name, const InArray& a, const InArray& q, size_t rank) {
  const nb::dlpack::dtype dt = a.dtype();
  if (dt.code != uint8_t(nb::dlpack::dtype_code::Int) || dt.bits != 32 || dt.lanes != 1)
    throw gqattn::Error(name + ".dtype = " + dtype_name(dt), "must be int32");
  if (a.ndim() != rank)
    throw gqattn::Error(name + ".rank = " + str(int64_t(a.ndim())),
                        rank == 1 ? "must be 1 ([B])" : "must be 2 ([B, pages_per_seq])");
  // Row-major and packed, the layout OffsetsRef describes (a dimension of
  // size 1 may have any stride).
  int64_t expect = 1;
  for (size_t i = rank; i-- > 0;) {
    if (a.shape(i) > 1 && a.stride(i) != expect)
      throw gqattn::Error(name + ".stride", "must be contiguous (row-major, packed)");
    expect *= int64_t(a.shape(i));
  }
  require_q_gpu(name, a, q);
  gqattn::OffsetsRef o;
  o.data = static_cast<const int32_t*>(data_of(a));
  o.device = device_of(name, a.device_type());
  o.size = int64_t(a.size());
  return o;
}

gqattn::Options options(const std::string& backend, bool deterministic, uintptr_t stream,
                        int num_threads, bool check_offsets) {
  gqattn::Options opt;
  opt.backend = gqattn::parse_backend(backend);
  opt.deterministic = deterministic;
  opt.num_threads = num_threads;
  opt.stream = reinterpret_cast<void*>(stream);  // an integer cudaStream_t; 0 = default
  opt.check_offsets = check_offsets;
  return opt;
}

void forward_with_kv_cache(const InArray& q, nb::handle k_cache_arg, nb::handle v_cache_arg,
                           nb::handle o_arg, nb::handle lse_arg, const InArray& cache_seqlens,
                           const std::optional<InArray>& k_new, const std::optional<InArray>& v_new,
                           const std::optional<InArray>& block_table,
                           const std::optional<InArray>& cache_batch_idx, bool causal,
                           int64_t window, float softcap, std::optional<float> scale,
                           std::optional<int64_t> q_start, const std::string& backend,
                           bool deterministic, uintptr_t stream, int num_threads,
                           bool check_offsets, bool batch_invariant) {
  const OutArray k_cache = writable("k_cache", k_cache_arg);
  const OutArray v_cache = writable("v_cache", v_cache_arg);
  const OutArray o = writable("o", o_arg);
  std::optional<OutArray> lse;
  if (!lse_arg.is_none()) lse = writable("lse", lse_arg);
  const char* cache_dims =
      block_table ? "[num_pages, page_size, Hkv, d]" : "[B_cache, T_cache, Hkv, d]";
  gqattn::KvCache cache;
  cache.k = ref("k_cache", k_cache, q, 4, cache_dims);
  cache.v = ref("v_cache", v_cache, q, 4, cache_dims);
  const gqattn::TensorRef Q = ref("q", q, q, 4, "[B, Tq, H, d]");
  const gqattn::TensorRef O = ref("o", o, q, 4, "[B, Tq, H, d]");
  gqattn::TensorRef L, K, V;  // data == nullptr: no lse, no new keys
  if (lse) L = ref("lse", *lse, q, 3, "[B, H, Tq]", true);
  if (k_new) K = ref("k", *k_new, q, 4, "[B, T_new, Hkv, d]");
  if (v_new) V = ref("v", *v_new, q, 4, "[B, T_new, Hkv, d]");

  // The sizes: B, Tq, H, d from q, Hkv from the cache; the capacity per
  // sequence from the dense cache's T_cache, or pages_per_seq * page_size.
  gqattn::Problem p = gqattn::make_problem(Q.shape[0], Q.shape[1], cache.k.shape[1], Q.shape[2],
                                           cache.k.shape[2], Q.shape[3], causal, window, softcap);
  p.scale = scale;
  p.q_start = q_start;
  p.kv_cache = true;
  cache.seqlens = ints("cache_seqlens", cache_seqlens, q, 1);
  if (block_table) {
    cache.block_table = ints("block_table", *block_table, q, 2);
    cache.pages_per_seq = int64_t(block_table->shape(1));
    if (int64_t(block_table->shape(0)) != p.B)
      throw gqattn::Error("block_table.shape[0] = " + str(int64_t(block_table->shape(0))),
                          "must be B = " + str(p.B) + " (one row of pages per sequence)");
    p.kv_page_size = cache.k.shape[1];
    p.Tk = cache.pages_per_seq * p.kv_page_size;
  }
  if (cache_batch_idx) cache.batch_idx = ints("cache_batch_idx", *cache_batch_idx, q, 1);
  gqattn::Options opt = options(backend, deterministic, stream, num_threads, check_offsets);
  opt.batch_invariant = batch_invariant;
  // The CPU backend runs as long as the problem takes: let other Python
  // threads run; the arrays stay referenced by this call's frame.
  nb::gil_scoped_release release;
  gqattn::forward_with_kv_cache(p, cache, Q, K, V, O, L, opt);
}

void merge_attention_states(const InArray& o_a, const InArray& lse_a, const InArray& o_b,
                            const InArray& lse_b, nb::handle o_arg, nb::handle lse_arg,
                            uintptr_t stream) {
  const OutArray o = writable("o", o_arg), lse = writable("lse", lse_arg);
  const char* dims = "[B, Tq, H, d]";
  const char* lse_dims = "[B, H, Tq]";
  const gqattn::TensorRef A = ref("o_a", o_a, o_a, 4, dims),
                          LA = ref("lse_a", lse_a, o_a, 3, lse_dims, true),
                          Bo = ref("o_b", o_b, o_a, 4, dims),
                          LB = ref("lse_b", lse_b, o_a, 3, lse_dims, true),
                          O = ref("o", o, o_a, 4, dims),
                          L = ref("lse", lse, o_a, 3, lse_dims, true);
  gqattn::Options opt;
  opt.stream = reinterpret_cast<void*>(stream);
  nb::gil_scoped_release release;
  gqattn::merge_attention_states(A, LA, Bo, LB, O, L, opt);
}

const char* kForwardWithKvCacheDoc =
    R"(forward_with_kv_cache(q, k_cache, v_cache, o, lse, cache_seqlens, *, k=None, v=None,
                      block_table=None, cache_batch_idx=None, causal=False, window=0,
                      softcap=0.0, scale=None, q_start=None, backend="auto",
                      deterministic=True, stream=0, num_threads=0, check_offsets=True,
                      batch_invariant=False)

Attention of q [B, Tq, H, d] over a KV cache, into o [B, Tq, H, d] and lse
[B, H, Tq] float32 (or None). Dense cache: k_cache, v_cache
[B_cache, T_cache, Hkv, d], sequence b in row cache_batch_idx[b] (or b).
Paged: [num_pages, page_size, Hkv, d] with block_table int32
[B, pages_per_seq] (key position p of sequence b in page
block_table[b, p // page_size]). cache_seqlens int32 [B]: keys already
cached. k, v [B, T_new, Hkv, d] (optional) are first written into the cache
in place at positions cache_seqlens[b] .. cache_seqlens[b] + T_new - 1;
then query i of sequence b attends to its cache_seqlens[b] + T_new keys from
position cache_seqlens[b] + T_new - Tq + i (unless q_start is given). The
int32 vectors live on q's device; check_offsets=False skips copying CUDA
ones to the host to check them (needed under CUDA graph capture).
batch_invariant=True: a sequence's result does not depend on the batch it
is in (Options::batch_invariant).)";

const char* kMergeDoc = R"(merge_attention_states(o_a, lse_a, o_b, lse_b, o, lse, *, stream=0)

Merges two partial results over disjoint key sets into o [B, Tq, H, d] and
lse [B, H, Tq] float32: o = (e^lse_a o_a + e^lse_b o_b) / (e^lse_a + e^lse_b),
lse = log(e^lse_a + e^lse_b); rows with lse = -inf on both sides get o = 0,
lse = -inf. o, lse may be o_a, lse_a (in place).)";

}  // namespace

void bind_kv_cache(nb::module_& m) {
  m.def("forward_with_kv_cache", &forward_with_kv_cache, "q"_a, "k_cache"_a, "v_cache"_a, "o"_a,
        "lse"_a.none(), "cache_seqlens"_a, nb::kw_only(), "k"_a.none() = nb::none(),
        "v"_a.none() = nb::none(), "block_table"_a.none() = nb::none(),
        "cache_batch_idx"_a.none() = nb::none(), "causal"_a = false, "window"_a = 0,
        "softcap"_a = 0.0f, "scale"_a.none() = nb::none(), "q_start"_a.none() = nb::none(),
        "backend"_a = "auto", "deterministic"_a = true, "stream"_a = 0, "num_threads"_a = 0,
        "check_offsets"_a = true, "batch_invariant"_a = false, kForwardWithKvCacheDoc);
  m.def("merge_attention_states", &merge_attention_states, "o_a"_a, "lse_a"_a, "o_b"_a, "lse_b"_a,
        "o"_a, "lse"_a, nb::kw_only(), "stream"_a = 0, kMergeDoc);
}
