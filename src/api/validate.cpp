// Validation rules for gqattn's public arguments; see validate.hpp.
#include "api/validate.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "gqattn/dtype.hpp"
#include "gqattn/error.hpp"

namespace gqattn::detail {
namespace {

std::string str(int64_t x) { return std::to_string(x); }

const char* device_name(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

void require_positive(const char* name, int64_t value) {
  if (value < 1) throw Error(std::string(name) + " = " + str(value), "must be >= 1");
}

// Elements addressed by a tensor of this shape and stride, or -1 if that
// count would overflow int64.
int64_t span_elements(const TensorRef& t) {
  int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] - 1 > 0 && t.stride[i] > std::numeric_limits<int64_t>::max() / (t.shape[i] - 1))
      return -1;
    const int64_t extent = (t.shape[i] - 1) * t.stride[i];
    if (last > std::numeric_limits<int64_t>::max() - extent) return -1;
    last += extent;
  }
  return last + 1;
}

}  // namespace

const char* role_name(Role role) {
  switch (role) {
    case Role::q: return "q";
    case Role::k: return "k";
    case Role::v: return "v";
    case Role::o: return "o";
    case Role::lse: return "lse";
    case Role::dout: return "do";
    case Role::dq: return "dq";
    case Role::dk: return "dk";
    case Role::dv: return "dv";
  }
  return "?";
}

void validate_problem(const Problem& p) {
  require_positive("B", p.B);
  require_positive("Tq", p.Tq);
  require_positive("Tk", p.Tk);
  require_positive("H", p.H);
  require_positive("Hkv", p.Hkv);
  require_positive("d", p.d);
  if (p.H % p.Hkv != 0)
    throw Error("H = " + str(p.H), "must be a multiple of Hkv = " + str(p.Hkv) +
                                       " (each kv head serves H / Hkv query heads)");
  if (p.window < 0)
    throw Error("window = " + str(p.window),
                "must be >= 0 (keys kept per query, self included; 0 = no window)");
  if (!std::isfinite(p.softcap) || p.softcap < 0.0f)
    throw Error("softcap = " + std::to_string(p.softcap), "must be finite and >= 0 (0 = off)");
  if (p.scale && (!std::isfinite(*p.scale) || *p.scale <= 0.0f))
    throw Error("scale = " + std::to_string(*p.scale),
                "must be finite and > 0 (leave unset for 1/sqrt(d))");
  // Index arithmetic in every backend is int64; keep each tensor well inside it.
  const int64_t limit = int64_t{1} << 53;
  const double q_elems = double(p.B) * double(p.Tq) * double(p.H) * double(p.d);
  const double k_elems = double(p.B) * double(p.Tk) * double(p.Hkv) * double(p.d);
  if (q_elems > double(limit) || k_elems > double(limit))
    throw Error("B*T*H*d", "tensor too large (more than 2^53 elements)");
}

void validate_tensor(const Problem& p, Role role, const TensorRef& t, DType io_dtype, Device device,
                     bool required) {
  const std::string name = role_name(role);
  if (t.data == nullptr) {
    if (!required) return;
    throw Error(name, "data is a null pointer");
  }
  int64_t expect[4] = {0, 0, 0, 0};
  int rank = 4;
  const char* dims = "";
  switch (role) {
    case Role::q:
    case Role::o:
    case Role::dout:
    case Role::dq:
      expect[0] = p.B;
      expect[1] = p.Tq;
      expect[2] = p.H;
      expect[3] = p.d;
      dims = "[B, Tq, H, d]";
      break;
    case Role::k:
    case Role::v:
    case Role::dk:
    case Role::dv:
      expect[0] = p.B;
      expect[1] = p.Tk;
      expect[2] = p.Hkv;
      expect[3] = p.d;
      dims = "[B, Tk, Hkv, d]";
      break;
    case Role::lse:
      rank = 3;
      expect[0] = p.B;
      expect[1] = p.H;
      expect[2] = p.Tq;
      dims = "[B, H, Tq]";
      break;
  }
  auto shape_str = [](const int64_t* s, int r) {
    std::string out = "[";
    for (int i = 0; i < r; ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  if (t.rank != rank)
    throw Error(name + ".rank = " + std::to_string(t.rank),
                "must be " + std::to_string(rank) + " (shape " + dims + ")");
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] != expect[i])
      throw Error(name + ".shape = " + shape_str(t.shape, rank),
                  std::string("must be ") + dims + " = " + shape_str(expect, rank));
  }
  const DType want = role == Role::lse ? DType::f32 : io_dtype;
  if (t.dtype != want)
    throw Error(name + ".dtype = " + dtype_name(t.dtype),
                std::string("must be ") + dtype_name(want) +
                    (role == Role::lse ? " (lse is always f32)" : " (the dtype of q)"));
  if (t.device != device)
    throw Error(name + ".device = " + device_name(t.device),
                std::string("must be ") + device_name(device) + " (where q lives)");
  if (t.stride[rank - 1] != 1)
    throw Error(
        name + ".stride[" + std::to_string(rank - 1) + "] = " + std::to_string(t.stride[rank - 1]),
        "the last dimension must be contiguous (stride 1)");
  for (int i = 0; i < rank - 1; ++i) {
    if (t.stride[i] < 0)
      throw Error(name + ".stride[" + std::to_string(i) + "] = " + std::to_string(t.stride[i]),
                  "strides must be >= 0");
  }
  const bool output = role == Role::o || role == Role::lse || role == Role::dq ||
                      role == Role::dk || role == Role::dv;
  for (int i = 0; output && i < rank - 1; ++i) {
    if (t.stride[i] == 0 && t.shape[i] > 1)
      throw Error(name + ".stride[" + std::to_string(i) + "] = 0",
                  "an output may not repeat elements (stride 0 on a dimension of size > 1)");
  }
  if (span_elements(t) < 0) throw Error(name + ".stride", "addressed span overflows int64");
  const std::size_t elem = dtype_size(t.dtype);
  if (reinterpret_cast<std::uintptr_t>(t.data) % elem != 0)
    throw Error(name + ".data",
                "pointer is not aligned to its element size (" + std::to_string(elem) + " bytes)");
}

}  // namespace gqattn::detail
