// The f64 oracle (include/gqattn/oracle.hpp), written from the math of
// docs/semantics.md alone: its own mask predicate, its own softmax, no code
// shared with the mirror or any kernel. Its gradients are checked against
// central finite differences (tests/cpu/test_oracle_gradients.cpp), its
// mask and small cases by hand (test_oracle_basics.cpp).
#include "gqattn/oracle.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu/parallel.hpp"
#include "gqattn/error.hpp"

namespace gqattn::oracle {
namespace {

// Packed offsets: q, o, do, dq [B, Tq, H, d]; k, v, dk, dv [B, Tk, Hkv, d].
struct Layout {
  int64_t B, Tq, Tk, H, Hkv, d;
  int64_t q(int64_t b, int64_t i, int64_t h) const { return ((b * Tq + i) * H + h) * d; }
  int64_t k(int64_t b, int64_t j, int64_t hkv) const { return ((b * Tk + j) * Hkv + hkv) * d; }
  int64_t lse(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * Tq + i; }
  int64_t kv_head(int64_t h) const { return h / (H / Hkv); }
};

void check_size(const char* name, const std::vector<double>& x, int64_t expected) {
  if (static_cast<int64_t>(x.size()) != expected)
    throw Error(std::string(name) + ".size() = " + std::to_string(x.size()),
                "must be " + std::to_string(expected) + " (the packed shape the problem implies)");
}

Layout checked_layout(const Problem& p) {
  if (p.B < 1 || p.Tq < 1 || p.Tk < 1 || p.H < 1 || p.Hkv < 1 || p.d < 1)
    throw Error("problem", "every size (B, Tq, Tk, H, Hkv, d) must be >= 1");
  if (p.H % p.Hkv != 0) throw Error("H", "must be a multiple of Hkv");
  if (p.window < 0) throw Error("window", "must be >= 0 (0 = no window)");
  return Layout{p.B, p.Tq, p.Tk, p.H, p.Hkv, p.d};
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0.0;
  for (int64_t x = 0; x < n; ++x) s += a[x] * b[x];
  return s;
}

// One query row (b, h, i): raw scores scale * q.k, P over the kept keys
// (zero elsewhere) and lse. With no kept key P is all zero and lse = -inf.
struct Row {
  std::vector<double> raw, P;
  double lse = -std::numeric_limits<double>::infinity();
};

Row row(const Problem& p, const Layout& L, const std::vector<double>& q,
        const std::vector<double>& k, int64_t b, int64_t h, int64_t i) {
  const double scale = static_cast<double>(p.effective_scale());
  const double cap = static_cast<double>(p.softcap);
  Row out;
  out.raw.assign(L.Tk, 0.0);
  out.P.assign(L.Tk, 0.0);
  std::vector<double> s(L.Tk, 0.0);
  double m = -std::numeric_limits<double>::infinity();
  bool any = false;
  for (int64_t j = 0; j < L.Tk; ++j) {
    if (!kept(p, i, j)) continue;
    any = true;
    out.raw[j] = scale * dot(&q[L.q(b, i, h)], &k[L.k(b, j, L.kv_head(h))], L.d);
    s[j] = cap > 0.0 ? cap * std::tanh(out.raw[j] / cap) : out.raw[j];
    m = std::max(m, s[j]);
  }
  if (!any) return out;  // no kept key: P = 0, lse = -inf
  double sum = 0.0;
  for (int64_t j = 0; j < L.Tk; ++j)
    if (kept(p, i, j)) sum += std::exp(s[j] - m);
  for (int64_t j = 0; j < L.Tk; ++j)
    if (kept(p, i, j)) out.P[j] = std::exp(s[j] - m) / sum;
  out.lse = m + std::log(sum);
  return out;
}

}  // namespace

bool kept(const Problem& problem, int64_t i, int64_t j) {
  // Query i's position: q_start + i, q_start defaulting to Tk - Tq.
  const int64_t start = problem.q_start ? *problem.q_start : problem.Tk - problem.Tq;
  __extension__ typedef __int128 Wide;  // any window, any q_start: no overflow
  const Wide position = Wide(start) + i;
  if (j < 0 || j >= problem.Tk) return false;
  if (problem.causal && j > position) return false;
  if (problem.window > 0 && j < position - problem.window + 1) return false;
  return true;
}

ForwardResult forward(const Problem& problem, const std::vector<double>& q,
                      const std::vector<double>& k, const std::vector<double>& v) {
  const Layout L = checked_layout(problem);
  check_size("q", q, L.B * L.Tq * L.H * L.d);
  check_size("k", k, L.B * L.Tk * L.Hkv * L.d);
  check_size("v", v, L.B * L.Tk * L.Hkv * L.d);
  ForwardResult out;
  out.o.assign(q.size(), 0.0);
  out.lse.assign(L.B * L.H * L.Tq, 0.0);
  cpu::parallel_for(L.B * L.H, [&](int64_t task) {
    const int64_t b = task / L.H, h = task % L.H;
    for (int64_t i = 0; i < L.Tq; ++i) {
      const Row r = row(problem, L, q, k, b, h, i);
      double* o = &out.o[L.q(b, i, h)];
      for (int64_t j = 0; j < L.Tk; ++j) {
        const double* vj = &v[L.k(b, j, L.kv_head(h))];
        for (int64_t x = 0; x < L.d; ++x) o[x] += r.P[j] * vj[x];
      }
      out.lse[L.lse(b, h, i)] = r.lse;
    }
  });
  return out;
}

Gradients backward(const Problem& problem, const std::vector<double>& q,
                   const std::vector<double>& k, const std::vector<double>& v,
                   const std::vector<double>& dout) {
  const Layout L = checked_layout(problem);
  check_size("do", dout, L.B * L.Tq * L.H * L.d);
  const ForwardResult fwd = forward(problem, q, k, v);
  const double scale = static_cast<double>(problem.effective_scale());
  const double cap = static_cast<double>(problem.softcap);
  const int64_t rep = L.H / L.Hkv;

  // D_i = do_i . o_i with the oracle's own o.
  auto D = [&](int64_t b, int64_t h, int64_t i) {
    return dot(&dout[L.q(b, i, h)], &fwd.o[L.q(b, i, h)], L.d);
  };
  // dS_ij = P_ij (dP_ij - D_i), times the softcap's derivative.
  auto dS = [&](const Row& r, double Di, int64_t b, int64_t h, int64_t i, int64_t j) {
    const double dP = dot(&dout[L.q(b, i, h)], &v[L.k(b, j, L.kv_head(h))], L.d);
    double ds = r.P[j] * (dP - Di);
    if (cap > 0.0) {
      const double t = std::tanh(r.raw[j] / cap);
      ds *= 1.0 - t * t;
    }
    return ds;
  };

  Gradients g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  cpu::parallel_for(L.B * L.H, [&](int64_t task) {
    const int64_t b = task / L.H, h = task % L.H;
    for (int64_t i = 0; i < L.Tq; ++i) {
      const Row r = row(problem, L, q, k, b, h, i);
      const double Di = D(b, h, i);
      double* dq = &g.dq[L.q(b, i, h)];
      for (int64_t j = 0; j < L.Tk; ++j) {
        if (r.P[j] == 0.0) continue;  // masked (or underflowed): no contribution
        const double ds = dS(r, Di, b, h, i, j);
        const double* kj = &k[L.k(b, j, L.kv_head(h))];
        for (int64_t x = 0; x < L.d; ++x) dq[x] += scale * ds * kj[x];
      }
    }
  });
  // dk, dv per kv group: the sums over the group's heads stay in one task.
  cpu::parallel_for(L.B * L.Hkv, [&](int64_t task) {
    const int64_t b = task / L.Hkv, hkv = task % L.Hkv;
    for (int64_t h = hkv * rep; h < (hkv + 1) * rep; ++h) {
      for (int64_t i = 0; i < L.Tq; ++i) {
        const Row r = row(problem, L, q, k, b, h, i);
        const double Di = D(b, h, i);
        const double* qi = &q[L.q(b, i, h)];
        const double* doi = &dout[L.q(b, i, h)];
        for (int64_t j = 0; j < L.Tk; ++j) {
          if (r.P[j] == 0.0) continue;
          const double ds = dS(r, Di, b, h, i, j);
          double* dk = &g.dk[L.k(b, j, hkv)];
          double* dv = &g.dv[L.k(b, j, hkv)];
          for (int64_t x = 0; x < L.d; ++x) {
            dk[x] += scale * ds * qi[x];
            dv[x] += r.P[j] * doi[x];
          }
        }
      }
    }
  });
  return g;
}

}  // namespace gqattn::oracle
