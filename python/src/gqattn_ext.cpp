// gqattn's Python extension module, gqattn._ext (nanobind): forward and
// backward on any DLPack tensor (numpy on the CPU; torch or cupy on CUDA),
// zero-copy, writing into caller-provided outputs; explain, backend status,
// build info; and the f64 oracle for tests and gradcheck.
// Checked by python/tests/ (pytest) through the installed package.
//
// The binding only translates: array -> TensorRef (shape, strides in
// elements, dtype, device), Python scalars -> Problem/Options, and
// gqattn::Error -> gqattn.Error (a ValueError). Every rule about shapes,
// dtypes and strides is the library's (src/api/validate.cpp), so Python
// callers get the same messages as C++ callers. The binding checks only what
// a TensorRef cannot carry: rank > 4, dtypes and devices the library has no
// name for, and which GPU a tensor lives on.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/error.hpp"
#include "gqattn/oracle.hpp"
#include "gqattn/types.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Inputs accept read-only views (nb::ro): a numpy array with writeable=False
// or a torch tensor exported read-only must not be refused or copied.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

// How a role is shaped, for the binding's own rank message (worded as the
// library's, src/api/validate.cpp).
struct RoleShape {
  int rank;
  const char* dims;
  bool lse;  // always f32, whatever the I/O dtype
};
constexpr RoleShape kQShape{4, "[B, Tq, H, d]", false};
constexpr RoleShape kKShape{4, "[B, Tk, Hkv, d]", false};
constexpr RoleShape kLseShape{3, "[B, H, Tq]", true};
// A varlen batch's packed tensors.
constexpr RoleShape kQPacked{3, "[total_q, H, d]", false};
constexpr RoleShape kKPacked{3, "[total_k, Hkv, d]", false};
constexpr RoleShape kLsePacked{2, "[H, total_q]", true};

std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  std::string base;
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: base = "int"; break;
    case Code::UInt: base = "uint"; break;
    case Code::Float: base = "float"; break;
    case Code::Bfloat: base = "bfloat"; break;
    case Code::Complex: base = "complex"; break;
    case Code::Bool: return "bool";
    default: base = "dlpack-code-" + std::to_string(int(dt.code)) + "-bits-";
  }
  std::string name = base + std::to_string(int(dt.bits));
  if (dt.lanes != 1) name += "x" + std::to_string(int(dt.lanes));
  return name;
}

bool is_float(nb::dlpack::dtype dt, int bits) {
  return dt.code == uint8_t(nb::dlpack::dtype_code::Float) && dt.bits == bits && dt.lanes == 1;
}

// Dtypes the library can name go through (it checks them against q's);
// others are refused here, in numpy/torch names since the library has none.
gqattn::DType to_dtype(const std::string& name, nb::dlpack::dtype dt, bool lse) {
  if (is_float(dt, 32)) return gqattn::DType::f32;
  if (is_float(dt, 16)) return gqattn::DType::f16;
  if (dt.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 && dt.lanes == 1)
    return gqattn::DType::bf16;
  std::string rule = "must be float32, bfloat16 or float16";
  if (lse)
    rule = "must be float32 (lse is always f32)";
  else if (is_float(dt, 64))
    rule += " (float64 runs only in the f64 oracle: oracle_forward / oracle_backward)";
  throw gqattn::Error(name + ".dtype = " + dlpack_dtype_name(dt), rule);
}

// DLPack device types (dlpack.h): kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3
// (pinned host memory), kDLCUDAManaged = 13.
gqattn::Device to_device(const std::string& name, int device_type) {
  switch (device_type) {
    case 1:
    case 3: return gqattn::Device::cpu;  // pinned memory is host memory to the CPU backend
    case 2:
    case 13: return gqattn::Device::cuda;  // managed memory: the kernels may read it
    default:
      throw gqattn::Error(name + ".device",
                          "must be host (CPU) or CUDA memory (DLPack device type " +
                              std::to_string(device_type) + " is neither)");
  }
}

std::string device_str(const nb::ndarray<nb::ro>& a) {
  return a.device_type() == 2 || a.device_type() == 13 ? "cuda:" + std::to_string(a.device_id())
                                                       : "cpu";
}

// The array's first element. nanobind's data() is const-qualified for
// ndarray<> in some releases (2.0) and not in others (3.x); TensorRef takes void*.
template <typename Array>
void* data_of(const Array& a) {
  return const_cast<void*>(static_cast<const void*>(a.data()));
}

template <typename Array>
gqattn::TensorRef to_ref(const std::string& name, const Array& a, RoleShape role) {
  // A TensorRef holds at most 4 dimensions; say so in the library's words
  // rather than truncating. Lower ranks go through: the library names them.
  if (a.ndim() > 4)
    throw gqattn::Error(name + ".rank = " + std::to_string(a.ndim()),
                        "must be " + std::to_string(role.rank) + " (shape " + role.dims + ")");
  gqattn::TensorRef t;
  t.data = data_of(a);
  t.dtype = to_dtype(name, a.dtype(), role.lse);
  t.device = to_device(name, a.device_type());
  t.rank = int(a.ndim());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = int64_t(a.shape(size_t(i)));
    t.stride[i] = a.stride(size_t(i));  // nanobind strides count elements, as TensorRef's do
  }
  return t;
}

// An output argument: a writable array, taken without conversion. A
// read-only array (a numpy array with writeable=False, a broadcast view) is
// refused in gqattn's words rather than by nanobind's generic TypeError.
OutArray as_output(const char* name, nb::handle h) {
  OutArray out;
  if (nb::try_cast<OutArray>(h, out, /*convert=*/false)) return out;
  InArray read_only;
  if (nb::try_cast<InArray>(h, read_only, /*convert=*/false))
    throw gqattn::Error(name, "is read-only: an output must be a writable array");
  throw nb::type_error((std::string(name) +
                        ": must be an array (numpy, torch, cupy or any "
                        "DLPack array), got " +
                        nb::inst_name(nb::borrow(h.type())).c_str())
                           .c_str());
}

