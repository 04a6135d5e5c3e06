// merge_attention_states on host tensors: two halves of a problem's keys
// attended separately and merged by lse equal the whole (within f32
// rounding, against the f64 oracle); rows without keys on both sides give
// o = 0, lse = -inf; in place over o_a works; bad arguments are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/cpu_test_util.hpp"
#include "gqattn/error.hpp"

namespace gqattn::test {
namespace {

struct Half {
  std::vector<float> o, lse;
};

// Attention of q over keys [k0, k0 + n) of a [1, Tk, Hkv, d] k, v, with the
// queries at their positions in the whole (q_start = Tk - Tq - k0).
Half attend(const Problem& whole, const std::vector<float>& q, std::vector<float> k,
            std::vector<float> v, int64_t k0, int64_t n) {
  Problem p = whole;
  p.Tk = n;
  p.q_start = whole.Tk - whole.Tq - k0;
  const int64_t row = whole.Hkv * whole.d;
  std::vector<float> ks(k.begin() + k0 * row, k.begin() + (k0 + n) * row);
  std::vector<float> vs(v.begin() + k0 * row, v.begin() + (k0 + n) * row);
  Half h;
  h.o.assign(q.size(), 0.0f);
  h.lse.assign(whole.H * whole.Tq, 0.0f);
  std::vector<float> qc = q;
  forward(p, contiguous(qc.data(), DType::f32, Device::cpu, 1, p.Tq, p.H, p.d),
          contiguous(ks.data(), DType::f32, Device::cpu, 1, n, p.Hkv, p.d),
          contiguous(vs.data(), DType::f32, Device::cpu, 1, n, p.Hkv, p.d),
          contiguous(h.o.data(), DType::f32, Device::cpu, 1, p.Tq, p.H, p.d),
          contiguous(h.lse.data(), DType::f32, Device::cpu, 1, p.H, p.Tq));
  return h;
}

TEST(MergeStates, TwoHalvesOfTheKeysMergeToTheWhole) {
  Problem p = make_problem(1, 6, 20, 4, 2, 16, true, 0, 0.0f);
  const std::vector<float> q = random_input(6 * 4 * 16, 16, 1);
  const std::vector<float> k = random_input(20 * 2 * 16, 16, 2, false);
  const std::vector<float> v = random_input(20 * 2 * 16, 16, 3);
  Half a = attend(p, q, k, v, 0, 15);
  Half b = attend(p, q, k, v, 15, 5);  // causal: early queries keep none of these
  std::vector<float> o(q.size()), lse(a.lse.size());
  merge_attention_states(contiguous(a.o.data(), DType::f32, Device::cpu, 1, 6, 4, 16),
                         contiguous(a.lse.data(), DType::f32, Device::cpu, 1, 4, 6),
                         contiguous(b.o.data(), DType::f32, Device::cpu, 1, 6, 4, 16),
                         contiguous(b.lse.data(), DType::f32, Device::cpu, 1, 4, 6),
                         contiguous(o.data(), DType::f32, Device::cpu, 1, 6, 4, 16),
                         contiguous(lse.data(), DType::f32, Device::cpu, 1, 4, 6));
  std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end());
  const oracle::ForwardResult ref = oracle::forward(p, qd, kd, vd);
  EXPECT_LT(max_rel_error(o, ref.o), 1e-5);
  EXPECT_LT(max_rel_error(lse, ref.lse), 1e-5);

  // In place over o_a, lse_a: the same bits.
  merge_attention_states(contiguous(a.o.data(), DType::f32, Device::cpu, 1, 6, 4, 16),
                         contiguous(a.lse.data(), DType::f32, Device::cpu, 1, 4, 6),
                         contiguous(b.o.data(), DType::f32, Device::cpu, 1, 6, 4, 16),
                         contiguous(b.lse.data(), DType::f32, Device::cpu, 1, 4, 6),
                         contiguous(a.o.data(), DType::f32, Device::cpu, 1, 6, 4, 16),
                         contiguous(a.lse.data(), DType::f32, Device::cpu, 1, 4, 6));
  EXPECT_EQ(a.o, o);
  EXPECT_EQ(a.lse, lse);
}

TEST(MergeStates, RowsWithoutKeysOnBothSides) {
  std::vector<float> oa = {1, 2}, ob = {3, 4}, o(2, NAN);
  std::vector<float> la = {-INFINITY}, lb = {-INFINITY}, l(1, NAN);
  merge_attention_states(contiguous(oa.data(), DType::f32, Device::cpu, 1, 1, 1, 2),
                         contiguous(la.data(), DType::f32, Device::cpu, 1, 1, 1),
                         contiguous(ob.data(), DType::f32, Device::cpu, 1, 1, 1, 2),
                         contiguous(lb.data(), DType::f32, Device::cpu, 1, 1, 1),
                         contiguous(o.data(), DType::f32, Device::cpu, 1, 1, 1, 2),
                         contiguous(l.data(), DType::f32, Device::cpu, 1, 1, 1));
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(o[1], 0.0f);
  EXPECT_EQ(l[0], -INFINITY);
}

TEST(MergeStates, BadArgumentsAreRefused) {
  std::vector<float> oa(8), ob(8), o(8), la(2), lb(2), l(2);
  const TensorRef ta = contiguous(oa.data(), DType::f32, Device::cpu, 1, 2, 1, 4);
  const TensorRef tla = contiguous(la.data(), DType::f32, Device::cpu, 1, 1, 2);
  const TensorRef tb = contiguous(ob.data(), DType::f32, Device::cpu, 1, 2, 1, 4);
  const TensorRef tlb = contiguous(lb.data(), DType::f32, Device::cpu, 1, 1, 2);
  const TensorRef tl = contiguous(l.data(), DType::f32, Device::cpu, 1, 1, 2);
  EXPECT_THROW(merge_attention_states(
                   ta, tla, tb, tlb, contiguous(o.data(), DType::f32, Device::cpu, 1, 1, 2, 4), tl),
               Error);
  EXPECT_THROW(merge_attention_states(ta, tla, tb, tlb, tb, tl), Error);  // o overlaps o_b
}

}  // namespace
}  // namespace gqattn::test
