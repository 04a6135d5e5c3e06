// The mirror's backward splits the kv groups (b, hkv) into waves to bound the
// memory of the materialised P. Forcing one group per wave (the path long
// sequences take) must give bitwise the results of a single wave.
#include <limits>
#include <vector>

#include "cpu/cpu_test_util.hpp"
#include "cpu/mirror.hpp"

namespace gqattn::test {
namespace {

TEST(MirrorWaves, OneGroupPerWaveEqualsOneWave) {
  const Problem p = make_problem(3, 7, 9, 4, 2, 5, true, 4, 6.0f);
  const Inputs in = random_inputs(p, 51);
  const Outputs want = run_cpu(in);  // default budget: every group in one wave

  std::vector<float> q = in.q, k = in.k, v = in.v, dout = in.dout, o = want.o, lse = want.lse;
  const float nan = std::numeric_limits<float>::quiet_NaN();  // unwritten shows
  std::vector<float> dq(q.size(), nan), dk(k.size(), nan), dv(v.size(), nan);
  auto ref4 = [](std::vector<float>& x, int64_t T, int64_t heads, const Problem& pr) {
    return contiguous(x.data(), DType::f32, Device::cpu, pr.B, T, heads, pr.d);
  };
  detail::BackwardArgs args;
  args.problem = p;
  args.problem.scale = p.effective_scale();
  args.q = ref4(q, p.Tq, p.H, p);
  args.k = ref4(k, p.Tk, p.Hkv, p);
  args.v = ref4(v, p.Tk, p.Hkv, p);
  args.o = ref4(o, p.Tq, p.H, p);
  args.lse = contiguous(lse.data(), DType::f32, Device::cpu, p.B, p.H, p.Tq);
  args.dout = ref4(dout, p.Tq, p.H, p);
  args.dq = ref4(dq, p.Tq, p.H, p);
  args.dk = ref4(dk, p.Tk, p.Hkv, p);
  args.dv = ref4(dv, p.Tk, p.Hkv, p);
  cpu::mirror_backward(args, /*wave_bytes=*/1);
  EXPECT_TRUE(same_bits(dq, want.dq));
  EXPECT_TRUE(same_bits(dk, want.dk));
  EXPECT_TRUE(same_bits(dv, want.dv));
}

}  // namespace
}  // namespace gqattn::test