// The library's TensorRef has no GPU index: it cannot tell cuda:0 from
// cuda:1, so the binding requires every tensor on q's device, and the caller
// makes that device current (the torch layer does).
template <typename Array>
void require_same_gpu(const std::string& name, const Array& a, const InArray& q) {
  const bool a_gpu = a.device_type() == 2 || a.device_type() == 13;
  const bool q_gpu = q.device_type() == 2 || q.device_type() == 13;
  if (a_gpu && q_gpu && a.device_id() != q.device_id())
    throw gqattn::Error(name + ".device = cuda:" + std::to_string(a.device_id()),
                        "must be " + device_str(q) + " (where q lives)");
}

void require_rank(const std::string& name, size_t ndim, RoleShape role) {
  if (int(ndim) != role.rank)
    throw gqattn::Error(name + ".rank = " + std::to_string(ndim),
                        "must be " + std::to_string(role.rank) + " (shape " + role.dims + ")");
}

gqattn::Problem make_problem(const InArray& q, const InArray& k, bool causal, int64_t window,
                             float softcap, std::optional<float> scale,
                             std::optional<int64_t> q_start) {
  // The sizes come from q and k; the library then checks every other tensor
  // against them. q and k must be rank 4 for the sizes to exist at all.
  require_rank("q", q.ndim(), kQShape);
  require_rank("k", k.ndim(), kKShape);
  gqattn::Problem p = gqattn::make_problem(
      int64_t(q.shape(0)), int64_t(q.shape(1)), int64_t(k.shape(1)), int64_t(q.shape(2)),
      int64_t(k.shape(2)), int64_t(q.shape(3)), causal, window, softcap);
  p.scale = scale;
  p.q_start = q_start;
  return p;
}

// A varlen batch: B from cu_seqlens_q's length, Tq and Tk the caller's
// longest sequences, H, Hkv and d from the packed q [total_q, H, d] and
// k [total_k, Hkv, d].
gqattn::Problem make_varlen_problem(const InArray& q, const InArray& k, const InArray& cu_seqlens_q,
                                    int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal,
                                    int64_t window, float softcap, std::optional<float> scale,
                                    std::optional<int64_t> q_start) {
  require_rank("q", q.ndim(), kQPacked);
  require_rank("k", k.ndim(), kKPacked);
  if (cu_seqlens_q.ndim() != 1 || cu_seqlens_q.shape(0) < 1)
    throw gqattn::Error("cu_seqlens_q.shape", "must be [B + 1] (1-D, at least one offset)");
  gqattn::Problem p = gqattn::make_problem(int64_t(cu_seqlens_q.shape(0)) - 1, max_seqlen_q,
                                           max_seqlen_k, int64_t(q.shape(1)), int64_t(k.shape(1)),
                                           int64_t(q.shape(2)), causal, window, softcap);
  p.scale = scale;
  p.q_start = q_start;
  p.varlen = true;
  return p;
}

// An int32 offsets vector (cu_seqlens_*, seqused_k): 1-D and contiguous,
// since OffsetsRef has no stride. Its length, values and device are the
// library's to check (src/api/varlen.cpp).
gqattn::OffsetsRef to_offsets(const std::string& name, const InArray& a) {
  const nb::dlpack::dtype dt = a.dtype();
  if (dt.code != uint8_t(nb::dlpack::dtype_code::Int) || dt.bits != 32 || dt.lanes != 1)
    throw gqattn::Error(name + ".dtype = " + dlpack_dtype_name(dt), "must be int32");
  if (a.ndim() != 1) throw gqattn::Error(name + ".rank = " + std::to_string(a.ndim()), "must be 1");
  if (a.shape(0) > 1 && a.stride(0) != 1)
    throw gqattn::Error(name + ".stride = " + std::to_string(a.stride(0)),
                        "must be 1 (a contiguous vector)");
  gqattn::OffsetsRef o;
  o.data = static_cast<const int32_t*>(data_of(a));
  o.device = to_device(name, a.device_type());
  o.size = int64_t(a.shape(0));
  return o;
}

gqattn::VarlenOffsets make_offsets(const InArray& q, const InArray& cu_seqlens_q,
                                   const InArray& cu_seqlens_k,
                                   const std::optional<InArray>& seqused_k) {
  require_same_gpu("cu_seqlens_q", cu_seqlens_q, q);
  require_same_gpu("cu_seqlens_k", cu_seqlens_k, q);
  gqattn::VarlenOffsets off;
  off.cu_seqlens_q = to_offsets("cu_seqlens_q", cu_seqlens_q);
  off.cu_seqlens_k = to_offsets("cu_seqlens_k", cu_seqlens_k);
  if (seqused_k) {
    require_same_gpu("seqused_k", *seqused_k, q);
    off.seqused_k = to_offsets("seqused_k", *seqused_k);
  }
  return off;
}

gqattn::Options make_options(const std::string& backend, bool deterministic, uintptr_t stream,
                             int num_threads) {
  gqattn::Options opt;
  opt.backend = gqattn::parse_backend(backend);
  opt.deterministic = deterministic;
  opt.num_threads = num_threads;
  // The stream travels as an integer (torch's Stream.cuda_stream, cupy's
  // Stream.ptr); 0 is the legacy default stream.
  opt.stream = reinterpret_cast<void*>(stream);
  return opt;
}

