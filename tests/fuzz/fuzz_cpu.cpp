// gqattn_fuzz: a seeded property fuzzer over validation and the CPU backend.
// Each round draws a random problem (sizes, mask, window up to INT64_MAX,
// softcap, scale, a query offset q_start: unset, before, inside or past the
// keys, now and then at or beyond its +-2^53 limit), dense or a varlen batch
// (up to 4 sequences with lengths 0 and 1 often, bounds Tq/Tk at or above
// the longest, seqused_k now and then; host offsets), dtype, and tensors
// placed in one byte arena with random strides, padding, offsets, and now
// and then a broken argument: an output aliasing or overlapping another
// argument or itself, a wrong shape, dtype or rank, a null or misaligned
// pointer, a negative or huge stride, or (varlen) broken offsets. Then
// forward (and backward on forward's o and lse) through the public API.
// Properties, each a failure (exit 1) when broken:
//   - a call with nothing broken is accepted (empty varlen tensors, q_start
//     anywhere within +-2^53 included);
//   - a rejected call throws gqattn::Error and leaves every arena byte as
//     it was (nothing written); broken offsets are always rejected (host
//     offsets are always checked);
//   - an accepted call writes every output element, writes no byte outside
//     its outputs, and agrees with the f64 oracle on the same rounded inputs
//     (varlen: forward_varlen/backward_varlen, sequence by sequence)
//     (relative to max(1, max |ref|): f32 within 1e-4; 16-bit o within 2^-5,
//     16-bit gradients by the project's rule, check::tolerance, against the
//     f32 mirror's error on the same inputs);
//   - no crash and no sanitizer report (run it in the sanitizer build).
// usage: gqattn_fuzz [--seconds S] [--seed N] [--rounds R]; runs until S
// seconds (default 10) or R rounds have passed. scripts/test runs it under
// ASan/UBSan for 50 s; ctest for 10 s. A failure prints the seed and round.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"
#include "gqattn/oracle.hpp"

namespace {

using namespace gqattn;

struct Rng {
  std::mt19937_64 gen;
  int64_t range(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(gen) < p; }
  float normal() { return std::normal_distribution<float>(0.4f, 1.0f)(gen); }
};

// One tensor's place in the arena.
struct Slot {
  TensorRef ref;
  int64_t offset_bytes = 0;  // of element 0 in the arena
  int64_t span_bytes = 0;    // bytes from element 0 to the end of the last
  bool output = false;
};

int64_t span_of(const TensorRef& t) {
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return 0;  // an empty varlen tensor covers no byte
  int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) last += (t.shape[i] - 1) * t.stride[i];
  return (last + 1) * static_cast<int64_t>(dtype_size(t.dtype));
}

// Element offset of packed index n of t.
int64_t offset_of(const TensorRef& t, int64_t n) {
  int64_t off = 0;
  for (int a = t.rank - 1; a >= 0; --a) {
    off += (n % t.shape[a]) * t.stride[a];
    n /= t.shape[a];
  }
  return off;
}
int64_t numel(const TensorRef& t) {
  int64_t n = 1;
  for (int a = 0; a < t.rank; ++a) n *= t.shape[a];
  return n;
}

struct Round {
  Problem p;
  DType dtype = DType::f32;
  std::vector<unsigned char> arena;
  Slot q, k, v, o, lse, dout, dq, dk, dv;
  bool broken = false;  // an argument was broken on purpose
  std::string what;     // which
  // Varlen (p.varlen): the true layout (what the oracle runs), and the
  // offsets the call is given: the same, unless offsets_broken.
  oracle::VarlenLayout layout;
  oracle::VarlenLayout given;
  bool offsets_broken = false;
  int64_t given_size_q = 0, given_size_k = 0, given_size_used = 0;  // OffsetsRef::size
  bool null_cu_q = false;

  VarlenOffsets offsets() const {
    VarlenOffsets out;
    out.cu_seqlens_q = {null_cu_q ? nullptr : given.cu_seqlens_q.data(), Device::cpu, given_size_q};
    out.cu_seqlens_k = {given.cu_seqlens_k.data(), Device::cpu, given_size_k};
    if (!given.seqused_k.empty())
      out.seqused_k = {given.seqused_k.data(), Device::cpu, given_size_used};
    return out;
  }
};

