// Validation rules for gqattn's public arguments; see validate.hpp.
#include "api/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

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
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return 0;  // a packed tensor of no rows
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

// Bytes from a tensor's first element to the end of its last, or -1 if that
// count overflows int64 (a stride of INT64_MAX / 2 fits as elements but not
// as bytes).
int64_t span_bytes(const TensorRef& t) {
  const int64_t elements = span_elements(t);
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  if (elements < 0 || elements > std::numeric_limits<int64_t>::max() / elem) return -1;
  return elements * elem;
}

struct ByteRange {
  std::uintptr_t first, last;  // inclusive
};
ByteRange byte_range(const TensorRef& t) {
  const auto first = reinterpret_cast<std::uintptr_t>(t.data);
  return {first, first + static_cast<std::uintptr_t>(span_bytes(t)) - 1};
}

std::string shape_str(const int64_t* s, int r) {
  std::string out = "[";
  for (int i = 0; i < r; ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Whether two distinct index tuples of t can address the same element.
// Sufficient and, for the layouts people build (every stride at least the
// extent of the dimensions inside it), exact: order the dimensions of size
// > 1 by stride; each stride must exceed the furthest element the smaller
// ones reach.
bool overlaps_itself(const TensorRef& t) {
  if (span_elements(t) == 0) return false;  // no element (a packed tensor of no rows)
  int order[4];
  int n = 0;
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] > 1) order[n++] = i;
  auto before = [&](int a, int b) {
    return t.stride[a] != t.stride[b] ? t.stride[a] < t.stride[b] : a > b;
  };
  for (int x = 1; x < n; ++x)  // insertion sort of at most 4
    for (int y = x; y > 0 && before(order[y], order[y - 1]); --y) std::swap(order[y], order[y - 1]);
  int64_t reach = 0;  // furthest offset the inner dimensions address
  for (int x = 0; x < n; ++x) {
    const int i = order[x];
    if (t.stride[i] <= reach) return true;
    reach += (t.shape[i] - 1) * t.stride[i];  // span_elements bounded it
  }
  return false;
}

// A tensor's bytes as nested blocks: dims of size > 1 and stride != 0,
// outermost (largest stride) first, strides in bytes; each innermost unit is
// one row of `row` contiguous bytes (the last dimension).
struct Block {
  std::uintptr_t base = 0;
  int n = 0;
  int64_t shape[3] = {1, 1, 1};
  int64_t stride[3] = {0, 0, 0};
  int64_t row = 0;
  int64_t reach() const {  // bytes from base to the end of the last row
    int64_t r = row;
    for (int x = 0; x < n; ++x) r += (shape[x] - 1) * stride[x];
    return r;
  }
  Block inner(int64_t index) const {
    Block b = *this;
    b.base = base + static_cast<std::uintptr_t>(index * stride[0]);
    for (int x = 1; x < n; ++x) {
      b.shape[x - 1] = shape[x];
      b.stride[x - 1] = stride[x];
    }
    --b.n;
    return b;
  }
};

Block block_of(const TensorRef& t) {
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  Block b;
  b.base = reinterpret_cast<std::uintptr_t>(t.data);
  b.row = t.shape[t.rank - 1] * elem;
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] < 2 || t.stride[i] == 0) continue;  // one address along it
    int x = b.n++;
    for (; x > 0 && b.stride[x - 1] < t.stride[i] * elem; --x) {
      b.shape[x] = b.shape[x - 1];
      b.stride[x] = b.stride[x - 1];
    }
    b.shape[x] = t.shape[i];
    b.stride[x] = t.stride[i] * elem;
  }
  return b;
}

// Whether blocks a and b share a byte. Splits the one that reaches further
// along its outermost dimension, visiting only the indices whose sub-block
// meets the other's byte range, so interleaved views of one buffer (dq, dk,
// dv in one packed gradient) cost about one step per pair of neighbouring
// rows. Past `budget` steps it answers true (refuses) rather than run on.
bool share_a_byte(const Block& a, const Block& b, int64_t& budget) {
  if (--budget < 0) return true;
  const auto a_end = a.base + static_cast<std::uintptr_t>(a.reach());
  const auto b_end = b.base + static_cast<std::uintptr_t>(b.reach());
  if (a_end <= b.base || b_end <= a.base) return false;
  if (a.n == 0 && b.n == 0) return true;  // two rows whose bytes meet
  const bool split_a = a.n > 0 && (b.n == 0 || a.reach() >= b.reach());
  const Block& big = split_a ? a : b;
  const Block& other = split_a ? b : a;
  const int64_t s = big.stride[0], inner_reach = big.inner(0).reach();
  // Indices i with [big.base + i s, + inner_reach) meeting other's bytes.
  // Both ranges meet, so the offsets below are within the spans validated.
  const int64_t lo = other.base >= big.base ? static_cast<int64_t>(other.base - big.base)
                                            : -static_cast<int64_t>(big.base - other.base);
  const int64_t hi = lo + other.reach();  // exclusive
  const int64_t first = lo - inner_reach + 1 <= 0 ? 0 : (lo - inner_reach + s) / s;
  const int64_t last = std::min((hi - 1) / s, big.shape[0] - 1);
  for (int64_t i = first; i <= last; ++i)
    if (share_a_byte(big.inner(i), other, budget)) return true;
  return false;
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
  if (p.q_start && (*p.q_start > limit || *p.q_start < -limit))
    throw Error("q_start = " + str(*p.q_start), "must be within [-2^53, 2^53]");
  const double q_elems = double(p.B) * double(p.Tq) * double(p.H) * double(p.d);
  const double k_elems = double(p.B) * double(p.Tk) * double(p.Hkv) * double(p.d);
  if (q_elems > double(limit) || k_elems > double(limit))
    throw Error("B*T*H*d", "tensor too large (more than 2^53 elements)");
}