void forward(const InArray& q, const InArray& k, const InArray& v, nb::handle o_arg,
             nb::handle lse_arg, bool causal, int64_t window, float softcap,
             std::optional<float> scale, std::optional<int64_t> q_start, const std::string& backend,
             bool deterministic, uintptr_t stream, int num_threads) {
  const gqattn::Problem p = make_problem(q, k, causal, window, softcap, scale, q_start);
  const gqattn::Options opt = make_options(backend, deterministic, stream, num_threads);
  const OutArray o = as_output("o", o_arg);
  std::optional<OutArray> lse;
  if (!lse_arg.is_none()) lse = as_output("lse", lse_arg);
  require_same_gpu("k", k, q);
  require_same_gpu("v", v, q);
  require_same_gpu("o", o, q);
  const gqattn::TensorRef Q = to_ref("q", q, kQShape), K = to_ref("k", k, kKShape),
                          V = to_ref("v", v, kKShape), O = to_ref("o", o, kQShape);
  gqattn::TensorRef lse_ref;  // data == nullptr: lse not written
  if (lse) {
    require_same_gpu("lse", *lse, q);
    lse_ref = to_ref("lse", *lse, kLseShape);
  }
  // The CPU backend runs for as long as the problem takes: let other Python
  // threads run meanwhile. The arrays stay referenced by this call's frame.
  nb::gil_scoped_release release;
  gqattn::forward(p, Q, K, V, O, lse_ref, opt);
}

void backward(const InArray& q, const InArray& k, const InArray& v, const InArray& o,
              const InArray& lse, const InArray& dout, nb::handle dq_arg, nb::handle dk_arg,
              nb::handle dv_arg, bool causal, int64_t window, float softcap,
              std::optional<float> scale, std::optional<int64_t> q_start,
              const std::string& backend, bool deterministic, uintptr_t stream, int num_threads) {
  const gqattn::Problem p = make_problem(q, k, causal, window, softcap, scale, q_start);
  const gqattn::Options opt = make_options(backend, deterministic, stream, num_threads);
  const OutArray dq = as_output("dq", dq_arg), dk = as_output("dk", dk_arg),
                 dv = as_output("dv", dv_arg);
  require_same_gpu("k", k, q);
  require_same_gpu("v", v, q);
  require_same_gpu("o", o, q);
  require_same_gpu("lse", lse, q);
  require_same_gpu("do", dout, q);
  require_same_gpu("dq", dq, q);
  require_same_gpu("dk", dk, q);
  require_same_gpu("dv", dv, q);
  const gqattn::TensorRef Q = to_ref("q", q, kQShape), K = to_ref("k", k, kKShape),
                          V = to_ref("v", v, kKShape), O = to_ref("o", o, kQShape),
                          L = to_ref("lse", lse, kLseShape), dO = to_ref("do", dout, kQShape),
                          dQ = to_ref("dq", dq, kQShape), dK = to_ref("dk", dk, kKShape),
                          dV = to_ref("dv", dv, kKShape);
  nb::gil_scoped_release release;
  gqattn::backward(p, Q, K, V, O, L, dO, dQ, dK, dV, opt);
}

// ---- varlen batches ----------------------------------------------------------
// Packed q, o [total_q, H, d], k, v [total_k, Hkv, d], lse [H, total_q] and
// int32 offsets on the tensors' device; the library checks the offsets (on
// the host, after a copy from CUDA memory unless check_offsets is false).

void forward_varlen(const InArray& q, const InArray& k, const InArray& v, nb::handle o_arg,
                    nb::handle lse_arg, const InArray& cu_seqlens_q, const InArray& cu_seqlens_k,
                    int64_t max_seqlen_q, int64_t max_seqlen_k,
                    const std::optional<InArray>& seqused_k, bool causal, int64_t window,
                    float softcap, std::optional<float> scale, std::optional<int64_t> q_start,
                    const std::string& backend, bool deterministic, uintptr_t stream,
                    int num_threads, bool check_offsets) {
  const gqattn::Problem p = make_varlen_problem(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
                                                causal, window, softcap, scale, q_start);
  gqattn::Options opt = make_options(backend, deterministic, stream, num_threads);
  opt.check_offsets = check_offsets;
  const gqattn::VarlenOffsets off = make_offsets(q, cu_seqlens_q, cu_seqlens_k, seqused_k);
  const OutArray o = as_output("o", o_arg);
  std::optional<OutArray> lse;
  if (!lse_arg.is_none()) lse = as_output("lse", lse_arg);
  require_same_gpu("k", k, q);
  require_same_gpu("v", v, q);
  require_same_gpu("o", o, q);
  const gqattn::TensorRef Q = to_ref("q", q, kQPacked), K = to_ref("k", k, kKPacked),
                          V = to_ref("v", v, kKPacked), O = to_ref("o", o, kQPacked);
  gqattn::TensorRef lse_ref;
  if (lse) {
    require_same_gpu("lse", *lse, q);
    lse_ref = to_ref("lse", *lse, kLsePacked);
  }
  nb::gil_scoped_release release;
  gqattn::forward(p, off, Q, K, V, O, lse_ref, opt);
}