// The rank a tensor of the round has when nothing is broken.
int rank_of(const Round& r, const Slot* s) {
  const bool lse = s == &r.lse;
  return r.p.varlen ? (lse ? 2 : 3) : (lse ? 3 : 4);
}

// A length in [0, max], 0 and 1 often (the edges of every sequence loop).
int64_t draw_length(Rng& rng, int64_t max) {
  switch (rng.range(0, 4)) {
    case 0: return 0;
    case 1: return std::min<int64_t>(1, max);
    case 2: return max;
    default: return rng.range(0, max);
  }
}

// A varlen batch: B, the lengths, the bounds Tq/Tk (the longest, sometimes
// more), seqused_k now and then.
void draw_varlen(Rng& rng, Round& r) {
  Problem& p = r.p;
  p.B = rng.range(1, 4);
  const int64_t max_q = rng.range(1, 12), max_k = rng.range(1, 12);
  oracle::VarlenLayout& L = r.layout;
  L.cu_seqlens_q = {0};
  L.cu_seqlens_k = {0};
  int64_t longest_q = 0, longest_k = 0;
  std::vector<int32_t> keys;
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t tq = draw_length(rng, max_q), tk = draw_length(rng, max_k);
    L.cu_seqlens_q.push_back(int32_t(L.cu_seqlens_q.back() + tq));
    L.cu_seqlens_k.push_back(int32_t(L.cu_seqlens_k.back() + tk));
    keys.push_back(int32_t(tk));
    longest_q = std::max(longest_q, tq);
    longest_k = std::max(longest_k, tk);
  }
  if (rng.chance(0.3))
    for (int32_t n : keys) L.seqused_k.push_back(int32_t(draw_length(rng, n)));
  // Tq, Tk: bounds (max_seqlen), at least 1.
  p.Tq = std::max<int64_t>(1, longest_q) + (rng.chance(0.3) ? rng.range(1, 3) : 0);
  p.Tk = std::max<int64_t>(1, longest_k) + (rng.chance(0.3) ? rng.range(1, 3) : 0);
  r.given = L;
  r.given_size_q = r.given_size_k = p.B + 1;
  r.given_size_used = p.B;
}

// Breaks one rule of the offsets (docs/semantics.md, "Variable-length
// batches"), where the layout allows it; each must be refused.
void break_offsets(Rng& rng, Round& r) {
  oracle::VarlenLayout& g = r.given;
  const int64_t B = r.p.B;
  int64_t longest_q = 0;
  for (int64_t b = 0; b < B; ++b)
    longest_q = std::max<int64_t>(longest_q, g.cu_seqlens_q[b + 1] - g.cu_seqlens_q[b]);
  r.offsets_broken = true;
  switch (rng.range(0, 6)) {
    case 0:  // does not start at 0 (the total moves with it: one rule at least)
      g.cu_seqlens_k[0] = 1;
      r.what = "cu_seqlens_k[0] != 0";
      break;
    case 1:  // does not end at the total
      g.cu_seqlens_q[B] += 1;
      r.what = "cu_seqlens_q end != total_q";
      break;
    case 2:  // decreases
      if (B >= 2 && g.cu_seqlens_k[1] > 0) {
        g.cu_seqlens_k[1] = g.cu_seqlens_k[2] + 1;
        r.what = "cu_seqlens_k decreases";
      } else {
        g.cu_seqlens_q[B] = -1;
        r.what = "cu_seqlens_q negative";
      }
      break;
    case 3:  // a sequence longer than the bound
      if (longest_q >= 2) {
        r.p.Tq = longest_q - 1;
        r.what = "sequence longer than Tq";
      } else {
        r.given_size_q = B;
        r.what = "cu_seqlens_q size";
      }
      break;
    case 4:  // seqused_k past its keys
      if (g.seqused_k.empty()) g.seqused_k.assign(std::size_t(B), 0);
      g.seqused_k[std::size_t(rng.range(0, B - 1))] = int32_t(g.cu_seqlens_k[B] + 1);
      r.what = "seqused_k past its keys";
      break;
    case 5:  // wrong size
      if (!g.seqused_k.empty()) {
        r.given_size_used = B + 1;
        r.what = "seqused_k size";
      } else {
        r.given_size_k = B + 2;
        r.what = "cu_seqlens_k size";
      }
      break;
    case 6:
      r.null_cu_q = true;
      r.what = "cu_seqlens_q null";
      break;
  }
  // Room for a size made larger than the vector.
  g.cu_seqlens_k.resize(std::size_t(B + 2), g.cu_seqlens_k.back());
  if (!g.seqused_k.empty()) g.seqused_k.resize(std::size_t(B + 1), 0);
}