void validate_tensor(const Problem& p, Role role, const TensorRef& t, DType io_dtype, Device device,
                     bool required, const PackedTotals& totals, const char* name_override) {
  const std::string name = name_override ? name_override : role_name(role);
  if (t.data == nullptr && !required) return;
  int64_t expect[4] = {0, 0, 0, 0};
  int rank = 4;
  const char* dims = "";
  if (p.varlen) {
    rank = 3;
    switch (role) {
      case Role::q:
      case Role::o:
      case Role::dout:
      case Role::dq:
        expect[0] = role == Role::q ? t.shape[0] : totals.q;
        expect[1] = p.H;
        expect[2] = p.d;
        dims = "[total_q, H, d]";
        break;
      case Role::k:
      case Role::v:
      case Role::dk:
      case Role::dv:
        expect[0] = role == Role::k ? t.shape[0] : totals.k;
        expect[1] = p.Hkv;
        expect[2] = p.d;
        dims = "[total_k, Hkv, d]";
        break;
      case Role::lse:
        rank = 2;
        expect[0] = p.H;
        expect[1] = totals.q;
        dims = "[H, total_q]";
        break;
    }
    if ((role == Role::q || role == Role::k) && t.rank == rank &&
        (t.shape[0] < 0 || t.shape[0] >= (int64_t{1} << 31)))
      throw Error(name + ".shape[0] = " + str(t.shape[0]),
                  "the packed rows must be in [0, 2^31) (int32 sequence offsets)");
  } else {
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
  }
  if (t.rank != rank)
    throw Error(name + ".rank = " + std::to_string(t.rank),
                "must be " + std::to_string(rank) + " (shape " + dims + ")");
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] != expect[i])
      throw Error(name + ".shape = " + shape_str(t.shape, rank),
                  std::string("must be ") + dims + " = " + shape_str(expect, rank));
  }
  if (t.data == nullptr) {
    // A packed tensor with no element (every sequence empty) may have none.
    bool empty = false;
    for (int i = 0; i < rank; ++i) empty = empty || t.shape[i] == 0;
    if (p.varlen && empty) return;
    throw Error(name, "data is a null pointer");
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
  if (span_bytes(t) < 0)
    throw Error(name + ".stride = " + shape_str(t.stride, rank),
                "the bytes the tensor spans overflow int64");
  if (reinterpret_cast<std::uintptr_t>(t.data) >
      std::numeric_limits<std::uintptr_t>::max() - static_cast<std::uintptr_t>(span_bytes(t)))
    throw Error(name + ".data", "the tensor's span runs past the end of the address space");
  if (output && overlaps_itself(t))
    throw Error(name + ".stride = " + shape_str(t.stride, rank),
                "an output's elements must not overlap each other (shape " +
                    shape_str(t.shape, rank) + ": two indices address the same element)");
  const std::size_t elem = dtype_size(t.dtype);
  if (reinterpret_cast<std::uintptr_t>(t.data) % elem != 0)
    throw Error(name + ".data",
                "pointer is not aligned to its element size (" + std::to_string(elem) + " bytes)");
}

void validate_no_overlap(std::initializer_list<Argument> arguments) {
  for (const Argument& out : arguments) {
    if (!out.output || out.tensor->data == nullptr || span_bytes(*out.tensor) == 0) continue;
    const ByteRange a = byte_range(*out.tensor);
    for (const Argument& other : arguments) {
      if (&other == &out || other.tensor->data == nullptr || span_bytes(*other.tensor) == 0)
        continue;
      const ByteRange b = byte_range(*other.tensor);
      if (a.first > b.last || b.first > a.last) continue;
      // The ranges meet: interleaved views of one buffer are fine as long as
      // no byte is shared.
      int64_t budget = int64_t{1} << 24;
      if (share_a_byte(block_of(*out.tensor), block_of(*other.tensor), budget))
        throw Error(out.name, std::string("must not overlap ") + other.name +
                                  " (an output may share no byte with any other argument)");
    }
  }
}

void validate_forward_memory(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                             const TensorRef& o, const TensorRef& lse) {
  validate_no_overlap(
      {{"o", &o, true}, {"lse", &lse, true}, {"q", &q, false}, {"k", &k, false}, {"v", &v, false}});
}

void validate_backward_memory(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                              const TensorRef& o, const TensorRef& lse, const TensorRef& dout,
                              const TensorRef& dq, const TensorRef& dk, const TensorRef& dv) {
  validate_no_overlap({{"dq", &dq, true},
                       {"dk", &dk, true},
                       {"dv", &dv, true},
                       {"q", &q, false},
                       {"k", &k, false},
                       {"v", &v, false},
                       {"o", &o, false},
                       {"lse", &lse, false},
                       {"do", &dout, false}});
}

}  // namespace gqattn::detail