void backward_varlen(const InArray& q, const InArray& k, const InArray& v, const InArray& o,
                     const InArray& lse, const InArray& dout, nb::handle dq_arg, nb::handle dk_arg,
                     nb::handle dv_arg, const InArray& cu_seqlens_q, const InArray& cu_seqlens_k,
                     int64_t max_seqlen_q, int64_t max_seqlen_k,
                     const std::optional<InArray>& seqused_k, bool causal, int64_t window,
                     float softcap, std::optional<float> scale, std::optional<int64_t> q_start,
                     const std::string& backend, bool deterministic, uintptr_t stream,
                     int num_threads, bool check_offsets) {
  const gqattn::Problem p = make_varlen_problem(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
                                                causal, window, softcap, scale, q_start);
  gqattn::Options opt = make_options(backend, deterministic, stream, num_threads);
  opt.check_offsets = check_offsets;
  const gqattn::VarlenOffsets off = make_offsets(q, cu_seqlens_q, cu_seqlens_k, seqused_k);
  const OutArray dq = as_output("dq", dq_arg), dk = as_output("dk", dk_arg),
                 dv = as_output("dv", dv_arg);
  require_same_gpu("k", k, q);
  require_same_gpu("v", v, q);
  require_same_gpu("o", o, q);
  require_same_gpu("lse", lse, q);
  require_same_gpu("do", dout, q);
  require_same_gpu("dq", dq, q);
  require_same_gpu("dk", dk, q);
  require_same_gpu("dv", dv, q);
  const gqattn::TensorRef Q = to_ref("q", q, kQPacked), K = to_ref("k", k, kKPacked),
                          V = to_ref("v", v, kKPacked), O = to_ref("o", o, kQPacked),
                          L = to_ref("lse", lse, kLsePacked), dO = to_ref("do", dout, kQPacked),
                          dQ = to_ref("dq", dq, kQPacked), dK = to_ref("dk", dk, kKPacked),
                          dV = to_ref("dv", dv, kKPacked);
  nb::gil_scoped_release release;
  gqattn::backward(p, off, Q, K, V, O, L, dO, dQ, dK, dV, opt);
}

// ---- the f64 oracle ---------------------------------------------------------
// oracle.hpp takes and returns packed std::vector<double>, so the binding
// gathers strided float64 host arrays into packed vectors and scatters the
// results into the caller's outputs (any strides).

void require_f64_host(const std::string& name, nb::dlpack::dtype dt, int device_type) {
  if (!is_float(dt, 64))
    throw gqattn::Error(name + ".dtype = " + dlpack_dtype_name(dt),
                        "must be float64 (the oracle computes in f64)");
  if (device_type != 1 && device_type != 3)
    throw gqattn::Error(name + ".device", "must be host (CPU) memory (the oracle runs on the CPU)");
}

template <typename Array>
void require_shape(const std::string& name, const Array& a, const std::vector<int64_t>& want,
                   const char* dims) {
  bool ok = a.ndim() == want.size();
  for (size_t i = 0; ok && i < want.size(); ++i) ok = int64_t(a.shape(i)) == want[i];
  if (ok) return;
  auto str = [](auto get, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(get(i));
    return s + "]";
  };
  throw gqattn::Error(
      name + ".shape = " + str([&](size_t i) { return int64_t(a.shape(i)); }, a.ndim()),
      std::string("must be ") + dims + " = " + str([&](size_t i) { return want[i]; }, want.size()));
}

// Strided walk over every element of a rank <= 4 array, in row-major order.
template <typename Array, typename F>
void for_each_offset(const Array& a, F&& f) {
  int64_t shape[4] = {1, 1, 1, 1}, stride[4] = {0, 0, 0, 0};
  const size_t pad = 4 - a.ndim();
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[pad + i] = int64_t(a.shape(i));
    stride[pad + i] = a.stride(i);
  }
  size_t n = 0;
  for (int64_t i0 = 0; i0 < shape[0]; ++i0)
    for (int64_t i1 = 0; i1 < shape[1]; ++i1)
      for (int64_t i2 = 0; i2 < shape[2]; ++i2)
        for (int64_t i3 = 0; i3 < shape[3]; ++i3)
          f(n++, i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3]);
}

std::vector<double> gather(const InArray& a) {
  std::vector<double> out(a.size());
  const double* base = static_cast<const double*>(data_of(a));
  for_each_offset(a, [&](size_t n, int64_t off) { out[n] = base[off]; });
  return out;
}

void scatter(const std::vector<double>& values, const OutArray& a) {
  double* base = static_cast<double*>(data_of(a));
  for_each_offset(a, [&](size_t n, int64_t off) { base[off] = values[n]; });
}

// The oracle checks little itself (it trusts its caller), so the binding
// applies the public rules that matter for it before touching any output.
gqattn::Problem oracle_problem(const InArray& q, const InArray& k, const InArray& v, bool causal,
                               int64_t window, float softcap, std::optional<float> scale,
                               std::optional<int64_t> q_start) {
  require_f64_host("q", q.dtype(), q.device_type());
  require_f64_host("k", k.dtype(), k.device_type());
  require_f64_host("v", v.dtype(), v.device_type());
  const gqattn::Problem p = make_problem(q, k, causal, window, softcap, scale, q_start);
  // explain() runs the library's problem validation (sizes, H % Hkv, window,
  // softcap, scale) without tensors; its reason is the library's message.
  const gqattn::Explanation e =
      gqattn::explain(p, gqattn::DType::f32, gqattn::Device::cpu, gqattn::Backend::Cpu);
  if (!e.supported) throw gqattn::Error("problem", e.reason);
  // Tk and Hkv come from k; its B and d must be q's (the oracle reads packed
  // vectors, so a k of the same element count would be reinterpreted).
  require_shape("k", k, {p.B, p.Tk, p.Hkv, p.d}, "[B, Tk, Hkv, d]");
  require_shape("v", v, {p.B, p.Tk, p.Hkv, p.d}, "[B, Tk, Hkv, d]");
  return p;
}