// Where the queries sit: unset (each problem's or sequence's default) half
// the time, else before the keys, among them, past them, or at the limits
// of the rule (+-2^53 accepted, beyond refused: then true).
bool draw_q_start(Rng& rng, Problem& p) {
  if (rng.chance(0.5)) return false;
  const int64_t limit = int64_t{1} << 53;
  switch (rng.range(0, 5)) {
    case 0: p.q_start = rng.range(-p.Tq - 3, -1); break;
    case 1:
    case 2: p.q_start = rng.range(0, p.Tk); break;
    case 3: p.q_start = rng.range(p.Tk + 1, p.Tk + 6); break;
    case 4: p.q_start = rng.chance(0.5) ? limit : -limit; break;
    case 5:
      p.q_start = rng.chance(0.5) ? limit + 1 : std::numeric_limits<int64_t>::min();
      return true;
  }
  return false;
}

// Strides for shape with random padding and dimension order (last stride 1).
void layout(Rng& rng, TensorRef& t) {
  int order[3] = {0, 1, 2};
  const int outer = t.rank - 1;
  if (outer == 3 && rng.chance(0.3)) std::swap(order[1], order[2]);  // [B, heads, T, d]
  // Varlen [heads, total, d]; lse [B, Tq, H].
  if (outer == 2 && rng.chance(0.3)) std::swap(order[0], order[1]);
  // An empty dimension (a varlen batch without rows) still steps, as
  // PyTorch's strides do: stride 0 on a dimension of size > 1 is refused.
  int64_t stride =
      std::max<int64_t>(t.shape[t.rank - 1], 1) + (rng.chance(0.3) ? rng.range(1, 3) : 0);
  t.stride[t.rank - 1] = 1;
  for (int x = outer - 1; x >= 0; --x) {
    const int a = order[x];
    t.stride[a] = stride;
    stride = stride * std::max<int64_t>(t.shape[a], 1) + (rng.chance(0.3) ? rng.range(1, 5) : 0);
  }
}

Round make_round(Rng& rng) {
  Round r;
  Problem& p = r.p;
  p.varlen = rng.chance(0.3);
  if (p.varlen) {
    draw_varlen(rng, r);
  } else {
    p.B = rng.range(1, 2);
    p.Tq = rng.range(1, 12);
    p.Tk = rng.range(1, 12);
  }
  const bool q_start_refused = draw_q_start(rng, p);
  p.Hkv = rng.range(1, 2);
  p.H = p.Hkv * rng.range(1, 3);
  p.d = rng.range(1, 16);
  p.causal = rng.chance(0.5);
  const int64_t windows[] = {0,
                             1,
                             2,
                             3,
                             5,
                             p.Tk,
                             p.Tk + 1,
                             std::numeric_limits<int64_t>::max(),
                             std::numeric_limits<int64_t>::max() - 1,
                             int64_t{1} << 62};
  p.window = windows[rng.range(0, 9)];
  p.softcap = rng.chance(0.3) ? float(rng.range(1, 30)) : 0.0f;
  if (rng.chance(0.2)) p.scale = 0.05f * float(rng.range(1, 20));
  r.dtype = static_cast<DType>(rng.range(0, 2));

  Slot* slots[] = {&r.q, &r.k, &r.v, &r.o, &r.lse, &r.dout, &r.dq, &r.dk, &r.dv};
  for (Slot* s : slots) {
    const bool qlike = s == &r.q || s == &r.o || s == &r.dout || s == &r.dq;
    TensorRef& t = s->ref;
    t.device = Device::cpu;
    t.dtype = s == &r.lse ? DType::f32 : r.dtype;
    if (p.varlen) {
      const int64_t total_q = r.layout.cu_seqlens_q.back();
      const int64_t total_k = r.layout.cu_seqlens_k.back();
      t.rank = rank_of(r, s);
      if (s == &r.lse) {
        t.shape[0] = p.H;
        t.shape[1] = total_q;
      } else {
        t.shape[0] = qlike ? total_q : total_k;
        t.shape[1] = qlike ? p.H : p.Hkv;
        t.shape[2] = p.d;
      }
    } else if (s == &r.lse) {
      t.rank = 3;
      t.shape[0] = p.B;
      t.shape[1] = p.H;
      t.shape[2] = p.Tq;
    } else {
      t.rank = 4;
      t.shape[0] = p.B;
      t.shape[1] = qlike ? p.Tq : p.Tk;
      t.shape[2] = qlike ? p.H : p.Hkv;
      t.shape[3] = p.d;
    }
    layout(rng, t);
    s->output = s == &r.o || s == &r.lse || s == &r.dq || s == &r.dk || s == &r.dv;
  }
  // Place them one after another with random gaps (aligned to 4 bytes).
  int64_t at = 64;
  for (Slot* s : slots) {
    at += 4 * rng.range(0, 4);
    s->offset_bytes = at;
    s->span_bytes = span_of(s->ref);
    at += (s->span_bytes + 3) / 4 * 4;
  }
  // Now and then, break one thing: in a varlen batch, now and then its
  // offsets.
  if (p.varlen && rng.chance(0.12)) {
    r.broken = true;
    break_offsets(rng, r);
  } else if (rng.chance(0.35)) {
    r.broken = true;
    Slot* out =
        rng.chance(0.5) ? &r.o : (rng.chance(0.5) ? &r.dq : (rng.chance(0.5) ? &r.dk : &r.lse));
    Slot* any = slots[rng.range(0, 8)];
    switch (rng.range(0, 8)) {
      case 0:  // alias: an output on another argument's memory, shifted a little
        if (any != out) {
          out->offset_bytes =
              any->offset_bytes + 4 * rng.range(0, std::max<int64_t>(0, any->span_bytes / 4 - 1));
          r.what = "alias";
        } else {
          r.broken = false;
        }
        break;
      case 1:  // self overlap: a stride of the output made small
        if (out->ref.shape[out->ref.rank - 1] > 1 || out->ref.rank == rank_of(r, &r.lse)) {
          const int a = int(rng.range(0, out->ref.rank - 2));
          out->ref.stride[a] = rng.range(1, 2);
          r.what = "overlap";
          if (out->ref.shape[a] < 2) r.broken = false;
        } else {
          r.broken = false;
        }
        break;
      case 2:
        any->ref.shape[rng.range(0, any->ref.rank - 1)] += 1;
        r.what = "shape";
        break;
      case 3:
        any->ref.dtype = static_cast<DType>((int(any->ref.dtype) + 1) % 3);
        r.what = "dtype";
        break;
      case 4:
        any->ref.rank = any->ref.rank == 4 ? 3 : 4;  // varlen lse: 2 -> 4
        r.what = "rank";
        break;
      case 5:
        any->ref.stride[rng.range(0, any->ref.rank - 2)] = -1;
        r.what = "negative stride";
        break;
      case 6:
        // Fits as elements, overflows as bytes (a huge stride that fits in
        // both is indistinguishable from real memory: not a broken call).
        any->ref.stride[0] = std::numeric_limits<int64_t>::max() / 2 + rng.range(1, 1000);
        r.what = "huge stride";
        if (any->ref.shape[0] < 2) r.broken = false;
        break;
      case 7:
        any->offset_bytes += 1;  // misaligned for every dtype
        r.what = "misaligned";
        break;
      case 8:
        any->offset_bytes = -1;  // null pointer
        r.what = "null";
        break;
    }
    if (r.broken && r.what != "alias" && r.what != "overlap" && r.what != "misaligned" &&
        r.what != "null")
      any->span_bytes = 0;
  }
  if (q_start_refused) {
    r.broken = true;
    r.what += r.what.empty() ? "q_start out of range" : ", q_start out of range";
  }
  // Room for every tensor where it now lies (an output moved onto another
  // argument may reach past the end; a huge or negative stride is refused
  // before anything is read).
  int64_t end = at;
  for (Slot* s : slots) {
    bool sane = s->ref.rank >= 1 && s->ref.rank <= 4;
    for (int a = 0; sane && a < s->ref.rank; ++a)
      sane = s->ref.stride[a] >= 0 && s->ref.stride[a] < (int64_t{1} << 20);
    if (sane) end = std::max(end, s->offset_bytes + span_of(s->ref));
  }
  r.arena.assign(static_cast<std::size_t>(end + 64), 0);
  for (Slot* s : slots)
    s->ref.data = s->offset_bytes < 0 ? nullptr : r.arena.data() + s->offset_bytes;

  // Inputs: random values (rounded to the dtype); everything else a NaN
  // pattern, so an unwritten output element shows.
  for (std::size_t n = 0; n + 1 < r.arena.size(); n += 2) {
    r.arena[n] = 0xff;
    r.arena[n + 1] = 0x7f;  // NaN as f16/bf16, and as halves of an f32 NaN
  }
  for (Slot* s : {&r.q, &r.k, &r.v, &r.dout}) {
    const TensorRef& t = s->ref;
    if (t.data == nullptr || s->span_bytes == 0) continue;
    if (s->offset_bytes % int64_t(dtype_size(t.dtype)) != 0) continue;  // refused unread
    if (t.rank != rank_of(r, s)) continue;
    for (int64_t n = 0; n < numel(t); ++n)
      store_from_float(t.data, t.dtype, std::size_t(offset_of(t, n)), rng.normal());
  }
  return r;
}