void oracle_forward(const InArray& q, const InArray& k, const InArray& v, const OutArray& o,
                    const OutArray& lse, bool causal, int64_t window, float softcap,
                    std::optional<float> scale, std::optional<int64_t> q_start) {
  const gqattn::Problem p = oracle_problem(q, k, v, causal, window, softcap, scale, q_start);
  require_f64_host("o", o.dtype(), o.device_type());
  require_f64_host("lse", lse.dtype(), lse.device_type());
  require_shape("o", o, {p.B, p.Tq, p.H, p.d}, "[B, Tq, H, d]");
  require_shape("lse", lse, {p.B, p.H, p.Tq}, "[B, H, Tq]");
  std::vector<double> Q = gather(q), K = gather(k), V = gather(v);
  gqattn::oracle::ForwardResult r;
  {
    nb::gil_scoped_release release;
    r = gqattn::oracle::forward(p, Q, K, V);
  }
  scatter(r.o, o);
  scatter(r.lse, lse);
}

void oracle_backward(const InArray& q, const InArray& k, const InArray& v, const InArray& dout,
                     const OutArray& dq, const OutArray& dk, const OutArray& dv, bool causal,
                     int64_t window, float softcap, std::optional<float> scale,
                     std::optional<int64_t> q_start) {
  const gqattn::Problem p = oracle_problem(q, k, v, causal, window, softcap, scale, q_start);
  const std::vector<int64_t> qs{p.B, p.Tq, p.H, p.d}, ks{p.B, p.Tk, p.Hkv, p.d};
  require_f64_host("do", dout.dtype(), dout.device_type());
  require_shape("do", dout, qs, "[B, Tq, H, d]");
  for (auto [name, a, shape, dims] :
       {std::tuple{"dq", &dq, &qs, "[B, Tq, H, d]"}, std::tuple{"dk", &dk, &ks, "[B, Tk, Hkv, d]"},
        std::tuple{"dv", &dv, &ks, "[B, Tk, Hkv, d]"}}) {
    require_f64_host(name, a->dtype(), a->device_type());
    require_shape(name, *a, *shape, dims);
  }
  std::vector<double> Q = gather(q), K = gather(k), V = gather(v), dO = gather(dout);
  gqattn::oracle::Gradients g;
  {
    nb::gil_scoped_release release;
    g = gqattn::oracle::backward(p, Q, K, V, dO);
  }
  scatter(g.dq, dq);
  scatter(g.dk, dk);
  scatter(g.dv, dv);
}

// The varlen oracle trusts its layout, so the binding checks the offsets'
// public rules first (host int32 vectors; docs/semantics.md, "Variable-length
// batches"), in the library's words.
std::vector<int32_t> checked_offsets(const std::string& name, const InArray& a, int64_t size,
                                     int64_t total, int64_t longest) {
  const gqattn::OffsetsRef ref = to_offsets(name, a);
  if (ref.device != gqattn::Device::cpu)
    throw gqattn::Error(name + ".device", "must be host (CPU) memory (the oracle runs on the CPU)");
  if (ref.size != size)
    throw gqattn::Error(
        name + ".size = " + std::to_string(ref.size),
        "must be " + std::to_string(size) + " (B + 1 for cu_seqlens, B for seqused_k)");
  std::vector<int32_t> v(ref.data, ref.data + ref.size);
  if (total < 0) return v;  // seqused_k: bounded per sequence by the caller
  if (v.front() != 0) throw gqattn::Error(name + "[0] = " + std::to_string(v.front()), "must be 0");
  for (size_t b = 0; b + 1 < v.size(); ++b) {
    if (v[b + 1] < v[b])
      throw gqattn::Error(name + "[" + std::to_string(b + 1) + "] = " + std::to_string(v[b + 1]),
                          "must be >= " + name + "[" + std::to_string(b) + "]");
    if (v[b + 1] - v[b] > longest)
      throw gqattn::Error(name + " sequence " + std::to_string(b),
                          "is longer than the max_seqlen given, " + std::to_string(longest));
  }
  if (v.back() != total)
    throw gqattn::Error(name + "[B] = " + std::to_string(v.back()),
                        "must equal the packed rows, " + std::to_string(total));
  return v;
}

gqattn::oracle::VarlenLayout oracle_layout(const gqattn::Problem& p, const InArray& q,
                                           const InArray& k, const InArray& cu_seqlens_q,
                                           const InArray& cu_seqlens_k,
                                           const std::optional<InArray>& seqused_k) {
  gqattn::oracle::VarlenLayout layout;
  layout.cu_seqlens_q =
      checked_offsets("cu_seqlens_q", cu_seqlens_q, p.B + 1, int64_t(q.shape(0)), p.Tq);
  layout.cu_seqlens_k =
      checked_offsets("cu_seqlens_k", cu_seqlens_k, p.B + 1, int64_t(k.shape(0)), p.Tk);
  if (seqused_k) {
    layout.seqused_k = checked_offsets("seqused_k", *seqused_k, p.B, -1, 0);
    for (int64_t b = 0; b < p.B; ++b) {
      const int32_t keys = layout.cu_seqlens_k[size_t(b) + 1] - layout.cu_seqlens_k[size_t(b)];
      const int32_t used = layout.seqused_k[size_t(b)];
      if (used < 0 || used > keys)
        throw gqattn::Error("seqused_k[" + std::to_string(b) + "] = " + std::to_string(used),
                            "must be in [0, " + std::to_string(keys) + "] (the keys of sequence " +
                                std::to_string(b) + ")");
    }
  }
  return layout;
}

gqattn::Problem oracle_varlen_problem(const InArray& q, const InArray& k, const InArray& v,
                                      const InArray& cu_seqlens_q, int64_t max_seqlen_q,
                                      int64_t max_seqlen_k, bool causal, int64_t window,
                                      float softcap, std::optional<float> scale,
                                      std::optional<int64_t> q_start) {
  require_f64_host("q", q.dtype(), q.device_type());
  require_f64_host("k", k.dtype(), k.device_type());
  require_f64_host("v", v.dtype(), v.device_type());
  const gqattn::Problem p = make_varlen_problem(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
                                                causal, window, softcap, scale, q_start);
  // The problem's own rules (sizes, H % Hkv, window, softcap, scale), those
  // of a dense problem of the longest lengths: whether the CPU backend runs
  // varlen batches does not concern the oracle.
  gqattn::Problem dense = p;
  dense.varlen = false;
  const gqattn::Explanation e =
      gqattn::explain(dense, gqattn::DType::f32, gqattn::Device::cpu, gqattn::Backend::Cpu);
  if (!e.supported) throw gqattn::Error("problem", e.reason);
  require_shape("k", k, {int64_t(k.shape(0)), p.Hkv, p.d}, "[total_k, Hkv, d]");
  require_shape("v", v, {int64_t(k.shape(0)), p.Hkv, p.d}, "[total_k, Hkv, d]");
  return p;
}

void oracle_forward_varlen(const InArray& q, const InArray& k, const InArray& v, const OutArray& o,
                           const OutArray& lse, const InArray& cu_seqlens_q,
                           const InArray& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                           const std::optional<InArray>& seqused_k, bool causal, int64_t window,
                           float softcap, std::optional<float> scale,
                           std::optional<int64_t> q_start) {
  const gqattn::Problem p = oracle_varlen_problem(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
                                                  causal, window, softcap, scale, q_start);
  const gqattn::oracle::VarlenLayout layout =
      oracle_layout(p, q, k, cu_seqlens_q, cu_seqlens_k, seqused_k);
  const int64_t total_q = int64_t(q.shape(0));
  require_f64_host("o", o.dtype(), o.device_type());
  require_f64_host("lse", lse.dtype(), lse.device_type());
  require_shape("o", o, {total_q, p.H, p.d}, "[total_q, H, d]");
  require_shape("lse", lse, {p.H, total_q}, "[H, total_q]");
  std::vector<double> Q = gather(q), K = gather(k), V = gather(v);
  gqattn::oracle::ForwardResult r;
  {
    nb::gil_scoped_release release;
    r = gqattn::oracle::forward_varlen(p, layout, Q, K, V);
  }
  scatter(r.o, o);
  scatter(r.lse, lse);
}

void oracle_backward_varlen(const InArray& q, const InArray& k, const InArray& v,
                            const InArray& dout, const OutArray& dq, const OutArray& dk,
                            const OutArray& dv, const InArray& cu_seqlens_q,
                            const InArray& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                            const std::optional<InArray>& seqused_k, bool causal, int64_t window,
                            float softcap, std::optional<float> scale,
                            std::optional<int64_t> q_start) {
  const gqattn::Problem p = oracle_varlen_problem(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
                                                  causal, window, softcap, scale, q_start);
  const gqattn::oracle::VarlenLayout layout =
      oracle_layout(p, q, k, cu_seqlens_q, cu_seqlens_k, seqused_k);
  const std::vector<int64_t> qs{int64_t(q.shape(0)), p.H, p.d}, ks{int64_t(k.shape(0)), p.Hkv, p.d};
  require_f64_host("do", dout.dtype(), dout.device_type());
  require_shape("do", dout, qs, "[total_q, H, d]");
  for (auto [name, a, shape, dims] : {std::tuple{"dq", &dq, &qs, "[total_q, H, d]"},
                                      std::tuple{"dk", &dk, &ks, "[total_k, Hkv, d]"},
                                      std::tuple{"dv", &dv, &ks, "[total_k, Hkv, d]"}}) {
    require_f64_host(name, a->dtype(), a->device_type());
    require_shape(name, *a, *shape, dims);
  }
  std::vector<double> Q = gather(q), K = gather(k), V = gather(v), dO = gather(dout);
  gqattn::oracle::Gradients g;
  {
    nb::gil_scoped_release release;
    g = gqattn::oracle::backward_varlen(p, layout, Q, K, V, dO);
  }
  scatter(g.dq, dq);
  scatter(g.dk, dk);
  scatter(g.dv, dv);
}

// ---- introspection ---------------------------------------------------------

gqattn::DType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "f32") return gqattn::DType::f32;
  if (name == "bfloat16" || name == "bf16") return gqattn::DType::bf16;
  if (name == "float16" || name == "f16") return gqattn::DType::f16;
  throw gqattn::Error("dtype = '" + name + "'", "must be float32, bfloat16 or float16");
}

gqattn::Device parse_device(const std::string& name) {
  if (name == "cpu") return gqattn::Device::cpu;
  if (name == "cuda") return gqattn::Device::cuda;
  throw gqattn::Error("device = '" + name + "'", "must be 'cpu' or 'cuda'");
}

nb::dict explain(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t d, bool causal,
                 int64_t window, float softcap, std::optional<float> scale,
                 const std::string& dtype, const std::string& device, const std::string& backend,
                 bool backward, bool deterministic) {
  gqattn::Problem p = gqattn::make_problem(B, Tq, Tk, H, Hkv, d, causal, window, softcap);
  p.scale = scale;
  gqattn::Options options;
  options.deterministic = deterministic;
  const gqattn::Explanation e =
      gqattn::explain(p, parse_dtype(dtype), parse_device(device), gqattn::parse_backend(backend),
                      backward ? gqattn::Pass::backward : gqattn::Pass::forward, options);
  nb::dict out;
  out["supported"] = e.supported;
  out["chosen"] = gqattn::backend_name(e.chosen);
  out["reason"] = e.reason;
  out["plan"] = e.plan;
  return out;
}

nb::list backend_status() {
  nb::list out;
  for (const gqattn::BackendStatus& s : gqattn::backend_status()) {
    nb::dict d;
    d["backend"] = gqattn::backend_name(s.backend);
    d["compiled"] = s.compiled;
    d["available"] = s.available;
    d["reason"] = s.reason;
    out.append(d);
  }
  return out;
}