[[noreturn]] void fail(uint64_t seed, int64_t round, const std::string& what) {
  std::fprintf(stderr, "gqattn_fuzz: seed %llu round %lld: %s\n", (unsigned long long)seed,
               (long long)round, what.c_str());
  std::exit(1);
}

std::vector<double> packed(const TensorRef& t) {
  std::vector<double> out(std::size_t(numel(t)));
  for (int64_t n = 0; n < numel(t); ++n)
    out[std::size_t(n)] = load_as_float(t.data, t.dtype, std::size_t(offset_of(t, n)));
  return out;
}

// max |x - ref| / max(1, max |ref|); -inf must match exactly; NaN fails.
double error_of(const TensorRef& t, const std::vector<double>& ref) {
  double worst = 0.0, scale = 1.0;
  for (double r : ref)
    if (std::isfinite(r)) scale = std::max(scale, std::fabs(r));
  for (int64_t n = 0; n < numel(t); ++n) {
    const double x = load_as_float(t.data, t.dtype, std::size_t(offset_of(t, n)));
    const double r = ref[std::size_t(n)];
    // An input overwritten by an earlier call (forward's lse on do's memory)
    // may hold NaN or Inf: the oracle then says NaN too, and so may x.
    if (std::isnan(r)) continue;
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    if (std::isinf(r) || std::isinf(x)) {
      if (x != r) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::fabs(x - r) / scale);
  }
  return worst;
}

// The f32 CPU mirror's gradients on the inputs the backend saw (o and lse
// as forward wrote them, so o rounded to the I/O dtype, as the project's
// tolerance rule asks): what a 16-bit backward's error is measured against.
struct MirrorGradients {
  std::vector<float> dq, dk, dv;
};
MirrorGradients mirror_gradients(const Round& r, const std::vector<double>& Q,
                                 const std::vector<double>& K, const std::vector<double>& V) {
  const Problem& p = r.p;
  auto f32 = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  std::vector<float> q = f32(Q), k = f32(K), v = f32(V), o = f32(packed(r.o.ref)),
                     lse = f32(packed(r.lse.ref)), dout = f32(packed(r.dout.ref));
  MirrorGradients g{std::vector<float>(q.size()), std::vector<float>(k.size()),
                    std::vector<float>(v.size())};
  Options options;
  options.backend = Backend::Cpu;
  if (p.varlen) {
    const int64_t total_q = r.layout.cu_seqlens_q.back(), total_k = r.layout.cu_seqlens_k.back();
    auto rows = [&](std::vector<float>& x, int64_t total, int64_t heads) {
      return contiguous(x.data(), DType::f32, Device::cpu, total, heads, p.d);
    };
    TensorRef lse_ref;  // [H, total_q]
    lse_ref.data = lse.data();
    lse_ref.rank = 2;
    lse_ref.shape[0] = p.H;
    lse_ref.shape[1] = total_q;
    lse_ref.stride[0] = total_q;
    lse_ref.stride[1] = 1;
    backward(p, r.offsets(), rows(q, total_q, p.H), rows(k, total_k, p.Hkv),
             rows(v, total_k, p.Hkv), rows(o, total_q, p.H), lse_ref, rows(dout, total_q, p.H),
             rows(g.dq, total_q, p.H), rows(g.dk, total_k, p.Hkv), rows(g.dv, total_k, p.Hkv),
             options);
    return g;
  }
  auto rows = [&](std::vector<float>& x, int64_t T, int64_t heads) {
    return contiguous(x.data(), DType::f32, Device::cpu, p.B, T, heads, p.d);
  };
  backward(p, rows(q, p.Tq, p.H), rows(k, p.Tk, p.Hkv), rows(v, p.Tk, p.Hkv), rows(o, p.Tq, p.H),
           contiguous(lse.data(), DType::f32, Device::cpu, p.B, p.H, p.Tq), rows(dout, p.Tq, p.H),
           rows(g.dq, p.Tq, p.H), rows(g.dk, p.Tk, p.Hkv), rows(g.dv, p.Tk, p.Hkv), options);
  return g;
}