nb::dict build_info() {
  const gqattn::BuildInfo b = gqattn::build_info();
  nb::dict out;
  out["version"] = b.version;
  out["cuda_compiled"] = b.cuda_compiled;
  out["cuda_architectures"] = b.cuda_architectures;
  out["cuda_runtime"] = b.cuda_runtime;
  return out;
}

nb::dict cuda_devices() {
  std::string why_none;
  nb::list devices;
  for (const gqattn::CudaDeviceInfo& c : gqattn::cuda_devices(&why_none)) {
    nb::dict d;
    d["index"] = c.index;
    d["name"] = c.name;
    d["compute_capability"] = nb::make_tuple(c.cc_major, c.cc_minor);
    d["multiprocessors"] = c.multiprocessors;
    d["memory_bytes"] = c.memory_bytes;
    devices.append(d);
  }
  nb::dict out;
  out["devices"] = devices;
  out["why_none"] = why_none;
  return out;
}

// gqattn::Error -> gqattn.Error(message), with .argument and .rule set as the
// C++ error's, so Python callers can branch on them without parsing.
void translate_error(const std::exception_ptr& p, void* payload) {
  try {
    std::rethrow_exception(p);
  } catch (const gqattn::Error& e) {
    PyObject* type = static_cast<PyObject*>(payload);
    nb::object message = nb::str(e.what());
    nb::object exc = nb::steal(PyObject_CallFunctionObjArgs(type, message.ptr(), nullptr));
    if (!exc.is_valid()) return;  // constructing it raised; that error stays set
    nb::setattr(exc, "argument", nb::str(e.argument().c_str()));
    nb::setattr(exc, "rule", nb::str(e.rule().c_str()));
    PyErr_SetObject(type, exc.ptr());
  }
}

const char* kForwardDoc = R"(forward(q, k, v, o, lse=None, *, causal=False, window=0, softcap=0.0,
        scale=None, q_start=None, backend="auto", deterministic=True, stream=0,
        num_threads=0)

Attention forward into caller-provided outputs, zero-copy.
q, o: [B, Tq, H, d]; k, v: [B, Tk, Hkv, d]; lse: [B, H, Tq] float32 or None
(not written). Any DLPack array (numpy on the CPU, torch/cupy on CUDA);
float32, bfloat16 or float16; last dimension contiguous, other strides free.
window counts the keys kept per query, self included (0 = none); softcap > 0
caps scores as softcap * tanh(s / softcap); scale defaults to 1/sqrt(d).
q_start: query i sits at key position q_start + i (None = Tk - Tq, bottom-right);
causal keeps keys j <= q_start + i, the window j >= q_start + i - window + 1.
backend: "auto", "cpu-flash", "cpu" (the mirror), "cuda-unfused", "cuda-flash" or
"cuda-hopper".
stream: a cudaStream_t as an integer (0 = default stream).
num_threads: threads of the CPU backend (0 = all hardware threads).
Raises gqattn.Error (a ValueError) naming the argument; nothing is written then.)";

const char* kBackwardDoc = R"(backward(q, k, v, o, lse, do, dq, dk, dv, *, causal=False, window=0,
         softcap=0.0, scale=None, q_start=None, backend="auto", deterministic=True, stream=0,
         num_threads=0)

Gradients dq, dk, dv (overwritten, not accumulated) from forward's o and lse
and the gradient do of o. Same tensor rules and options as forward.)";

const char* kForwardVarlenDoc = R"(forward_varlen(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, *,
               max_seqlen_q, max_seqlen_k, seqused_k=None, causal=False, window=0,
               softcap=0.0, scale=None, q_start=None, backend="auto", deterministic=True,
               stream=0, num_threads=0, check_offsets=True)

forward over a packed variable-length batch of B sequences: q, o
[total_q, H, d]; k, v [total_k, Hkv, d]; lse [H, total_q] float32 or None.
cu_seqlens_q, cu_seqlens_k: int32 [B + 1] on the tensors' device (sequence b
owns rows cu[b] .. cu[b+1] - 1); seqused_k: int32 [B] or None (sequence b
uses only its first seqused_k[b] keys). max_seqlen_q/k bound every sequence.
Each sequence is the dense problem of its own lengths (q_start None: its own
Tk_b - Tq_b). check_offsets=False skips copying CUDA offsets to the host to
check them (needed under CUDA graph capture); host offsets are always checked.)";

const char* kBackwardVarlenDoc = R"(backward_varlen(q, k, v, o, lse, do, dq, dk, dv, cu_seqlens_q,
                cu_seqlens_k, *, max_seqlen_q, max_seqlen_k, seqused_k=None, ...)

Gradients of a packed variable-length batch (forward_varlen's layout and
options); key rows no query uses (past seqused_k) get dk = dv = 0.)";

}  // namespace

// KV-cache functions, in ext_kv_cache.cpp.
void bind_kv_cache(nb::module_& m);

NB_MODULE(_ext, m) {
  m.doc() = "gqattn's native binding; use the gqattn package (and gqattn.torch) instead.";

  PyObject* error_type = PyErr_NewExceptionWithDoc(
      "gqattn.Error",
      "An argument broke one of gqattn's rules. The message names the argument and "
      "the rule; .argument holds the argument (e.g. 'q.shape = [...]') and .rule the rule. "
      "Nothing was written.",
      PyExc_ValueError, nullptr);
  if (error_type == nullptr) throw nb::python_error();
  m.attr("Error") = nb::steal(error_type);
  nb::register_exception_translator(translate_error, error_type);

  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none() = nb::none(), nb::kw_only(),
        "causal"_a = false, "window"_a = 0, "softcap"_a = 0.0f, "scale"_a.none() = nb::none(),
        "q_start"_a.none() = nb::none(), "backend"_a = "auto", "deterministic"_a = true,
        "stream"_a = 0, "num_threads"_a = 0, kForwardDoc);
  m.def("backward", &backward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "do"_a, "dq"_a, "dk"_a, "dv"_a,
        nb::kw_only(), "causal"_a = false, "window"_a = 0, "softcap"_a = 0.0f,
        "scale"_a.none() = nb::none(), "q_start"_a.none() = nb::none(), "backend"_a = "auto",
        "deterministic"_a = true, "stream"_a = 0, "num_threads"_a = 0, kBackwardDoc);
  m.def("forward_varlen", &forward_varlen, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(),
        "cu_seqlens_q"_a, "cu_seqlens_k"_a, nb::kw_only(), "max_seqlen_q"_a, "max_seqlen_k"_a,
        "seqused_k"_a.none() = nb::none(), "causal"_a = false, "window"_a = 0, "softcap"_a = 0.0f,
        "scale"_a.none() = nb::none(), "q_start"_a.none() = nb::none(), "backend"_a = "auto",
        "deterministic"_a = true, "stream"_a = 0, "num_threads"_a = 0, "check_offsets"_a = true,
        kForwardVarlenDoc);
  m.def("backward_varlen", &backward_varlen, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "do"_a, "dq"_a,
        "dk"_a, "dv"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, nb::kw_only(), "max_seqlen_q"_a,
        "max_seqlen_k"_a, "seqused_k"_a.none() = nb::none(), "causal"_a = false, "window"_a = 0,
        "softcap"_a = 0.0f, "scale"_a.none() = nb::none(), "q_start"_a.none() = nb::none(),
        "backend"_a = "auto", "deterministic"_a = true, "stream"_a = 0, "num_threads"_a = 0,
        "check_offsets"_a = true, kBackwardVarlenDoc);
  m.def("oracle_forward", &oracle_forward, "q"_a, "k"_a, "v"_a, "o"_a.noconvert(),
        "lse"_a.noconvert(), nb::kw_only(), "causal"_a = false, "window"_a = 0, "softcap"_a = 0.0f,
        "scale"_a.none() = nb::none(), "q_start"_a.none() = nb::none(),
        "The f64 oracle's forward into float64 host arrays o [B, Tq, H, d] and lse [B, H, Tq].");
  m.def("oracle_backward", &oracle_backward, "q"_a, "k"_a, "v"_a, "do"_a, "dq"_a.noconvert(),
        "dk"_a.noconvert(), "dv"_a.noconvert(), nb::kw_only(), "causal"_a = false, "window"_a = 0,
        "softcap"_a = 0.0f, "scale"_a.none() = nb::none(), "q_start"_a.none() = nb::none(),
        "The f64 oracle's gradients into float64 host arrays (it recomputes the forward).");
  m.def("oracle_forward_varlen", &oracle_forward_varlen, "q"_a, "k"_a, "v"_a, "o"_a.noconvert(),
        "lse"_a.noconvert(), "cu_seqlens_q"_a, "cu_seqlens_k"_a, nb::kw_only(), "max_seqlen_q"_a,
        "max_seqlen_k"_a, "seqused_k"_a.none() = nb::none(), "causal"_a = false, "window"_a = 0,
        "softcap"_a = 0.0f, "scale"_a.none() = nb::none(), "q_start"_a.none() = nb::none(),
        "The f64 oracle's varlen forward into float64 host arrays o [total_q, H, d] and lse "
        "[H, total_q].");
  m.def("oracle_backward_varlen", &oracle_backward_varlen, "q"_a, "k"_a, "v"_a, "do"_a,
        "dq"_a.noconvert(), "dk"_a.noconvert(), "dv"_a.noconvert(), "cu_seqlens_q"_a,
        "cu_seqlens_k"_a, nb::kw_only(), "max_seqlen_q"_a, "max_seqlen_k"_a,
        "seqused_k"_a.none() = nb::none(), "causal"_a = false, "window"_a = 0, "softcap"_a = 0.0f,
        "scale"_a.none() = nb::none(), "q_start"_a.none() = nb::none(),
        "The f64 oracle's varlen gradients into float64 host arrays.");
  m.def("explain", &explain, "B"_a, "Tq"_a, "Tk"_a, "H"_a, "Hkv"_a, "d"_a, nb::kw_only(),
        "causal"_a = false, "window"_a = 0, "softcap"_a = 0.0f, "scale"_a.none() = nb::none(),
        "dtype"_a = "bfloat16", "device"_a = "cuda", "backend"_a = "auto", "backward"_a = false,
        "deterministic"_a = true,
        "Whether `backend` can run the problem's forward (or, with backward=True, its "
        "backward): {'supported', 'chosen', 'reason'}.");
  m.def("backend_status", &backend_status,
        "Every backend: {'backend', 'compiled', 'available', 'reason'}.");
  m.def("build_info", &build_info,
        "{'version', 'cuda_compiled', 'cuda_architectures', 'cuda_runtime'}.");
  m.def("cuda_devices", &cuda_devices,
        "CUDA devices visible now: {'devices': [...], 'why_none': str}.");
  m.def("release_workspace_memory", &gqattn::release_workspace_memory,
        "Return the CUDA backends' retained workspace (up to 1 GiB per device, kept mapped "
        "for reuse; PyTorch's caching allocator does not see it) to the driver. Workspace of "
        "calls the host has not yet seen complete (no stream, event or device "
        "synchronisation) may stay. A no-op without CUDA or before any CUDA call; later "
        "calls fill the pools again. Raises gqattn.Error if the CUDA runtime fails.");
  bind_kv_cache(m);
}