// error_of for a packed f32 result.
double error_of(const std::vector<float>& x, const std::vector<double>& ref) {
  double worst = 0.0, scale = 1.0;
  for (double r : ref)
    if (std::isfinite(r)) scale = std::max(scale, std::fabs(r));
  for (std::size_t n = 0; n < x.size(); ++n) {
    if (std::isnan(ref[n]) || std::isinf(ref[n])) continue;
    if (!std::isfinite(x[n])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::fabs(double(x[n]) - ref[n]) / scale);
  }
  return worst;
}

// Bytes outside the outputs' elements are as before the call.
bool only_outputs_written(const Round& r, const std::vector<unsigned char>& before,
                          std::initializer_list<const Slot*> outputs) {
  std::vector<bool> mine(r.arena.size(), false);
  for (const Slot* s : outputs) {
    const TensorRef& t = s->ref;
    if (t.data == nullptr) continue;  // forward's absent lse
    const std::size_t size = dtype_size(t.dtype);
    for (int64_t n = 0; n < numel(t); ++n) {
      const std::size_t at = std::size_t(s->offset_bytes + offset_of(t, n) * int64_t(size));
      for (std::size_t b = 0; b < size; ++b) mine[at + b] = true;
    }
  }
  for (std::size_t n = 0; n < r.arena.size(); ++n)
    if (!mine[n] && r.arena[n] != before[n]) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10.0;
  uint64_t seed = 1;
  int64_t rounds = std::numeric_limits<int64_t>::max();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--seconds")
      seconds = std::atof(argv[i + 1]);
    else if (flag == "--seed")
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--rounds")
      rounds = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: gqattn_fuzz [--seconds S] [--seed N] [--rounds R]\n");
      return 2;
    }
  }
  Rng rng{std::mt19937_64(seed)};
  Options options;
  options.backend = Backend::Cpu;
  const auto start = std::chrono::steady_clock::now();
  int64_t round = 0, rejected = 0, accepted = 0, varlen = 0;
  for (; round < rounds; ++round) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
      break;
    options.num_threads = int(rng.range(0, 3));
    Round r = make_round(rng);
    const std::vector<unsigned char> before = r.arena;
    bool threw = false;
    std::string why;  // a rejection's message
    try {
      if (r.p.varlen)
        forward(r.p, r.offsets(), r.q.ref, r.k.ref, r.v.ref, r.o.ref, r.lse.ref, options);
      else
        forward(r.p, r.q.ref, r.k.ref, r.v.ref, r.o.ref, r.lse.ref, options);
    } catch (const Error& e) {
      threw = true;
      why = e.what();
    }
    if (threw) {
      ++rejected;
      if (r.arena != before) fail(seed, round, "forward rejected but wrote (" + r.what + ")");
      if (!r.broken) fail(seed, round, "forward rejected a valid call: " + why);
      continue;
    }
    if (r.offsets_broken) fail(seed, round, "forward accepted broken offsets (" + r.what + ")");
    // An accepted call: only o and lse written, and right.
    if (!only_outputs_written(r, before, {&r.o, &r.lse}))
      fail(seed, round, "forward wrote outside o and lse (" + r.what + ")");
    const double tol = r.dtype == DType::f32 ? 1e-4 : 1.0 / 32.0;
    const auto Q = packed(r.q.ref), K = packed(r.k.ref), V = packed(r.v.ref);
    const oracle::ForwardResult fwd =
        r.p.varlen ? oracle::forward_varlen(r.p, r.layout, Q, K, V) : oracle::forward(r.p, Q, K, V);
    if (error_of(r.o.ref, fwd.o) > tol) fail(seed, round, "o disagrees with the oracle");
    if (r.lse.ref.data != nullptr && error_of(r.lse.ref, fwd.lse) > 1e-4)
      fail(seed, round, "lse disagrees with the oracle");

    const std::vector<unsigned char> mid = r.arena;
    threw = false;
    try {
      if (r.p.varlen)
        backward(r.p, r.offsets(), r.q.ref, r.k.ref, r.v.ref, r.o.ref, r.lse.ref, r.dout.ref,
                 r.dq.ref, r.dk.ref, r.dv.ref, options);
      else
        backward(r.p, r.q.ref, r.k.ref, r.v.ref, r.o.ref, r.lse.ref, r.dout.ref, r.dq.ref, r.dk.ref,
                 r.dv.ref, options);
    } catch (const Error& e) {
      threw = true;
      why = e.what();
    }
    if (threw) {
      ++rejected;
      if (r.arena != mid) fail(seed, round, "backward rejected but wrote (" + r.what + ")");
      if (!r.broken) fail(seed, round, "backward rejected a valid call: " + why);
      continue;
    }
    ++accepted;
    varlen += r.p.varlen ? 1 : 0;
    if (!only_outputs_written(r, mid, {&r.dq, &r.dk, &r.dv}))
      fail(seed, round, "backward wrote outside dq, dk, dv (" + r.what + ")");
    // The oracle's gradients, from the inputs as the backend saw them. f32
    // is held to a fixed bound; 16-bit to the project's rule
    // (check::tolerance): 2 x the f32 mirror's error on the same inputs,
    // with o rounded to the dtype as the backward saw it, plus roundings.
    const oracle::Gradients g =
        r.p.varlen ? oracle::backward_varlen(r.p, r.layout, Q, K, V, packed(r.dout.ref))
                   : oracle::backward(r.p, Q, K, V, packed(r.dout.ref));
    MirrorGradients mirror;
    if (r.dtype != DType::f32) mirror = mirror_gradients(r, Q, K, V);
    const auto bound = [&](const char* name, const std::vector<float>& mirrored,
                           const std::vector<double>& ref) {
      return r.dtype == DType::f32 ? 1e-4
                                   : check::tolerance(r.dtype, name, error_of(mirrored, ref));
    };
    const double dq_tol = bound("dq", mirror.dq, g.dq);
    const double dk_tol = bound("dk", mirror.dk, g.dk);
    const double dv_tol = bound("dv", mirror.dv, g.dv);
    const auto describe = [&](const char* name, double error) {
      return std::string(name) + " disagrees with the oracle: " + std::to_string(error) +
             " dtype " + dtype_name(r.dtype) + " B " + std::to_string(r.p.B) + " Tq " +
             std::to_string(r.p.Tq) + " Tk " + std::to_string(r.p.Tk) + " H " +
             std::to_string(r.p.H) + " Hkv " + std::to_string(r.p.Hkv) + " d " +
             std::to_string(r.p.d) + " softcap " + std::to_string(r.p.softcap) + " window " +
             std::to_string(r.p.window) + " causal " + std::to_string(r.p.causal) + " q_start " +
             (r.p.q_start ? std::to_string(*r.p.q_start) : "unset") + " varlen " +
             std::to_string(r.p.varlen) + " broken " + r.what;
    };
    const double dq_error = error_of(r.dq.ref, g.dq);
    if (dq_error > dq_tol) fail(seed, round, describe("dq", dq_error));
    const double dk_error = error_of(r.dk.ref, g.dk);
    if (dk_error > dk_tol) fail(seed, round, describe("dk", dk_error));
    const double dv_error = error_of(r.dv.ref, g.dv);
    if (dv_error > dv_tol) fail(seed, round, describe("dv", dv_error));
  }
  std::printf(
      "gqattn_fuzz: seed %llu, %lld rounds, %lld calls rejected, %lld fully accepted (%lld "
      "varlen)\n",
      (unsigned long long)seed, (long long)round, (long long)rejected, (long long)accepted,
      (long long)varlen);
  return 0;
}
